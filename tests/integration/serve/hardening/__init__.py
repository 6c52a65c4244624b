"""Hardening: auth and limits, hostile bodies and hosts, slow clients, fuzzing, load with faults."""

"""Compatibility with the reference product: code and tests written from its public guides
(serving, human in the loop, guardrails, tools) run unchanged against motus."""

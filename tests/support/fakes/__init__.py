"""Scripted model providers on loopback: real HTTP servers speaking the providers' protocols."""

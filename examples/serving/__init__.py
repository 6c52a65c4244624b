"""Agents to serve with ``motus serve start examples.serving.<module>:agent``."""

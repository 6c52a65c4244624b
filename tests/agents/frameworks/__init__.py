"""Agents of the framework adapters' tests, written with each framework's own API and served by
``motus serve`` as ``tests.agents.frameworks.<module>:NAME``."""

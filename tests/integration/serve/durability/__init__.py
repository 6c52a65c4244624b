"""Durable turns: the store, parking, replay, restarts and crashes, on SQLite."""

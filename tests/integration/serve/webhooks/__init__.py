"""Webhooks against a real server: URL policy, redirects, slow and huge endpoints, private addresses."""

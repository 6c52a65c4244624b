"""Kept for ``gunicorn wsgi:app`` from a checkout; the entry point is ``motus.serve.wsgi``."""

from motus.serve.wsgi import app as app

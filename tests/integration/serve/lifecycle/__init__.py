"""Starting and stopping the server: agent shapes, capacity, TTL, shutdown, the gunicorn worker, the Flask CLI and WSGI."""

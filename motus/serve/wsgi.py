"""WSGI entry point: the server built from ``MOTUS_*`` environment variables, for gunicorn::

    MOTUS_AGENT=examples.serving.hitl_agent:agent MOTUS_THREADS=64 \\
        gunicorn -w 1 -k motus.serve.gunicorn.MotusWorker --threads 64 'motus.serve.wsgi:app'

Every server setting (``motus.serve.config.SETTINGS``; the README's table of options) is read
from its variable, with the same default and the same checks as ``motus serve start``:
``MOTUS_AGENT`` (required), ``MOTUS_WORKERS``, ``MOTUS_STORE``, ``MOTUS_API_KEY``,
``MOTUS_PARK_AFTER`` (seconds or ``never``), ``MOTUS_UI`` (1/0), and so on. gunicorn binds
and runs the threads: give ``MOTUS_HOST`` the address it binds (for the Host and webhook
checks) and ``MOTUS_THREADS`` its ``--threads``, from which long polls and event streams
are capped as under the CLI. The worker class ``motus.serve.gunicorn.MotusWorker`` (``motus.serve.gunicorn_app.MotusWorker``, its old path, still works) keeps
slow clients off the request threads and reads ``MOTUS_READ_TIMEOUT``.

Importing this module builds the server and starts nothing: the pool starts with the first
request, in the process that serves it. Sessions live in one process, so a second gunicorn
worker is refused at boot with an explanation. A missing agent or a value that does not
parse stops the import with one line naming the variable.
"""

from __future__ import annotations

import os
import sys

from motus.serve.config import agent_from_env, server_from_env

agent_from_env(os.environ)  # before anything else, as the one thing that must be set
if "gunicorn" in sys.modules:
    from motus.serve.gunicorn import claim_single_worker

    claim_single_worker()

server = server_from_env()
app = server.app

"""The dispatch agent in a server that may open few files: importing this module (the arbiter
does, before it forks the gunicorn worker) lowers the process's open-file limit, hard and soft,
to ``LIMIT`` (``motus serve start`` raises only the soft one, up to the hard one)."""

from __future__ import annotations

import resource

from tests.agents import dispatch  # noqa: F401 - the agent served

LIMIT = 256

_soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if _hard == resource.RLIM_INFINITY or _hard > LIMIT:
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(_soft, LIMIT), LIMIT))

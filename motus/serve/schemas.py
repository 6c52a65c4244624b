"""The REST contract's pydantic models, under the server's old import path.

They live in :mod:`motus.api.schemas`, the HTTP API's shared vocabulary that the client
imports too; the server's modules import them from here. Every name of its ``__all__`` is
re-exported.
"""

from __future__ import annotations

from motus.api.schemas import *  # noqa: F403 - this module is the re-export
from motus.api.schemas import __all__ as __all__

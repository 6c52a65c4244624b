"""Every domain error the server raises, with the HTTP status and the ``detail`` a client sees.

The app registers one handler for ``ServeError``; views and the turn machinery raise these
and never build error responses themselves.
"""

from __future__ import annotations


class ServeError(Exception):
    """A domain error with the HTTP status and the ``detail`` a client should see."""

    status_code = 400

    def __init__(self, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        self.headers = headers or {}


class BadRequest(ServeError):
    status_code = 400


class Unauthorized(ServeError):
    status_code = 401

    def __init__(self, detail: str) -> None:
        super().__init__(detail, headers={"WWW-Authenticate": 'Bearer realm="motus"'})


class HostNotAllowed(ServeError):
    """A ``Host`` name a loopback-bound server does not answer to (DNS rebinding)."""

    status_code = 400


class OriginNotAllowed(ServeError):
    """A cross-site request: its ``Origin`` is not this server's."""

    status_code = 403


class UnsupportedMediaType(ServeError):
    """A body not declared ``application/json``."""

    status_code = 415


class SessionNotFound(ServeError):
    status_code = 404

    def __init__(self, session_id: str) -> None:
        super().__init__(f"Session {session_id} not found")


class InterruptNotPending(ServeError):
    status_code = 404


class NotAnApprover(ServeError):
    """A resume from a key the interrupt's approver policy leaves out (``motus.api.approvers``)."""

    status_code = 403


class GrantNotFound(ServeError):
    status_code = 404


class ReadOnlyKey(ServeError):
    """A key with the ``read`` scope tried to change something."""

    status_code = 403


class TooManyStreams(ServeError):
    """Every event stream slot (``--max-streams``) is taken."""

    status_code = 503


class TooManyWaiters(ServeError):
    """Every long-poll slot is taken (the request threads left once event streams and the
    reserve have theirs): answered at once with ``Retry-After``, never a 200 that would
    invite the client to poll again straight away."""

    status_code = 503


class CustomIdsDisabled(ServeError):
    status_code = 405


class SessionConflict(ServeError):
    status_code = 409


class Unprocessable(ServeError):
    status_code = 422


class ServerUnavailable(ServeError):
    """503: the server cannot take this now (session limit, shutting down, store failing)."""

    status_code = 503


#: What a 503 for a passing condition asks a client to wait before it tries again (seconds).
TRY_AGAIN_SECONDS = 1


class TryAgain(ServerUnavailable):
    """503 for a condition that passes by itself (the store away or locked, a session that
    kept changing on other instances or moving in and out of memory while this request
    waited for it): with ``Retry-After``, so a client waits and asks again (``motus.client``'s
    long polls, the web chat) rather than giving up or asking again at once."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail, headers={"Retry-After": str(TRY_AGAIN_SECONDS)})


class SessionLimitReached(ServerUnavailable):
    pass


class StoreCannotTake(ServerUnavailable):
    """The store refused a write for what it holds (text that is not UTF-8, an integer past
    64 bits), not for being away: unlike other store failures, retrying cannot help."""


class InvalidTransition(RuntimeError):
    """A turn was asked to make a transition its state does not allow: a bug, never input."""

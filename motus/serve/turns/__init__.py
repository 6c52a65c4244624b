"""Turns: the one state machine of a turn, and the sessions that own them.

A package of one concern a module (see ``motus.serve.turns.sessions`` for the map):
``state`` (turns, sessions, what they show), ``machine`` (the transitions and worker
messages), ``queries`` (reads), ``timers`` (deadlines, expiries, parking, the housekeeper),
``slots`` (compute slots), ``replicas`` (other instances on a shared store). The names other
modules import are re-exported here, so ``from motus.serve.turns import Turns`` keeps working.
"""

from __future__ import annotations

from motus.serve.turns.machine import STALE_RETRIES, Answered
from motus.serve.turns.sessions import Turns
from motus.serve.turns.state import (
    _MOVES,
    _PUBLIC,
    ALREADY_RESUMED,
    ANONYMOUS,
    BY_TIMEOUT,
    CANCELLED,
    EXITED,
    EXPIRED,
    MESSAGE_FAILED,
    NOT_WAITING,
    OUTCOME_FAILED,
    RETIRED_INTERRUPTS_KEPT,
    TIMED_OUT,
    PendingInterrupt,
    Session,
    SessionStatus,
    SessionView,
    Turn,
    TurnEnd,
    TurnState,
    interrupt_data,
    pending_interrupt,
    remembered_tool,
    storable_text,
)
from motus.serve.turns.timers import MAX_TIMER_WAIT, PARK_SETTLE_SECONDS, STORE_GIVE_UP_SECONDS, STORE_RETRY_SECONDS

__all__ = [
    "ALREADY_RESUMED",
    "Answered",
    "ANONYMOUS",
    "BY_TIMEOUT",
    "CANCELLED",
    "EXITED",
    "EXPIRED",
    "MAX_TIMER_WAIT",
    "MESSAGE_FAILED",
    "NOT_WAITING",
    "OUTCOME_FAILED",
    "PARK_SETTLE_SECONDS",
    "RETIRED_INTERRUPTS_KEPT",
    "STALE_RETRIES",
    "STORE_GIVE_UP_SECONDS",
    "STORE_RETRY_SECONDS",
    "TIMED_OUT",
    "PendingInterrupt",
    "Session",
    "SessionStatus",
    "SessionView",
    "Turn",
    "TurnEnd",
    "TurnState",
    "Turns",
    "_MOVES",
    "_PUBLIC",
    "interrupt_data",
    "pending_interrupt",
    "remembered_tool",
    "storable_text",
]

"""Reading a server's event stream (``GET /events``, ``GET /sessions/{id}/events``).

``read_events`` parses ``text/event-stream`` (the WHATWG rules this server's streams use:
``id:``, ``event:``, one ``data:`` line of JSON, a blank line ends an event, ``:`` starts a
comment). ``Client.events`` wraps it in a loop that reconnects after a dropped connection
with ``Last-Event-ID``, so the caller sees every event exactly once, in order, also across a
server restart when the server keeps its sessions in a durable store.

Guarantees: an event is yielded only once it is complete (its blank line arrived), and the
id to resume from advances only past events that were yielded.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Event:
    """One change: ``kind`` is ``status``, ``interrupt``, ``resolved``, ``approval``,
    ``message``, ``error``, ``grant``, ``revoke``, ``title`` (or ``ready``/``reset`` from the
    stream itself);
    ``data`` always has ``session_id`` (None for ``ready`` on the all-sessions stream)."""

    id: int | None
    kind: str
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def session_id(self) -> str | None:
        value = self.data.get("session_id")
        return value if isinstance(value, str) else None


def read_events(lines: Iterable[str]) -> Iterator[Event]:
    """Events from the lines of a stream (without their line endings)."""
    event_id: int | None = None
    kind = "message"
    data: list[str] = []
    for line in lines:
        if line == "":
            if data:
                text = "\n".join(data)
                try:
                    parsed = json.loads(text)
                except ValueError:
                    parsed = {"text": text}
                yield Event(event_id, kind, parsed if isinstance(parsed, dict) else {"value": parsed})
            event_id, kind, data = None, "message", []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "id" and value.isdigit():
            event_id = int(value)
        elif name == "event":
            kind = value
        elif name == "data":
            data.append(value)

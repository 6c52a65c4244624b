"""An Anthropic SDK tool runner served by motus: deleting a note needs a person's OK.

Serve it and chat with it::

    pip install 'motus[anthropic]'
    motus serve start examples.anthropic.notes_agent:agent --port 8000
    motus serve chat http://localhost:8000 "delete groceries"

``agent`` is a :class:`motus.anthropic.ToolRunner`, built like the SDK's
``client.beta.messages.tool_runner(...)``: a client, a model, ``max_tokens``, a system prompt and
``@beta_tool`` functions. ``delete_note`` is marked ``@requires_approval``, so each call pauses
the turn with a ``tool_approval`` interrupt that the chat, the web chat, the inbox or the API
answers; a rejection reaches the model as an ``is_error`` tool result ("User rejected
delete_note: <reason>").

With ``ANTHROPIC_API_KEY`` set, a real model drives it (``MOTUS_EXAMPLE_MODEL``, default
``claude-sonnet-4-5``). Without a key (or with ``MOTUS_EXAMPLE_OFFLINE=1``) the client gets an
offline *scripted model* instead of the network: an in-process HTTP transport (the SDK's
``http_client=``) answering the Messages API by keywords: "list" -> ``list_notes``; "delete X"
or "delete X and Y" -> ``delete_note`` (one approval per note, asked at once); after tool
results it quotes them.

Notes are files in ``$MOTUS_EXAMPLE_DIR`` (default ``<tmp>/motus-notes-example-<uid>``),
created with a few samples the first time.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import anthropic
import httpx2
from anthropic import beta_tool

from examples.offline import real_model
from motus.anthropic import ToolRunner, requires_approval

SAMPLES = {"groceries": "eggs, milk, bread\n", "ideas": "a motus plugin for the garden\n", "todo": "call the bank\n"}


def notes_dir() -> Path:
    root = Path(os.environ.get("MOTUS_EXAMPLE_DIR") or Path(tempfile.gettempdir()) / f"motus-notes-example-{os.getuid()}")
    if not root.exists():
        root.mkdir(mode=0o700, parents=True)
        for name, text in SAMPLES.items():
            (root / f"{name}.txt").write_text(text)
    return root


def _note(name: str) -> Path:
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
        raise ValueError(f"{name!r} is not a note name (letters, digits, '-' and '_')")
    return notes_dir() / f"{name}.txt"


@beta_tool
def list_notes() -> str:
    """List the notes."""
    return ", ".join(sorted(path.stem for path in notes_dir().glob("*.txt"))) or "(no notes)"


@requires_approval
@beta_tool
def delete_note(name: str) -> str:
    """Delete a note by name.

    Args:
        name: the note's name, without ".txt".
    """
    path = _note(name)
    if not path.exists():
        return f"No note called {name}"
    path.unlink()
    return f"Deleted {name}"


# -- the offline scripted model -----------------------------------------------------------


def _reply(content: list[dict[str, Any]]) -> dict[str, Any]:
    stop = "tool_use" if any(block["type"] == "tool_use" for block in content) else "end_turn"
    return {
        "id": "msg_scripted", "type": "message", "role": "assistant", "model": "scripted",
        "content": content, "stop_reason": stop, "usage": {"input_tokens": 0, "output_tokens": 0},
    }


def scripted(request: httpx2.Request) -> httpx2.Response:
    """A deterministic offline stand-in for the Messages API (see the module doc)."""
    messages = json.loads(request.content)["messages"]
    last = messages[-1]
    blocks = last["content"] if isinstance(last["content"], list) else [{"type": "text", "text": last["content"]}]
    results = [block for block in blocks if block.get("type") == "tool_result"]
    if results:
        names = {block["id"]: block["name"] for m in messages if m["role"] == "assistant" and isinstance(m["content"], list)
                 for block in m["content"] if block.get("type") == "tool_use"}
        text = "; ".join(f"{names.get(r['tool_use_id'], 'tool')}: {r['content']}" for r in results)
        return httpx2.Response(200, json=_reply([{"type": "text", "text": text}]))
    text = " ".join(block.get("text", "") for block in blocks if block.get("type") == "text")
    count = len(messages)
    match = re.search(r"\b(?:delete|remove)\s+(.+)", text, re.IGNORECASE)
    if match:
        targets = [t.strip(" .") for t in re.split(r",|\band\b", match.group(1)) if t.strip(" .")]
        calls = [{"type": "tool_use", "id": f"toolu_{count}_{n}", "name": "delete_note", "input": {"name": t}} for n, t in enumerate(targets)]
        return httpx2.Response(200, json=_reply(calls))
    if re.search(r"\b(list|notes|ls)\b", text, re.IGNORECASE):
        return httpx2.Response(200, json=_reply([{"type": "tool_use", "id": f"toolu_{count}_0", "name": "list_notes", "input": {}}]))
    return httpx2.Response(200, json=_reply([{"type": "text", "text": "I can list your notes ('list') and delete them ('delete groceries', 'delete todo and ideas')."}]))


MODEL = real_model("anthropic notes example", "ANTHROPIC_API_KEY", "claude-sonnet-4-5", "delete groceries and todo")


def _client() -> anthropic.AsyncAnthropic:
    if MODEL is not None:
        return anthropic.AsyncAnthropic()
    offline = httpx2.AsyncClient(transport=httpx2.MockTransport(scripted))
    return anthropic.AsyncAnthropic(api_key="offline", base_url="http://scripted.invalid", http_client=offline)


agent = ToolRunner(
    client=_client(),
    model=MODEL or "claude-sonnet-4-5",
    max_tokens=1024,
    system="You look after the user's notes. Use the tools; deleting needs the user's approval.",
    tools=[list_notes, delete_note],
)

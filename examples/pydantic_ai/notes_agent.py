"""A Pydantic AI agent served by motus as it is: deleting a note needs a person's OK.

Serve it and chat with it::

    pip install 'motus[pydantic-ai]'
    motus serve start examples.pydantic_ai.notes_agent:agent --port 8000
    motus serve chat http://localhost:8000 "delete groceries"

``agent`` is a plain ``pydantic_ai.Agent`` with ``output_type=[str, DeferredToolRequests]``;
``motus serve`` detects it. ``delete_note`` is declared ``requires_approval=True``, so each
call pauses the turn with a ``tool_approval`` interrupt; a rejection reaches the model as the
tool's result ("User rejected delete_note: <reason>").

With ``OPENAI_API_KEY`` set, a real model drives it (``MOTUS_EXAMPLE_MODEL``, default
``openai:gpt-4.1-mini``). Without a key (or with ``MOTUS_EXAMPLE_OFFLINE=1``) an offline
*scripted model* (Pydantic AI's own ``FunctionModel``) takes its place and picks tools by
keywords: "list" -> ``list_notes``; "delete X" or "delete X and Y" -> ``delete_note`` (one
approval per note, asked at once); after tool results it quotes them.

Notes are files in ``$MOTUS_EXAMPLE_DIR`` (default ``<tmp>/motus-notes-example-<uid>``),
created with a few samples the first time.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart, UserPromptPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from examples.offline import real_model

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


def scripted(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """A deterministic offline stand-in for a model (see the module doc)."""
    last = messages[-1]
    results = [part for part in getattr(last, "parts", []) if isinstance(part, ToolReturnPart)]
    if results:
        return ModelResponse(parts=[TextPart("; ".join(f"{r.tool_name}: {r.model_response_str()}" for r in results))])
    prompts = [p for m in messages if isinstance(m, ModelRequest) for p in m.parts if isinstance(p, UserPromptPart)]
    text = str(prompts[-1].content) if prompts else ""
    match = re.search(r"\b(?:delete|remove)\s+(.+)", text, re.IGNORECASE)
    count = len(messages)
    if match:
        targets = [t.strip(" .") for t in re.split(r",|\band\b", match.group(1)) if t.strip(" .")]
        return ModelResponse(parts=[ToolCallPart("delete_note", {"name": t}, tool_call_id=f"call_{count}_{n}") for n, t in enumerate(targets)])
    if re.search(r"\b(list|notes|ls)\b", text, re.IGNORECASE):
        return ModelResponse(parts=[ToolCallPart("list_notes", {}, tool_call_id=f"call_{count}_0")])
    return ModelResponse(parts=[TextPart("I can list your notes ('list') and delete them ('delete groceries', 'delete todo and ideas').")])


def _model() -> Any:
    return real_model("pydantic-ai notes example", "OPENAI_API_KEY", "openai:gpt-4.1-mini", "delete groceries and todo") or FunctionModel(scripted)


agent = Agent(
    _model(),
    name="notes",
    instructions="You look after the user's notes. Use the tools; deleting needs the user's approval.",
    output_type=[str, DeferredToolRequests],
)


@agent.tool_plain
def list_notes() -> str:
    """List the notes."""
    return ", ".join(sorted(path.stem for path in notes_dir().glob("*.txt"))) or "(no notes)"


@agent.tool_plain(requires_approval=True)
def delete_note(name: str) -> str:
    """Delete a note by name."""
    path = _note(name)
    if not path.exists():
        return f"No note called {name}"
    path.unlink()
    return f"Deleted {name}"

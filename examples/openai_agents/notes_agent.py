"""An OpenAI Agents SDK agent served by motus as it is: deleting a note needs a person's OK.

Serve it and chat with it::

    pip install 'motus[openai-agents]'
    motus serve start examples.openai_agents.notes_agent:agent --port 8000
    motus serve chat http://localhost:8000 "delete groceries"

``agent`` is a plain ``agents.Agent``; ``motus serve`` detects it. ``delete_note`` is declared
``@function_tool(needs_approval=True)``, so each call pauses the turn with a ``tool_approval``
interrupt that the chat, the web chat, the inbox or the API answers.

With ``OPENAI_API_KEY`` set, a real model drives it (``MOTUS_EXAMPLE_MODEL``, default
``gpt-4.1-mini``). Without a key (or with ``MOTUS_EXAMPLE_OFFLINE=1``) a small offline
*scripted model* (a custom ``agents.Model``) takes its place; it picks tools by keywords:
"list" -> ``list_notes``; "delete X" or "delete X and Y" -> ``delete_note`` (one approval
per note, asked at once); after tool results it quotes them.

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

from agents import Agent, Model, ModelResponse, Usage, function_tool
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

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


@function_tool
def list_notes() -> str:
    """List the notes."""
    return ", ".join(sorted(path.stem for path in notes_dir().glob("*.txt"))) or "(no notes)"


@function_tool(needs_approval=True)
def delete_note(name: str) -> str:
    """Delete a note by name."""
    path = _note(name)
    if not path.exists():
        return f"No note called {name}"
    path.unlink()
    return f"Deleted {name}"


class ScriptedModel(Model):
    """A deterministic offline stand-in for a model (see the module doc)."""

    async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> ModelResponse:
        items = [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        last_user = max((i for i, item in enumerate(items) if item.get("role") == "user"), default=-1)
        results = [item for item in items[last_user + 1 :] if item.get("type") == "function_call_output"]
        if results:
            names = {item.get("call_id"): item.get("name") for item in items if item.get("type") == "function_call"}
            return self._text("; ".join(f"{names.get(r['call_id'], 'tool')}: {r['output']}" for r in results))
        text = str(items[last_user].get("content") or "") if last_user >= 0 else ""
        match = re.search(r"\b(?:delete|remove)\s+(.+)", text, re.IGNORECASE)
        if match:
            targets = [t.strip(" .") for t in re.split(r",|\band\b", match.group(1)) if t.strip(" .")]
            calls = [("delete_note", {"name": target}) for target in targets]
            return self._calls(calls)
        if re.search(r"\b(list|notes|ls)\b", text, re.IGNORECASE):
            return self._calls([("list_notes", {})])
        return self._text("I can list your notes ('list') and delete them ('delete groceries', 'delete todo and ideas').")

    async def stream_response(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - not used by motus
        raise NotImplementedError("the scripted model does not stream")

    def _calls(self, calls: list[tuple[str, dict[str, Any]]]) -> ModelResponse:
        self._count = getattr(self, "_count", 0) + 1
        output = [
            ResponseFunctionToolCall(type="function_call", call_id=f"call_{self._count}_{n}", name=name, arguments=json.dumps(args))
            for n, (name, args) in enumerate(calls)
        ]
        return ModelResponse(output=output, usage=Usage(), response_id=None)

    def _text(self, text: str) -> ModelResponse:
        message = ResponseOutputMessage(
            id="msg_scripted", type="message", role="assistant", status="completed",
            content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=None)


def _model() -> Any:
    return real_model("openai-agents notes example", "OPENAI_API_KEY", "gpt-4.1-mini", "delete groceries and todo") or ScriptedModel()


agent = Agent(
    name="notes",
    instructions="You look after the user's notes. Use the tools; deleting needs the user's approval.",
    tools=[list_notes, delete_note],
    model=_model(),
)

"""A file-management agent that pauses for a person: the spec's human-in-the-loop example.

Serve it and chat with it::

    motus serve start examples.serving.hitl_agent:agent --port 8000
    motus serve chat http://localhost:8000

Tools: ``list_files`` and ``read_file`` run freely; ``delete_file`` and ``move_file``
are gated (``@tool(requires_approval=True)``: each call pauses with a
``tool_approval`` interrupt); ``ask_user_question`` asks structured questions
(a ``user_input`` interrupt).

With ``OPENROUTER_API_KEY`` set, a real model drives it (``MOTUS_EXAMPLE_MODEL``,
default ``anthropic/claude-sonnet-4``). Without a key (or with ``MOTUS_EXAMPLE_OFFLINE=1``)
a small deterministic, offline *scripted model* takes its place, and the server's log says
so at start-up. It goes through the very same ``ReActAgent``, tools, approval gates and
interrupts; it only picks the tool calls by keywords in your message:

* "delete ..." / "remove ..."          -> ``delete_file`` (approval), e.g. *delete the old logs file*
* "move X to Y" / "archive ..."        -> ``move_file`` (approval)
* "both", or "delete" and "move"       -> ``delete_file`` and ``move_file`` in one step:
  two concurrent approval interrupts
* "organize" / "clean up" / "tidy" / "sort" -> ``ask_user_question`` (one single-select
  question; one option carries ``markdown``), e.g. *help me organize my downloads*
* "read X" / "open X" / "show me X"    -> ``read_file``
* "list" / "files" / "ls"              -> ``list_files``
* anything else                       -> a plain reply that lists these words

After tool results it answers with a summary quoting each tool's result text, e.g.
``delete_file: Deleted old_logs.txt`` or ``delete_file: {"error": "User rejected delete_file"}``.

Parameters: a message's ``user_params`` (``motus serve chat URL MESSAGE --param
dry_run=true``) reach the agent as ``message.user_params``. With ``dry_run`` true, the
gated tools still ask for approval and check their arguments, then change nothing and say
so: ``Dry run: would delete old_logs.txt (nothing was changed)``.

Every file operation stays inside a sandbox directory: ``$MOTUS_EXAMPLE_DIR``, default
``<tmp>/motus-hitl-example-<uid>`` (private: mode 0700, refused if someone else made it).
When that directory does not exist it is created with a few sample files (``old_logs.txt``,
``notes.txt``, ``downloads/...``); a path that resolves outside it (``..``, an absolute path
elsewhere, a symlink out) is refused, and files are read, deleted and moved through checked
directory descriptors without following symlinks, so a link swapped in between the check
and the use cannot lead out either.
"""

from __future__ import annotations

import contextvars
import json
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Any

from examples.offline import real_model
from motus.agent import ReActAgent
from motus.models.base import ChatCompletion
from motus.models.messages import ChatMessage, FunctionCall, ToolCall
from motus.tools import tool
from motus.tools.builtins.ask_user import ask_user_question


#: True for a turn whose message asked for ``user_params["dry_run"]``: the file tools that
#: change something check their arguments and then change nothing. A context variable, so
#: it follows the turn into the threads its tools run in.
DRY_RUN: contextvars.ContextVar[bool] = contextvars.ContextVar("motus_example_dry_run", default=False)

SAMPLE_FILES = {
    "old_logs.txt": "2023-01-01 12:00:00 INFO server started\n2023-01-01 12:00:05 WARN disk almost full\n",
    "notes.txt": "Remember: back up the photos before cleaning the downloads folder.\n",
    "downloads/holiday_photo.jpg": "(pretend this is a JPEG)\n",
    "downloads/invoice_2024.pdf": "(pretend this is a PDF)\n",
    "downloads/installer.dmg": "(pretend this is a disk image)\n",
}


def sandbox() -> Path:
    """The directory every tool works in; created (mode 0700) with sample files when missing.

    The default is private to this user: ``<tmp>/motus-hitl-example-<uid>``. A default
    directory that is not a real directory owned by this user and closed to others (someone
    else created it first, or swapped it for a symlink) is refused rather than used.
    """
    configured = os.environ.get("MOTUS_EXAMPLE_DIR")
    root = Path(configured or Path(tempfile.gettempdir()) / f"motus-hitl-example-{os.getuid()}")
    try:
        root.mkdir(mode=0o700, parents=bool(configured))
        created = True
    except FileExistsError:
        created = False
    if not configured:
        info = os.lstat(root)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise PermissionError(
                f"{root} is not a private directory of this user (it must be a real directory, owned by "
                f"uid {os.getuid()}, mode 0700); remove it or set MOTUS_EXAMPLE_DIR"
            )
    if created:
        for name, text in SAMPLE_FILES.items():
            target = root / name
            target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            target.write_text(text)
    return root.resolve()


def _inside(path: str) -> Path:
    """Resolve ``path`` inside the sandbox, or raise ``ValueError``."""
    root = sandbox()
    candidate = (root / path).resolve()
    if candidate != root and root not in candidate.parents:
        raise ValueError(f"{path!r} is outside the sandbox; use paths relative to {root}")
    return candidate


def _checked_fd(fd: int, what: str) -> int:
    """Keep ``fd`` only if what it really opened is inside the sandbox (Linux: /proc)."""
    try:
        real = Path(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        return fd  # no /proc: the checks of _inside stand alone
    root = sandbox()
    if real != root and root not in real.parents:
        os.close(fd)
        raise ValueError(f"{what!r} changed to lead outside the sandbox while it was being used")
    return fd


def _open_parent(path: str) -> tuple[int, str]:
    """An fd of the (checked) directory holding ``path``, and the name inside it: operations
    through it cannot be redirected by a symlink swapped in after the check."""
    target = _inside(path)
    fd = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    return _checked_fd(fd, path), target.name


def _read_text(path: str) -> str:
    parent, name = _open_parent(path)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=parent)
    finally:
        os.close(parent)
    with os.fdopen(fd, errors="replace") as file:
        return file.read(4000)


def _relative(path: Path) -> str:
    return path.relative_to(sandbox()).as_posix() or "."


@tool
def list_files(directory: str = ".") -> str:
    """List the files in a directory of the sandbox (recursively).

    Args:
        directory: a directory relative to the sandbox; "." for all of it.
    """
    base = _inside(directory)
    if not base.is_dir():
        raise ValueError(f"{directory!r} is not a directory")
    names = sorted(_relative(p) for p in base.rglob("*") if p.is_file())
    return "\n".join(names) if names else "(no files)"


@tool
def read_file(path: str) -> str:
    """Read a text file from the sandbox (first 4000 characters).

    Args:
        path: the file, relative to the sandbox.
    """
    return _read_text(path)


@tool(requires_approval=True)
def delete_file(path: str) -> str:
    """Delete a file at the given path (relative to the sandbox).

    Args:
        path: the file to delete.
    """
    target = _inside(path)
    if not target.is_file():
        raise FileNotFoundError(f"no file {path!r}")
    if DRY_RUN.get():
        return f"Dry run: would delete {_relative(target)} (nothing was changed)"
    parent, name = _open_parent(path)
    try:
        os.unlink(name, dir_fd=parent)  # removes a name; never follows a link
    finally:
        os.close(parent)
    return f"Deleted {_relative(target)}"


@tool(requires_approval=True)
def move_file(source: str, destination: str) -> str:
    """Move or rename a file inside the sandbox. Parent folders are created as needed.

    Args:
        source: the file to move.
        destination: where it goes; a folder (existing, or ending in "/") keeps the file's name.
    """
    origin, target = _inside(source), _inside(destination)
    if not origin.is_file():
        raise FileNotFoundError(f"no file {source!r}")
    if target.is_dir() or destination.endswith("/"):
        target = target / origin.name
    if target.exists():
        raise FileExistsError(f"{_relative(target)} already exists")
    if DRY_RUN.get():
        return f"Dry run: would move {_relative(origin)} to {_relative(target)} (nothing was changed)"
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    source_dir, source_name = _open_parent(source)
    try:
        target_dir, target_name = _open_parent(_relative(target))
        try:
            os.rename(source_name, target_name, src_dir_fd=source_dir, dst_dir_fd=target_dir)
        finally:
            os.close(target_dir)
    finally:
        os.close(source_dir)
    return f"Moved {_relative(origin)} to {_relative(target)}"


TOOLS = [list_files, read_file, delete_file, move_file, ask_user_question]

SYSTEM_PROMPT = (
    "You manage files in a sandbox folder. Paths are relative to it. Use list_files and "
    "read_file freely. delete_file and move_file ask the user for approval; if they reject, "
    "do not retry the same call, ask what they want instead. When a request is vague (for "
    "example 'organize my downloads'), call ask_user_question with clear options before acting."
)

ORGANIZE_QUESTION = {
    "question": "How would you like to organize the files?",
    "header": "Strategy",
    "multiSelect": False,
    "options": [
        {"label": "By date", "description": "Group files by year and month"},
        {"label": "By type", "description": "Group files by extension", "markdown": "downloads/\n  jpg/holiday_photo.jpg\n  pdf/invoice_2024.pdf\n  dmg/installer.dmg"},
        {"label": "By size", "description": "Move large files into a separate folder"},
    ],
}

_FILE_TOKEN = re.compile(r"[\w./-]*\w\.\w+")
_MOVE = re.compile(r"\bmove\s+(?:the\s+)?(?P<source>[\w./-]+)\s+(?:to|into)\s+(?P<destination>[\w./-]+)", re.IGNORECASE)


class ScriptedFileModel:
    """An offline stand-in for a model: picks tool calls by keywords (see the module docstring).

    It implements the same client interface as the real clients
    (``chat(model=, messages=, tools=) -> ChatCompletion``), so the agent, the tools and
    the interrupts it exercises are exactly those a real model would drive.
    """

    def chat(self, *, model: str, messages: list[ChatMessage], tools: list[dict[str, Any]] | None = None, **options: Any) -> ChatCompletion:
        last = messages[-1]
        if last.role == "tool":
            return ChatCompletion(message=ChatMessage.assistant_message(self._summarize(messages)), model=model)
        step = sum(1 for m in messages if m.role == "assistant") + 1
        calls = self._plan((last.content or "").strip())
        if not calls:
            return ChatCompletion(message=ChatMessage.assistant_message(self._help()), model=model)
        tool_calls = [
            ToolCall(id=f"call_{step}_{index}", function=FunctionCall(name=name, arguments=json.dumps(arguments)))
            for index, (name, arguments) in enumerate(calls)
        ]
        # What a real model says before it acts: an approver sees it beside the approval.
        return ChatCompletion(message=ChatMessage.assistant_message(self._intent(calls), tool_calls=tool_calls), model=model)

    @staticmethod
    def _intent(calls: list[tuple[str, dict[str, Any]]]) -> str:
        said = {
            "delete_file": lambda a: f"delete {a.get('path')}",
            "move_file": lambda a: f"move {a.get('source')} to {a.get('destination')}",
            "read_file": lambda a: f"read {a.get('path')}",
            "list_files": lambda a: "list the files",
            "ask_user_question": lambda a: "ask you how to organize them",
        }
        parts = [said[name](arguments) if name in said else f"call {name}" for name, arguments in calls]
        return "I'll " + " and ".join(parts) + "."

    def _plan(self, text: str) -> list[tuple[str, dict[str, Any]]]:
        lowered = text.lower()
        words = set(re.findall(r"[a-z]+", lowered))
        deleting = bool(words & {"delete", "remove"})
        moving = bool(words & {"move", "archive"})
        if "both" in lowered or (deleting and moving):
            return [("delete_file", {"path": _pick_file(text, "old_logs.txt")}), ("move_file", {"source": "notes.txt", "destination": "archive/notes.txt"})]
        if deleting:
            return [("delete_file", {"path": _pick_file(text, "old_logs.txt")})]
        if moving:
            match = _MOVE.search(text)
            if match:
                return [("move_file", {"source": match["source"], "destination": match["destination"]})]
            source = _pick_file(text, "notes.txt")
            return [("move_file", {"source": source, "destination": f"archive/{Path(source).name}"})]
        if words & {"organize", "organise", "tidy", "sort"} or "clean up" in lowered:
            return [("ask_user_question", {"questions": [ORGANIZE_QUESTION]})]
        if words & {"read", "open"} or "show me" in lowered:
            return [("read_file", {"path": _pick_file(text, "notes.txt")})]
        if words & {"list", "files", "ls"}:
            return [("list_files", {})]
        return []

    @staticmethod
    def _summarize(messages: list[ChatMessage]) -> str:
        results: list[ChatMessage] = []
        for message in reversed(messages):
            if message.role != "tool":
                break
            results.insert(0, message)
        lines = []
        for result in results:
            text = result.content or ""
            if result.name == "ask_user_question":
                try:
                    answers = json.loads(text).get("answers")
                except (ValueError, AttributeError):
                    answers = None
                if answers:
                    chosen = "; ".join(f"{q} -> {a}" for q, a in answers.items())
                    lines.append(f"ask_user_question: you answered {chosen}. Tell me which files to move and I'll ask before each move.")
                    continue
            lines.append(f"{result.name}: {text}")
        return "Here is what happened:\n" + "\n".join(f"- {line}" for line in lines)

    @staticmethod
    def _help() -> str:
        return (
            "(offline demo model: set OPENROUTER_API_KEY for a real one) I manage the files in "
            f"{sandbox()}. Try: 'list files', 'read notes.txt', 'delete the old logs file', "
            "'move notes.txt to archive/notes.txt', 'delete and move both', or 'help me organize my downloads'."
        )


def _pick_file(text: str, default: str) -> str:
    """The file a message names: an explicit ``name.ext``, else sandbox files whose name words all appear."""
    match = _FILE_TOKEN.search(text)
    if match:
        return match.group(0)
    words = set(re.findall(r"[a-z0-9]+", text.lower()))
    try:
        root = sandbox()
        candidates = sorted(_relative(p) for p in root.rglob("*") if p.is_file())
    except OSError:
        candidates = []
    for name in candidates:
        stem_words = re.findall(r"[a-z0-9]+", Path(name).stem.lower())
        if stem_words and set(stem_words) <= words:
            return name
    return default


class FileAgent:
    """The served agent: reads the turn's parameters (``message.user_params``), then lets the
    ReAct agent answer. Any object with this ``run_turn`` can be served."""

    def __init__(self, react: ReActAgent) -> None:
        self.react = react

    async def run_turn(self, message: ChatMessage, state: list[ChatMessage]) -> tuple[ChatMessage, list[ChatMessage]]:
        params = message.user_params or {}
        token = DRY_RUN.set(params.get("dry_run") in (True, "true", "1", "yes"))
        try:
            return await self.react.run_turn(message, state)
        finally:
            DRY_RUN.reset(token)


def build_agent() -> FileAgent:
    """A real model when ``OPENROUTER_API_KEY`` is set (and not forced offline), else the scripted one."""
    model = real_model("example agent", "OPENROUTER_API_KEY", "anthropic/claude-sonnet-4", "delete the old logs file")
    if model is not None:
        from motus.models.openai_client import OpenRouterChatClient

        return FileAgent(
            ReActAgent(client=OpenRouterChatClient(), model_name=model, system_prompt=SYSTEM_PROMPT, tools=TOOLS, max_steps=12)
        )
    return FileAgent(
        ReActAgent(client=ScriptedFileModel(), model_name="scripted-file-model", system_prompt=SYSTEM_PROMPT, tools=TOOLS, max_steps=6)
    )


agent = build_agent()

"""Agents served by ``tests/integration/serve/workers/test_zygote.py`` (imported by the server
subprocess as ``tests.agents.zygote:agent``). The first word of the message picks what the
turn does, the second (``TAG``) names the file in ``$ZYGOTE_SANDBOX`` where it writes the pid
of anything it leaves behind (``TAG.pid``; a ``sleep`` it starts also gets its worker's pid
in ``TAG-worker.pid``), so a test can check that process is gone:

- ``echo TEXT``: replies ``echo: TEXT``;
- ``spawn TAG``: starts ``sleep 300`` (same process group), replies;
- ``fork TAG``: ``os.fork()``s a child that sleeps, replies;
- ``hold TAG``: forks a child that sleeps holding the job pipe (it inherits every
  descriptor), replies, so the leader exits while the pipe is still open;
- ``spawn_hang TAG``: starts ``sleep 300``, then waits for ever (delete, timeout);
- ``spawn_wait TAG``: starts ``sleep 300``, then waits on an interrupt (park, delete);
- ``busy TAG``: starts ``sleep 300``, then blocks its event loop for up to five minutes (a
  synchronous call that never yields: only a kill ends it);
- ``kill_parent TAG``: optionally starts ``sleep 300`` (``TAG`` not ``-``), then SIGKILLs its
  parent if that is a zygote (a worker whose zygote died has init for a parent) and replies
  with the parent's pid;
- ``close_std``: closes descriptors 0, 1 and 2, then replies;
- ``close_all``: closes every descriptor (the job pipe too), then replies;
- ``close_stdout``: ``sys.stdout.close()``, then prints and replies;
- ``print``: writes a lot to stdout and stderr, then replies;
- ``pgid``: replies with its pid, process group and parent;
- ``append TEXT``: appends a line to the file ``$AGENT_IMPORT_OPEN`` names, which the module
  opened at import, and replies with what its descriptor is;
- ``log TEXT``: logs ``agent-info: TEXT`` at info and ``agent-warning: TEXT`` at warning
  (with the ``logging`` module, as a library would), then replies;
- ``fds``: replies with what each of its descriptors is, ``fd=target`` per line;
- ``del_stdout``: deletes ``sys.stdout`` and ``sys.stderr`` (the attributes), then replies;
- ``gate TAG``: waits (in a thread) until ``TAG.go`` exists in the sandbox, then replies;
- ``leave_task TAG`` / ``leave_gen TAG`` / ``leave_executor TAG``: replies while something
  it started is still unfinished (a task waiting for ever, an async generator paused at its
  first item, a function in the loop's default executor that takes 0.3 s); its ``finally``,
  or the function's end, writes ``TAG.done`` (``cancelled``, ``closed``, ``finished``).

At import, only in the zygote (``sys.argv`` ends with ``motus-zygote``; the server imports
the agent too, to check its path), ``$ZYGOTE_IMPORT`` picks a misbehaviour: ``fail`` (raise),
``exit`` (``sys.exit(3)``), ``sleep`` (``$ZYGOTE_IMPORT_SLEEP`` seconds, default 3),
``print`` (to stdout and stderr) or ``close_stdout`` (``sys.stdout.close()`` and close fd 1).
With ``$AGENT_IMPORT_PRINT`` set, every process that imports it prints one line to stdout
without flushing it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from motus.models import ChatMessage
from motus.serve.interrupt import interrupt

IN_ZYGOTE = sys.argv[-1:] == ["motus-zygote"]

#: ``$AGENT_IMPORT_OPEN``: a file every process that imports this module opens (for appending),
#: as an agent opens its log file or its database at import; ``append TEXT`` writes to it.
_OPENED = open(os.environ["AGENT_IMPORT_OPEN"], "a", buffering=1) if os.environ.get("AGENT_IMPORT_OPEN") else None  # noqa: SIM115 - the module's for its life

if os.environ.get("AGENT_IMPORT_PRINT"):
    # In every process that imports it, and not flushed: without PYTHONUNBUFFERED the line
    # waits in that process's buffer, which every process forked from it inherits.
    print(f"agent-import: buffered hello from {os.getpid()}")

if IN_ZYGOTE:
    _misbehaviour = os.environ.get("ZYGOTE_IMPORT", "")
    if _misbehaviour == "fail":
        raise RuntimeError("this agent refuses to be imported in the zygote")
    if _misbehaviour == "exit":
        sys.exit(3)
    if _misbehaviour == "sleep":
        time.sleep(float(os.environ.get("ZYGOTE_IMPORT_SLEEP", "3")))
    if _misbehaviour == "print":
        print("zygote-agent-import: hello on stdout", flush=True)
        print("zygote-agent-import: hello on stderr", file=sys.stderr, flush=True)
    if _misbehaviour == "close_stdout":
        sys.stdout.close()
        os.close(1)


def _record(tag: str, pid: int) -> None:
    sandbox = Path(os.environ["ZYGOTE_SANDBOX"])
    path = sandbox / f"{tag}.pid"
    temporary = path.with_suffix(".tmp")
    temporary.write_text(str(pid))
    temporary.rename(path)  # a reader never sees a half-written pid


def _spawn(tag: str) -> int:
    _record(f"{tag}-worker", os.getpid())
    process = subprocess.Popen(["sleep", "300"], stdin=subprocess.DEVNULL, close_fds=False)
    _record(tag, process.pid)
    return process.pid


def _fork_sleeper(tag: str) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            time.sleep(300)
        finally:
            os._exit(0)
    _record(tag, pid)
    return pid


def _mark(tag: str, text: str) -> None:
    (Path(os.environ["ZYGOTE_SANDBOX"]) / f"{tag}.done").write_text(text)


_LEFT: list[object] = []  # what a turn leaves behind, kept referenced until the process ends


async def _wait_for_ever(tag: str) -> None:
    try:
        await asyncio.Event().wait()
    finally:
        _mark(tag, "cancelled")


async def _paused_generator(tag: str):
    try:
        yield 1
        yield 2
    finally:
        _mark(tag, "closed")


def _slow_then_mark(tag: str) -> None:
    time.sleep(0.3)
    _mark(tag, "finished")


def _reply(message: ChatMessage, state: list[ChatMessage], text: str):
    response = ChatMessage.assistant_message(content=text)
    return response, state + [message, response]


async def agent(message: ChatMessage, state: list[ChatMessage]):
    word, _, rest = (message.content or "").partition(" ")
    tag = rest.strip() or "bg"
    if word == "spawn":
        return _reply(message, state, f"spawned {_spawn(tag)}")
    if word in ("fork", "hold"):
        return _reply(message, state, f"forked {_fork_sleeper(tag)}")
    if word == "spawn_hang":
        _spawn(tag)
        await asyncio.Event().wait()
    if word == "spawn_wait":
        _spawn(tag)
        value = await interrupt({"type": "wait"})
        return _reply(message, state, f"resumed {value!r}")
    if word == "busy":
        _spawn(tag)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            time.sleep(0.05)  # blocks the loop: the pipe is never read again
        return _reply(message, state, "done")
    if word == "kill_parent":
        if tag != "-":
            _spawn(tag)
        parent = os.getppid()
        with open(f"/proc/{parent}/cmdline", "rb") as handle:
            command = handle.read().split(b"\0")
        with open(f"/proc/{parent}/comm", "rb") as handle:
            name = handle.read().strip()
        if b"motus-zygote" not in command and name != b"motus-zygote":  # an orphan's parent is init: never signal that
            return _reply(message, state, f"parent {parent} is not a zygote")
        os.kill(parent, signal.SIGKILL)
        return _reply(message, state, f"killed {parent}")
    if word == "close_std":
        for fd in (0, 1, 2):
            os.close(fd)
        return _reply(message, state, "closed 0-2")
    if word == "close_all":
        os.closerange(0, 65536)
        return _reply(message, state, "closed everything")
    if word == "close_stdout":
        sys.stdout.close()
        try:
            print("after close")
        except ValueError:
            pass
        return _reply(message, state, "stdout closed")
    if word == "print":
        for n in range(2000):
            print(f"agent stdout line {n}")
            print(f"agent stderr line {n}", file=sys.stderr)
        return _reply(message, state, "printed")
    if word == "fds":
        lines = []
        for fd in sorted(os.listdir("/proc/self/fd"), key=int):
            try:
                lines.append(f"{fd}={os.readlink(f'/proc/self/fd/{fd}')}")
            except OSError:
                continue  # the descriptor listdir itself used
        return _reply(message, state, "\n".join(lines))
    if word == "pgid":
        return _reply(message, state, f"{os.getpid()} {os.getpgrp()} {os.getppid()}")
    if word == "append":
        assert _OPENED is not None, "set AGENT_IMPORT_OPEN"
        try:
            _OPENED.write(rest + "\n")
            _OPENED.flush()
        except OSError as exc:
            return _reply(message, state, f"failed: {exc}")
        return _reply(message, state, f"appended to descriptor {_OPENED.fileno()}: {os.readlink(f'/proc/self/fd/{_OPENED.fileno()}')}")
    if word == "log":
        import logging

        library = logging.getLogger("zygote_agent.library")  # as httpx logs each request's URL
        library.info("agent-info: %s", rest)
        library.warning("agent-warning: %s", rest)
        return _reply(message, state, "logged")
    if word == "del_stdout":
        del sys.stdout, sys.stderr
        return _reply(message, state, "deleted")
    if word == "gate":
        gate = Path(os.environ["ZYGOTE_SANDBOX"]) / f"{tag}.go"
        deadline = time.monotonic() + 30
        while not gate.exists() and time.monotonic() < deadline:
            await asyncio.to_thread(time.sleep, 0.01)
        return _reply(message, state, f"gate {tag} {'opened' if gate.exists() else 'timed out'}")
    if word == "leave_task":
        _LEFT.append(asyncio.get_running_loop().create_task(_wait_for_ever(tag)))
        await asyncio.sleep(0)  # the task starts waiting
        return _reply(message, state, "left a task")
    if word == "leave_gen":
        generator = _paused_generator(tag)
        _LEFT.append(generator)
        await generator.__anext__()
        return _reply(message, state, "left a generator")
    if word == "leave_executor":
        asyncio.get_running_loop().run_in_executor(None, _slow_then_mark, tag)
        return _reply(message, state, "left a function running")
    return _reply(message, state, f"echo: {rest}")


# -- hostile imports for tests/integration/serve/workers/test_rehearsal_attacks.py -------------------
# At import, only in the zygote, ``$ZYGOTE_HOSTILE`` picks what the module does to the process
# the zygote's rehearsal turn then runs in (the rehearsal runs after this import):
# ``policy_subclass`` / ``policy_raises`` (an asyncio policy whose loops are a subclass / that
# refuses to make loops), ``new_loop_raises`` (patches ``asyncio.new_event_loop``),
# ``pickle_wrap`` / ``pickle_raises`` (patches ``pickle.dumps``), ``socketpair_wrap``,
# ``uuid_const`` / ``uuid_raises`` / ``uuid_block`` (``uuid.uuid4`` never returns: the
# rehearsal blocks), ``interrupt_sync`` / ``interrupt_async`` (replace the name where it is
# defined, ``motus.durable.interrupt.interrupt``, which the guide's ``motus.serve.interrupt``
# re-exports; the agent keeps the reference it imported above),
# ``claim_hang`` (every interrupt's journal claim awaits forever: the rehearsal's pause never
# reaches its answer), ``thread`` (a thread that keeps running), ``sigchld``,
# ``sigalrm`` (a handler and a 2 ms interval timer), ``close_std`` (closes 0-2),
# ``dup2_std`` (/dev/null over 0-2), ``recursion50``, ``debug_logging``.


def _hostile_import(what: str) -> None:
    import pickle
    import socket
    import threading
    import uuid

    import motus.durable.interrupt as interrupt_module

    if what in ("policy_subclass", "policy_raises"):
        class Loop(asyncio.SelectorEventLoop):
            pass

        class Policy(asyncio.DefaultEventLoopPolicy):
            def new_event_loop(self):
                if what == "policy_raises":
                    raise RuntimeError("this policy makes no loops")
                return Loop()

        asyncio.set_event_loop_policy(Policy())
    elif what == "new_loop_raises":
        def new_event_loop():
            raise RuntimeError("asyncio.new_event_loop is disabled")

        asyncio.new_event_loop = new_event_loop
    elif what in ("pickle_wrap", "pickle_raises"):
        original = pickle.dumps

        def dumps(obj, *args, **kwargs):
            if what == "pickle_raises":
                raise RuntimeError("pickle.dumps is disabled")
            return original(obj, *args, **kwargs)

        pickle.dumps = dumps
    elif what == "socketpair_wrap":
        original_pair = socket.socketpair
        socket.socketpair = lambda *args, **kwargs: original_pair(*args, **kwargs)
    elif what in ("uuid_const", "uuid_raises", "uuid_block"):
        def uuid4():
            if what == "uuid_raises":
                raise RuntimeError("uuid4 is disabled")
            if what == "uuid_block":
                threading.Event().wait()
            return uuid.UUID(int=7)

        uuid.uuid4 = uuid4
    elif what == "interrupt_sync":
        interrupt_module.interrupt = lambda payload, **kwargs: {"auto": True}  # a sync auto-approve
    elif what == "interrupt_async":
        async def auto(payload, **kwargs):
            return {"auto": True}

        interrupt_module.interrupt = auto
    elif what == "claim_hang":
        from motus.durable.journal import Journal

        async def never(self, kind, key, label):
            await asyncio.Event().wait()

        Journal.claim_async = never
    elif what == "thread":
        lock = threading.Lock()

        def spin() -> None:
            while True:
                with lock:
                    sum(range(1000))
                time.sleep(0.001)

        threading.Thread(target=spin, name="agent-import-spinner", daemon=True).start()
    elif what == "sigchld":
        signal.signal(signal.SIGCHLD, lambda *_: None)
    elif what == "sigalrm":
        signal.signal(signal.SIGALRM, lambda *_: None)
        signal.setitimer(signal.ITIMER_REAL, 0.002, 0.002)
    elif what == "close_std":
        for fd in (0, 1, 2):
            os.close(fd)
    elif what == "dup2_std":
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
    elif what == "recursion50":
        sys.setrecursionlimit(50)
    elif what == "debug_logging":
        import logging

        logging.basicConfig(level=logging.DEBUG)
        asyncio_logger = logging.getLogger("asyncio")
        asyncio_logger.setLevel(logging.DEBUG)


if IN_ZYGOTE and os.environ.get("ZYGOTE_HOSTILE"):
    _hostile_import(os.environ["ZYGOTE_HOSTILE"])

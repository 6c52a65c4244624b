"""Attacks on PostgreSQL's history as a row a message (schema 3, ``motus_messages``) with
several instances on one database.

The property: every session's history (``GET /sessions/{id}/messages`` on any instance,
and after restarts) is exactly the list the agent returned in the last turn that ended;
never partial, never mixed with another session's or an older incarnation's rows; nothing
lost across ``kill -9``; a stale instance never writes rows over a newer version.

Histories are compared as canonical JSON (see ``test_history_attacks.canon``). Where a
race must go one way it is arranged, not waited for: an instance is frozen (``SIGSTOP``)
while the database is in the middle of its read of a session's history, as seen in
``pg_stat_activity``, and thawed once the change made elsewhere is committed.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import psutil

from motus.serve.store import SCHEMA_VERSION
from motus.serve.store.postgres_schema import SCHEMA_LOCK
from tests.conftest import Server, Starter, wait_until
from tests.integration.serve.history.test_history_attacks import (
    PARKER,
    PRELOAD,
    TRICKY,
    Message,
    canon,
    create,
    expected_after,
    history,
    kill_server,
    parked,
    parker_after,
    turn,
    user,
)
from tests.integration.serve.instances.test_instances_attacks import NEVER, owner_of, serve, sql, wait_lapsed

#: An instance's read of one session's history (``load_one``, in the snapshot of its row).
READ_QUERY = "SELECT body FROM motus_messages WHERE session_id = $1 ORDER BY seq"

def stored(url: str, sid: str) -> list[Message]:
    """The session's history as its rows say, read directly."""
    return [json.loads(body) for (body,) in sql(url, "SELECT body FROM motus_messages WHERE session_id = %s ORDER BY seq", sid)]


def row_seqs(url: str, sid: str) -> list[int]:
    return [seq for (seq,) in sql(url, "SELECT seq FROM motus_messages WHERE session_id = %s ORDER BY seq", sid)]


# -- an instance that starts while another ends a turn --------------------------------------------


def _process_with_port(port: int) -> psutil.Process | None:
    """Our descendant (a server's process) with a TCP connection from local ``port``."""
    for proc in psutil.Process().children(recursive=True):
        try:
            if any(c.laddr and c.laddr.port == port for c in proc.net_connections(kind="tcp")):
                return proc
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


def _tree(root: psutil.Process) -> list[psutil.Process]:
    try:
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


@contextmanager
def frozen_in_its_read(
    url: str, server: Server, forget: Callable[[], None], read: Callable[[], object], attempts: int = 6
) -> Iterator[list[object]]:
    """Make ``server`` forget a session (``forget``), then call ``read`` (a request to
    ``server`` for that session, in a thread) and freeze ``server`` (``SIGSTOP``, every
    process of it) while the database runs its read of the session's history: the read's
    snapshot is taken (its row was read first), the history is still being sent. The body
    runs while it is frozen; on leaving, it is thawed and the request waited for. Yields a
    list that holds what ``read`` returned once it has. A server frozen too late (past that
    read) is thawed and the whole tried again."""
    import psycopg

    root = psutil.Process(server.process.pid)
    with psycopg.connect(url, autocommit=True) as watch:
        for _ in range(attempts):
            got: list[object] = []
            failure: list[BaseException] = []
            forget()

            def run() -> None:
                try:
                    got.append(read())
                except BaseException as exc:  # noqa: BLE001 - raised below
                    failure.append(exc)

            thread = threading.Thread(target=run, name="frozen-read")
            frozen: list[psutil.Process] = []
            # Listed before the read begins: once it is seen, the stop must come at once (the
            # read of 8 MB is over in tens of milliseconds, listing a tree under load takes as long).
            tree = _tree(root)
            thread.start()
            try:
                def caught() -> int | None:
                    row = watch.execute(
                        "SELECT client_port FROM pg_stat_activity WHERE state = 'active' AND query = %s", (READ_QUERY,)
                    ).fetchone()
                    if row is None:
                        return None
                    for proc in tree:
                        try:
                            proc.send_signal(signal.SIGSTOP)
                            frozen.append(proc)
                        except psutil.NoSuchProcess:
                            pass
                    return row[0]

                try:
                    port = wait_until(caught, timeout=10, interval=0.0005, what="the server's read of the session's history")
                except AssertionError:
                    continue  # the read came and went between two looks (a loaded machine): again
                # Frozen before its next statement: the connection's last query is still that read.
                [(last,)] = watch.execute("SELECT query FROM pg_stat_activity WHERE client_port = %s", (port,)).fetchall()
                if last == READ_QUERY:
                    yield got
                    return
            finally:
                for proc in frozen:
                    proc.send_signal(signal.SIGCONT)
                thread.join(60)
                if failure and sys.exc_info()[0] is None:  # (never hiding the body's own failure)
                    raise failure[0]
        raise AssertionError(f"could not freeze the server in its read of a session in {attempts} attempts")


def reading_others(server: Server, fillers: list[str]) -> Callable[[], None]:
    """A ``forget`` for ``frozen_in_its_read``: ``server`` (with ``--session-cache 1``)
    reads two other sessions, and so holds neither of the others."""
    def forget() -> None:
        for filler in fillers:
            assert server.get(f"/sessions/{filler}").status_code == 200
    return forget


#: Nine and a half megabytes (the request limit is ten): its read lasts long enough to be seen.
BIG = [user(f"big {i} " + "b" * 200_000) for i in range(47)]


def test_an_instance_reading_a_session_while_its_turn_ends_elsewhere_serves_each_history_as_it_ended(
    start_server: Starter, pg_url: str
) -> None:
    """B holds few sessions (``--session-cache 1``) and reads the others from the store when
    used: the row, its journal and its history, in one snapshot. A turn that ends on A while
    B is in the middle of that read (frozen while the history is sent): B's read is of the
    row as it was, history included, and whatever B serves next, and B's next turn, start
    from the row as A left it. Before, the read of every message at B's start and the read of
    the rows were two snapshots: B paired the row's new version with the history of before,
    and served it for ever."""
    a = serve(start_server, TRICKY, pg_url, "--allow-custom-ids")
    b = serve(start_server, TRICKY, pg_url, "--allow-custom-ids", "--session-cache", "1")
    fillers = [create(a, [user(f"filler {n}")]) for n in range(2)]
    appended = create(a, BIG)
    expected: list[Message] = list(BIG)

    with frozen_in_its_read(pg_url, b, reading_others(b, fillers), lambda: history(b, appended)) as got:
        assert turn(a, appended, "append on A")["response"]["content"] == "done: append on A"
        expected = expected_after(expected, "append on A")
    [read] = got
    assert canon(read) in (canon(BIG), canon(expected))  # (the read began before A's turn ended)

    for name, server in (("A", a), ("B", b)):
        assert canon(history(server, appended)) == canon(expected), name
    assert turn(b, appended, "append on B")["response"]["content"] == "done: append on B"
    expected = expected_after(expected, "append on B")
    for name, got_now in (("A", history(a, appended)), ("B", history(b, appended)), ("rows", stored(pg_url, appended))):
        assert canon(got_now) == canon(expected), name


def ended(server: Server, sid: str) -> dict:
    """The session once its turn (one of milliseconds) has ended; fails, with what the log
    says of it, if it is still running 15 s on."""
    try:
        return wait_until(lambda: (lambda s: s if s["status"] != "running" else None)(server.wait(sid, timeout=2)),
                          timeout=15, what=f"session {sid}'s turn to end")  # type: ignore[return-value]
    except AssertionError as exc:
        said = [line for line in server.log().splitlines() if sid in line and "WARNING" in line]
        raise AssertionError(f"{exc}; its log says: {said[:2]}") from None


def test_a_turn_on_a_copy_read_while_its_history_shrank_elsewhere_ends_and_stores_its_history(
    start_server: Starter, pg_url: str
) -> None:
    """As above, A's turn shortens the history while B reads it: B's copy may be of the
    forty messages of before, the rows are three. B's next turn must end (a turn of
    milliseconds), with a history all instances and the rows agree on."""
    a = serve(start_server, TRICKY, pg_url)
    b = serve(start_server, TRICKY, pg_url, "--session-cache", "1")
    fillers = [create(a, [user(f"filler {n}")]) for n in range(2)]
    sid = create(a, BIG)
    with frozen_in_its_read(pg_url, b, reading_others(b, fillers), lambda: history(b, sid)):
        assert turn(a, sid, "shorter 1")["status"] == "idle"
    shortened = expected_after(BIG, "shorter 1")
    assert canon(stored(pg_url, sid)) == canon(shortened)

    b.send(sid, "last rewritten on B")
    body = ended(b, sid)
    assert body["status"] == "idle", body
    expected = expected_after(shortened, "last rewritten on B")
    for got in (history(a, sid), history(b, sid), stored(pg_url, sid)):
        assert canon(got) == canon(expected)


# -- a stale instance, a turn taken over, a turn replayed elsewhere ---------------------------------

STAMPED = "tests.agents.postgres_history_attack:stamped"


def stamped_after(before: list[Message], content: str, pid: int) -> list[Message]:
    """What ``tests.agents.postgres_history_attack:stamped`` returns, run in process ``pid``."""
    state = json.loads(json.dumps(before))
    if "edit" in content.split(" ") and state:
        state[-1]["content"] = f"{state[-1]['content']} +edited"
    return [*state, user(content), {"role": "assistant", "content": f"done: {content} pid={pid}"}]


def pg_processes(server: Server, pg_url: str) -> list[psutil.Process]:
    """The server's processes connected to the database (not its agents' workers)."""
    port = urlsplit(pg_url).port
    found = []
    for proc in [psutil.Process(server.process.pid), *server.descendants()]:
        try:
            if any(c.raddr and c.raddr.port == port for c in proc.net_connections(kind="tcp")):
                found.append(proc)
        except psutil.NoSuchProcess:
            pass
    return found


def instance_id(server: Server, pg_url: str) -> str:
    """The instance id of ``server`` (its connections are named ``motus-<id>``)."""
    ports = set()
    for proc in pg_processes(server, pg_url):
        ports |= {c.laddr.port for c in proc.net_connections(kind="tcp") if c.raddr and c.raddr.port == urlsplit(pg_url).port}
    rows = sql(pg_url, "SELECT DISTINCT application_name FROM pg_stat_activity WHERE client_port = ANY(%s) "
                       "AND application_name LIKE 'motus-%%'", list(ports))
    assert len(rows) == 1, rows
    return rows[0][0].removeprefix("motus-")


def pid_from(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def pid_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def long_history(tag: str, count: int = 300) -> list[Message]:
    return [user(f"{tag} {i:03d} " + "p" * 200) for i in range(count)]


def test_an_instance_frozen_past_its_lease_never_writes_its_turns_history_over_the_replay(
    start_server: Starter, pg_url: str, sandbox: Path
) -> None:
    """A's turn (300 messages, edited in place, then appended to) is held in its agent; A is
    frozen (SIGSTOP) until its lease lapses and B takes the turn over and replays it to the
    end. Then A's agent is let go: its result reaches A when A is thawed. A must drop it
    (its save fails on the version, or its refresh finds the turn gone first) and the
    history must be the replay's, on every instance and in the rows; A's next turn then
    starts from it."""
    env = {"MOTUS_EXAMPLE_DIR": str(sandbox)}
    with start_server.together():
        a = serve(start_server, STAMPED, pg_url, env=env)
        b = serve(start_server, STAMPED, pg_url, env=env)
    preload = long_history("s")
    sid = create(a, preload)
    a_id = instance_id(a, pg_url)
    a.send(sid, "gate g1 edit")
    first = wait_until(lambda: pid_from(sandbox / "started-g1"), timeout=20, what="A's agent to start")
    assert owner_of(pg_url, sid) == a_id
    frozen = pg_processes(a, pg_url)
    assert frozen
    for proc in frozen:
        proc.send_signal(signal.SIGSTOP)
    try:
        wait_until(lambda: owner_of(pg_url, sid) not in (None, a_id), timeout=30, what="B to take the turn over")
        replay = wait_until(lambda: (lambda p: p if p not in (None, first) else None)(pid_from(sandbox / "started-g1")),
                            timeout=30, what="B's replay to start")
        (sandbox / "release-g1").write_text("")
        body = b.wait_for_status(sid, "idle")
    finally:
        for proc in frozen:
            proc.send_signal(signal.SIGCONT)
    expected = stamped_after(preload, "gate g1 edit", replay)  # type: ignore[arg-type]
    assert body["response"]["content"] == expected[-1]["content"], body
    wait_until(lambda: pid_gone(first), timeout=20, what="A's agent to be stopped")  # A has seen its result
    for name, got in (("A", history(a, sid)), ("B", history(b, sid)), ("rows", stored(pg_url, sid))):
        assert canon(got) == canon(expected), name
    assert row_seqs(pg_url, sid) == list(range(len(expected)))

    a.send(sid, "after edit")
    body = a.wait_for_status(sid, "idle")
    pid = int(body["response"]["content"].rsplit("pid=", 1)[1])
    expected = stamped_after(expected, "after edit", pid)
    for name, got in (("A", history(a, sid)), ("B", history(b, sid)), ("rows", stored(pg_url, sid))):
        assert canon(got) == canon(expected), name


def test_kill_9_of_the_instance_running_turns_on_long_histories_each_is_replayed_once_elsewhere(
    start_server: Starter, pg_url: str, sandbox: Path
) -> None:
    """Four turns on 300-message histories (edited in place, then appended to) are held in
    their agents on A; A is killed (-9). B and C take them over and replay them; every
    history, on B, on C, in the rows and after C restarts, is exactly its replay's list."""
    env = {"MOTUS_EXAMPLE_DIR": str(sandbox)}
    with start_server.together():
        a = serve(start_server, STAMPED, pg_url, "--workers", "4", env=env)
        b = serve(start_server, STAMPED, pg_url, "--workers", "4", env=env)
        c = serve(start_server, STAMPED, pg_url, "--workers", "4", env=env)
    sessions = {create(a, long_history(f"s{n}")): n for n in range(4)}
    firsts = {}
    for sid, n in sessions.items():
        a.send(sid, f"gate k{n} edit")
    for n in sessions.values():
        firsts[n] = wait_until(lambda: pid_from(sandbox / f"started-k{n}"), timeout=20, what=f"turn {n} to start")
    kill_server(a)
    for n in sessions.values():
        wait_until(lambda: pid_from(sandbox / f"started-k{n}") not in (None, firsts[n]), timeout=30, what=f"turn {n}'s replay")
        (sandbox / f"release-k{n}").write_text("")
    expected = {}
    for sid, n in sessions.items():
        body = b.wait_for_status(sid, "idle")
        pid = pid_from(sandbox / f"started-k{n}")
        expected[sid] = stamped_after(long_history(f"s{n}"), f"gate k{n} edit", pid)  # type: ignore[arg-type]
        assert body["response"]["content"] == expected[sid][-1]["content"], body
    for sid in sessions:
        for name, got in (("B", history(b, sid)), ("C", history(c, sid)), ("rows", stored(pg_url, sid))):
            assert canon(got) == canon(expected[sid]), (name, sid)
        assert row_seqs(pg_url, sid) == list(range(len(expected[sid])))
    assert c.stop() == 0
    c = serve(start_server, STAMPED, pg_url, "--workers", "4", env=env)
    for sid in sessions:
        assert canon(history(c, sid)) == canon(expected[sid])


def test_a_parked_turn_resumed_on_another_instance_is_replayed_from_the_rows(
    start_server: Starter, pg_url: str
) -> None:
    """``--park-after 0``: the agent edits the last of 300 messages in place, appends, asks;
    its process ends. The resume lands on B while A (the owner) lives: A replays. Then
    again, A is killed (-9) while parked: the resume on B takes the turn over and B replays
    it from the rows. Each history is exactly the replay's list, everywhere."""
    args = ("--park-after", "0")
    with start_server.together():
        a = serve(start_server, PARKER, pg_url, *args)
        b = serve(start_server, PARKER, pg_url, *args, lease=NEVER)
    preload = long_history("p")
    sid = create(a, preload)

    a.send(sid, "first")
    item = parked(a, sid)["interrupts"][0]
    assert canon(history(b, sid)) == canon(preload)
    response = b.post(f"/sessions/{sid}/resume", json={"interrupt_id": item["interrupt_id"], "value": "yes"})
    assert response.status_code == 200, response.text
    assert b.wait_for_status(sid, "idle")["response"]["content"] == "done: first"
    expected = parker_after(preload, "first", "yes")
    for name, got in (("A", history(a, sid)), ("B", history(b, sid)), ("rows", stored(pg_url, sid))):
        assert canon(got) == canon(expected), name

    a.send(sid, "second")
    item = parked(a, sid)["interrupts"][0]
    owner = owner_of(pg_url, sid)
    kill_server(a)
    wait_lapsed(pg_url, owner)
    response = b.post(f"/sessions/{sid}/resume", json={"interrupt_id": item["interrupt_id"], "value": {"n": 2}})
    assert response.status_code == 200, response.text
    assert b.wait_for_status(sid, "idle")["response"]["content"] == "done: second"
    expected = parker_after(expected, "second", {"n": 2})
    for name, got in (("B", history(b, sid)), ("rows", stored(pg_url, sid))):
        assert canon(got) == canon(expected), name
    assert row_seqs(pg_url, sid) == list(range(len(expected)))


# -- deleted on one instance while its turn ends on another, then made again ----------------------


def test_a_session_deleted_on_b_while_its_turn_ends_on_a_and_made_again_shows_none_of_the_old_rows(
    start_server: Starter, pg_url: str, sandbox: Path
) -> None:
    """A's turn is held in its agent; B deletes the session and makes it again (``PUT``)
    with another 50-message history; then A's agent returns ``[*old, message, reply]``. No
    old message may show, on A or B, in the rows, after A's next turn (which keeps all but
    the last message) or after both restart."""
    env = {"MOTUS_EXAMPLE_DIR": str(sandbox)}
    with start_server.together():
        a = serve(start_server, STAMPED, pg_url, "--allow-custom-ids", env=env)
        b = serve(start_server, STAMPED, pg_url, "--allow-custom-ids", env=env)
    sid = str(uuid.uuid4())
    old = [user(f"old {i}") for i in range(50)]
    new = [user(f"new {i}") for i in range(50)]
    assert a.put(f"/sessions/{sid}", json={"state": old}).status_code == 201
    a.send(sid, "gate d1")
    first = wait_until(lambda: pid_from(sandbox / "started-d1"), timeout=20, what="A's agent to start")
    assert b.delete(f"/sessions/{sid}").status_code == 204
    assert b.put(f"/sessions/{sid}", json={"state": new}).status_code == 201
    (sandbox / "release-d1").write_text("")
    wait_until(lambda: pid_gone(first), timeout=20, what="A's old agent to end")
    for name, got in (("A", history(a, sid)), ("B", history(b, sid)), ("rows", stored(pg_url, sid))):
        assert canon(got) == canon(new), name
    assert a.get(f"/sessions/{sid}").json()["status"] == "idle"

    a.send(sid, "then edit")
    body = a.wait_for_status(sid, "idle")
    expected = stamped_after(new, "then edit", int(body["response"]["content"].rsplit("pid=", 1)[1]))
    for name, got in (("A", history(a, sid)), ("B", history(b, sid)), ("rows", stored(pg_url, sid))):
        assert canon(got) == canon(expected), name
    assert a.stop() == 0 and b.stop() == 0
    again = serve(start_server, STAMPED, pg_url, "--allow-custom-ids", env=env)
    assert canon(history(again, sid)) == canon(expected)
    assert row_seqs(pg_url, sid) == list(range(len(expected)))


# -- hostile histories --------------------------------------------------------------------------

def _key(messages: list[Message]) -> int:
    return hash(tuple(canon(messages)))


HOSTILE_STEPS = [
    "weird",
    "retype 1 n float",
    "retype 1 b int",
    "retype 1 f negzero",
    "retype 1 z bool",
    "keyorder 1",
    "many 10000",
    "last rewritten at the end of ten thousand",
    "shorter 3",
    "weird",
    "empty",
    "append after empty",
]


def test_hostile_histories_through_two_instances_are_stored_and_served_exactly(
    start_server: Starter, pg_url: str
) -> None:
    """NUL, lone surrogates, values that change JSON type only (1 -> 1.0, True -> 1, 0.0 ->
    -0.0, 0 -> False), keys reordered, 10,000 messages then three, a message of 5 MB: each
    turn on the other instance than the last; every history read on both and in the rows."""
    with start_server.together():
        a = serve(start_server, TRICKY, pg_url)
        b = serve(start_server, TRICKY, pg_url)
    big = {"role": "user", "content": "\u0000\ud800" + "x" * (5 * 1024 * 1024)}
    sid = create(a, [*PRELOAD, big])
    expected = [*PRELOAD, big]
    allowed = {_key(expected)}  # every history a reader may see: one a turn ended with
    stop = threading.Event()
    wrong: list[str] = []

    def read() -> None:  # reads on both instances all along, while turns end on either
        while not stop.is_set():
            for name, server in (("A", a), ("B", b)):
                try:
                    got = history(server, sid)
                except AssertionError as exc:  # not 200
                    wrong.append(f"{name}: {exc}")
                    continue
                if _key(got) not in allowed:
                    wrong.append(f"{name} served {len(got)} messages, no history a turn ended with")
            stop.wait(0.02)

    reader = threading.Thread(target=read, name="reader")
    reader.start()
    try:
        servers = [b, a]
        for n, step in enumerate(HOSTILE_STEPS):
            server = servers[n % 2]
            allowed.add(_key(expected_after(expected, step)))
            assert turn(server, sid, step)["response"]["content"] == f"done: {step}"
            expected = expected_after(expected, step)
            for name, got in (("A", history(a, sid)), ("B", history(b, sid)), ("rows", stored(pg_url, sid))):
                assert canon(got) == canon(expected), (step, name, len(got), len(expected))
            assert row_seqs(pg_url, sid) == list(range(len(expected))), step
    finally:
        stop.set()
        reader.join(60)
    assert not wrong, wrong[:5]
    assert a.stop() == 0
    a = serve(start_server, TRICKY, pg_url)
    assert canon(history(a, sid)) == canon(expected)


# -- version 2 databases --------------------------------------------------------------------------

MIGRATED = 2000  # sessions of a version 2 database


def v2_history(n: int) -> list[Message]:
    last = {"role": "assistant", "content": f"n={n}", "user_params": {"f": 1.0, "i": 1}}
    return [*(user(f"v2 {n} {i} " + "h" * 100) for i in range(n % 13)), last]


def make_version_2(pg_url: str, count: int) -> dict[str, list[Message]]:
    """A version 2 database: whole histories as JSON in ``motus_sessions.state``, no rows."""
    from motus.serve.store.postgres import PostgresStore

    store = PostgresStore(pg_url)
    store.open()
    store.close()
    histories = {f"v2-{n:05d}": v2_history(n) for n in range(count)}
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DROP TABLE motus_messages")
        conn.execute("UPDATE motus_meta SET value = '2' WHERE key = 'schema_version'")
        columns = "session_id, status, state, turn_id, touched, version"
        with conn.cursor() as cur, cur.copy(f"COPY motus_sessions ({columns}) FROM STDIN") as copy:
            for n, (sid, messages) in enumerate(histories.items()):
                copy.write_row((sid, "idle", json.dumps(messages), 0, float(n), 1))
    return histories


def all_rows(pg_url: str) -> dict[str, list[tuple[int, Message]]]:
    found: dict[str, list[tuple[int, Message]]] = {}
    for sid, seq, body in sql(pg_url, "SELECT session_id, seq, body FROM motus_messages ORDER BY session_id, seq"):
        found.setdefault(sid, []).append((seq, json.loads(body)))
    return found


def test_three_instances_started_at_once_on_a_version_2_database_one_killed_mid_move_all_start_and_move_it_once(
    start_server: Starter, pg_url: str
) -> None:
    """Two thousand version 2 sessions. Three instances start together while the test holds
    the schema lock for longer than a connection's ``lock_timeout`` (5 s): all three must wait
    (the schema transaction waits for the lock without a limit, as a large move takes as long
    as it takes). Then the one moving the histories into rows (holding the schema lock) is
    killed (-9) while it does. The two others must both start (each runs the move again from
    the start after the kill), and every history must be in rows exactly once."""
    import psycopg

    histories = make_version_2(pg_url, MIGRATED)
    results: dict[int, Server | BaseException] = {}

    def start(n: int) -> None:
        try:
            # A loaded machine moves slowly, and the survivors wait for the test's hold, the
            # killed move and one whole move.
            results[n] = serve(start_server, TRICKY, pg_url, health_timeout=120)
        except BaseException as exc:  # noqa: BLE001 - checked below
            results[n] = exc

    def waited_past_lock_timeout() -> bool:
        rows = sql(pg_url, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                           "AND wait_event = 'advisory' AND state = 'active' AND query LIKE '%%pg_advisory_xact_lock%%' "
                           "AND now() - query_start > interval '6 seconds' AND pid <> pg_backend_pid()")
        return rows[0][0] == 3

    def moving(holder_pid: int) -> psutil.Process | None:
        # The move is held at one session's row, which the test has locked: the instance
        # moving is the one whose connection waits for the test's (none of the others can
        # reach that row without the schema lock the mover holds). Found this way, the move
        # is still under way when it is killed however fast the machine (racing a running
        # move for the kill, it had once ended and its instance was healthy first).
        rows = sql(pg_url, "SELECT client_port FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", holder_pid)
        return _process_with_port(rows[0][0]) if rows else None

    threads = [threading.Thread(target=start, args=(n,)) for n in range(3)]
    try:
        with psycopg.connect(pg_url, autocommit=True) as holder, psycopg.connect(pg_url) as row_holder:
            # Half way through the sessions (the move reads them in no set order, so this
            # one is reached after some and before others, whatever the order).
            row_holder.execute("SELECT 1 FROM motus_sessions WHERE session_id = %s FOR UPDATE", (f"v2-{MIGRATED // 2:05d}",))
            holder.execute("SELECT pg_advisory_lock(%s)", (SCHEMA_LOCK,))
            for thread in threads:
                thread.start()
            wait_until(waited_past_lock_timeout, timeout=60, interval=0.1,
                       what="three instances to wait on the schema lock for more than 6 s")
            holder.execute("SELECT pg_advisory_unlock(%s)", (SCHEMA_LOCK,))
            mover = wait_until(lambda: moving(row_holder.info.backend_pid), timeout=60, interval=0.02,
                               what="an instance's move to reach the session the test holds")
            os.killpg(os.getpgid(mover.pid), signal.SIGKILL)  # type: ignore[union-attr]
            row_holder.rollback()  # the survivors' moves go past it
    finally:
        for thread in threads:
            if thread.ident is not None:  # started
                thread.join(180)
    failed = {n: r for n, r in results.items() if not isinstance(r, Server)}
    assert len(failed) == 1, "instances that did not start: " + "\n".join(str(r)[:2000] for r in failed.values())
    rows = all_rows(pg_url)
    assert {row[0] for row in sql(pg_url, "SELECT DISTINCT state FROM motus_sessions")} == {""}
    assert sql(pg_url, "SELECT value FROM motus_meta WHERE key = 'schema_version'") == [(str(SCHEMA_VERSION),)]
    wrong = [sid for sid, messages in histories.items()
             if [seq for seq, _ in rows.get(sid, [])] != list(range(len(messages)))
             or canon([m for _, m in rows.get(sid, [])]) != canon(messages)]
    assert not wrong, f"{len(wrong)} histories not moved exactly once, e.g. {wrong[:3]}"
    servers = [r for r in results.values() if isinstance(r, Server)]
    for server in servers:
        for sid in list(histories)[:: MIGRATED // 8]:
            assert canon(history(server, sid)) == canon(histories[sid])


def test_a_save_whose_rows_before_kept_are_missing_writes_the_history_whole(
    start_server: Starter, pg_url: str
) -> None:
    """The store's contract: a save finding fewer rows before ``kept`` than ``kept`` is
    ``StaleSession``, and "the caller reads the session again and writes it whole". Here a
    row before ``kept`` is gone while the version stays (what a copy read across two
    snapshots looks like to the save; made here by deleting the row). The turn keeps four
    of five messages. It must end, with the history it returned, in the rows too."""
    a = serve(start_server, TRICKY, pg_url)
    sid = create(a, PRELOAD)
    sql(pg_url, "DELETE FROM motus_messages WHERE session_id = %s AND seq = 1", sid)
    a.send(sid, "last rewritten")
    body = ended(a, sid)
    assert body["status"] == "idle", body
    expected = expected_after(PRELOAD, "last rewritten")
    assert canon(history(a, sid)) == canon(expected)
    assert canon(stored(pg_url, sid)) == canon(expected)

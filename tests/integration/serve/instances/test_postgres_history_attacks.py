"""Attacks on PostgreSQL's history as a row a message (schema 3, ``motus_messages``) with
several instances on one database.

The property: every session's history (``GET /sessions/{id}/messages`` on any instance,
and after restarts) is exactly the list the agent returned in the last turn that ended;
never partial, never mixed with another session's or an older incarnation's rows; nothing
lost across ``kill -9``; a stale instance never writes rows over a newer version.

Histories are compared as canonical JSON (see ``test_history_attacks.canon``). Where a
race must go one way it is arranged, not waited for: an instance starting is frozen
(``SIGSTOP``) while the database is in the middle of its first read of the messages, as
seen in ``pg_stat_activity``, and thawed once the change made elsewhere is committed.
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

from tests.conftest import Server, Starter, wait_until
from tests.support.launcher import server_roots
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

LOAD_QUERY = "SELECT session_id, body FROM motus_messages ORDER BY session_id, seq"


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
def frozen_in_its_first_read(url: str, start: Callable[[], Server], attempts: int = 3) -> Iterator[list[Server]]:
    """Start an instance (``start``, in a thread: it returns once the instance answers) and
    freeze it (``SIGSTOP``, every process of it) while the database runs its read of every
    message: that read's snapshot is taken, the read of the session rows is still to come.
    The body runs while it is frozen; on leaving, it is thawed and waited for. Yields a
    list that holds the server once it answers. An instance frozen too late (already past
    that read) is thawed, stopped, and started again."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as watch:
        for _ in range(attempts):
            started: list[Server] = []
            failure: list[BaseException] = []
            before = {p.pid for p in server_roots()}

            def run() -> None:
                try:
                    started.append(start())
                except BaseException as exc:  # noqa: BLE001 - raised below
                    failure.append(exc)

            thread = threading.Thread(target=run, name="start-frozen-instance")
            thread.start()
            frozen: list[psutil.Process] = []
            try:
                root = wait_until(lambda: next((p for p in server_roots() if p.pid not in before), None),
                                  timeout=30, interval=0.001, what="the new instance's process")

                def caught() -> int | None:
                    row = watch.execute(
                        "SELECT client_port FROM pg_stat_activity WHERE state = 'active' AND query = %s", (LOAD_QUERY,)
                    ).fetchone()
                    if row is None:
                        return None
                    for proc in _tree(root):  # type: ignore[arg-type]
                        try:
                            proc.send_signal(signal.SIGSTOP)
                            frozen.append(proc)
                        except psutil.NoSuchProcess:
                            pass
                    return row[0]

                port = wait_until(caught, timeout=30, interval=0.0005, what="the new instance's read of every message")
                # Frozen before its next statement: the connection's last query is still that read.
                [(last,)] = watch.execute("SELECT query FROM pg_stat_activity WHERE client_port = %s", (port,)).fetchall()
                if last == LOAD_QUERY:
                    yield started
                    return
            finally:
                for proc in frozen:
                    proc.send_signal(signal.SIGCONT)
                thread.join(60)
                if failure and sys.exc_info()[0] is None:  # (never hiding the body's own failure)
                    raise failure[0]
            for server in started:  # frozen too late: again
                server.stop()
        raise AssertionError(f"could not freeze a starting instance in its read of every message in {attempts} attempts")


def big_filler(server: Server, count: int = 4) -> None:
    """Sessions of 8 MB of history each, so that reading every message takes a while (and
    outlasts the socket's buffers, so a frozen reader holds the database mid-read)."""
    for n in range(count):
        create(server, [user(f"filler {n} {i} " + "f" * 200_000) for i in range(40)])


def test_an_instance_starting_while_turns_end_elsewhere_serves_each_history_as_it_ended(
    start_server: Starter, pg_url: str
) -> None:
    """B starts while A works. ``load`` reads every message, then (another statement,
    another snapshot) every session row. A turn that ends on A, and a session A creates,
    between the two: B's copy has the row's new version with the history of before (or
    none). Nothing tells B its copy is wrong (the version is the row's), so B serves it for
    ever, and B's next turn on it starts from it: A's turn is lost, or the rows become a
    mix of A's and B's histories while B serves another."""
    a = serve(start_server, TRICKY, pg_url, "--allow-custom-ids")
    big_filler(a)
    appended = create(a, PRELOAD)
    edited = create(a, PRELOAD)
    remade = str(uuid.uuid4())
    assert a.put(f"/sessions/{remade}", json={"state": [user(f"old incarnation {i}") for i in range(3)]}).status_code == 201
    expected: dict[str, list[Message]] = {appended: PRELOAD, edited: PRELOAD}

    start_b = lambda: serve(start_server, TRICKY, pg_url, "--allow-custom-ids")  # noqa: E731
    with frozen_in_its_first_read(pg_url, start_b) as started:
        for sid, content in ((appended, "append on A"), (edited, "last edited on A")):
            assert turn(a, sid, content)["response"]["content"] == f"done: {content}"
            expected[sid] = expected_after(expected[sid], content)
        created = create(a, [user("made on A while B started")])
        expected[created] = [user("made on A while B started")]
        assert a.delete(f"/sessions/{remade}").status_code == 204
        assert a.put(f"/sessions/{remade}", json={"state": [user("new incarnation")]}).status_code == 201
        expected[remade] = [user("new incarnation")]
    [b] = started

    problems = []
    for sid, want in expected.items():
        for name, server in (("A", a), ("B", b)):
            got = history(server, sid)
            if canon(got) != canon(want):
                problems.append(f"{name} serves session {sid} with {len(got)} messages {[m['content'][:30] for m in got]}, "
                                f"the rows hold {len(stored(pg_url, sid))}, expected {len(want)}")
    # B's next turns start from its copy.
    for sid in (appended, edited):
        assert turn(b, sid, "append on B")["response"]["content"] == "done: append on B"
        expected[sid] = expected_after(expected[sid], "append on B")
        for name, got in (("A", history(a, sid)), ("B", history(b, sid)), ("rows", stored(pg_url, sid))):
            if canon(got) != canon(expected[sid]):
                problems.append(f"after B's turn, {name} has session {sid} as {[m['content'][:30] for m in got]}, "
                                f"expected {[m['content'][:30] for m in expected[sid]]}")
    assert not problems, "\n".join(problems)


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
    """As above, A's turn shortens the history while B reads it at its start: B's copy has
    the row's version and the five messages of before; the rows are three. B's next turn
    keeps four of its five messages (it rewrites the last): the save's count of the rows
    before ``kept`` finds three, divides by zero, ``StaleSession``; B reads the row again,
    finds the version it has, keeps its copy, and tries the same save again. The turn must
    end (a turn of milliseconds), with a history all instances and the rows agree on."""
    a = serve(start_server, TRICKY, pg_url)
    big_filler(a)
    sid = create(a, PRELOAD)
    with frozen_in_its_first_read(pg_url, lambda: serve(start_server, TRICKY, pg_url)) as started:
        assert turn(a, sid, "shorter 1")["status"] == "idle"
    [b] = started
    shortened = expected_after(PRELOAD, "shorter 1")
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

MIGRATED = 10000  # sessions of a version 2 database


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
    """Ten thousand version 2 sessions. Three instances start together; the one moving the
    histories into rows (holding the schema lock) is killed (-9) while it does. The two
    others must both start (each waits on the schema lock while the move runs, and runs it
    again from the start after the kill), and every history must be in rows exactly once.
    The wait on the lock is a statement under the connection's ``lock_timeout`` (5 s):
    an instance that waits longer (a move of seconds, on this machine about 5 s for ten
    thousand short histories, after part of another) exits 2."""
    histories = make_version_2(pg_url, MIGRATED)
    results: dict[int, Server | BaseException] = {}

    def start(n: int) -> None:
        try:
            results[n] = serve(start_server, TRICKY, pg_url)
        except BaseException as exc:  # noqa: BLE001 - checked below
            results[n] = exc

    threads = [threading.Thread(target=start, args=(n,)) for n in range(3)]
    for thread in threads:
        thread.start()
    try:
        def moving() -> psutil.Process | None:
            # The move writes each history with the store's one history statement (a WITH
            # whose INSERT INTO motus_messages is not at the start of the text).
            rows = sql(pg_url, "SELECT client_port FROM pg_stat_activity WHERE query LIKE '%%INSERT INTO motus_messages%%' "
                               "AND pid <> pg_backend_pid()")
            return _process_with_port(rows[0][0]) if rows else None

        mover = wait_until(moving, timeout=60, interval=0.005, what="an instance to move the histories")
        os.killpg(os.getpgid(mover.pid), signal.SIGKILL)  # type: ignore[union-attr]
    finally:
        for thread in threads:
            thread.join(120)
    rows = all_rows(pg_url)
    assert {row[0] for row in sql(pg_url, "SELECT DISTINCT state FROM motus_sessions")} == {""}
    assert sql(pg_url, "SELECT value FROM motus_meta WHERE key = 'schema_version'") == [("3",)]
    wrong = [sid for sid, messages in histories.items()
             if [seq for seq, _ in rows.get(sid, [])] != list(range(len(messages)))
             or canon([m for _, m in rows.get(sid, [])]) != canon(messages)]
    assert not wrong, f"{len(wrong)} histories not moved exactly once, e.g. {wrong[:3]}"
    failed = {n: r for n, r in results.items() if not isinstance(r, Server)}
    assert len(failed) == 1, "instances that did not start: " + "\n".join(str(r)[:300] for r in failed.values())
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

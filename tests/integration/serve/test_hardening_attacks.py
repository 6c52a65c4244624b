"""An attacker's review of the hardening of issue 10, against real server processes.

Each test is one way in or one way down that was found by trying it, and says what should
happen instead. Tests that fail today are marked ``xfail(strict=True)`` with the reason.

Most tests share one small server (four request threads, a 3 s read timeout, the agent of
``tests.hardening_agents``); the ones that stop their server or need other options start
their own. Loopback only.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import unicodedata
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import requests

from tests.conftest import ROOT, Server, server_env, server_factory, wait_until
from tests.integration.serve.test_slow_clients import trickling

AGENT = "tests.hardening_agents:agent"
READ_TIMEOUT = 3.0
KEY = "k-" + uuid.uuid4().hex
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with server_factory(tmp_path_factory.mktemp("attacks")) as start:
        yield start(AGENT, "--workers", "2", "--threads", "4", "--read-timeout", str(READ_TIMEOUT), "--shutdown-timeout", "1")


@pytest.fixture(scope="module")
def behind_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The production recipe of the README: bound to loopback behind a reverse proxy that
    passes its public Host on (--allowed-host), with a key from the environment."""
    with server_factory(tmp_path_factory.mktemp("proxy")) as start:
        server = start(AGENT, "--workers", "1", "--allowed-host", "motus.example.com", "--shutdown-timeout", "1", env={"MOTUS_API_KEY": KEY})
        yield server.with_headers({"Authorization": f"Bearer {KEY}"})


# -- helpers -------------------------------------------------------------------------------


def port_of(server: Server) -> int:
    return int(server.url.rsplit(":", 1)[1])


def serving_pid(server: Server) -> int:
    """The gunicorn worker that serves requests (not the forkserver or resource tracker)."""
    children = psutil.Process(server.process.pid).children()
    return next(c.pid for c in children if "forkserver" not in " ".join(c.cmdline()) and "resource_tracker" not in " ".join(c.cmdline()))


def memory_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field}")


def settled_rss(pid: int, timeout: float = 5.0) -> int:
    """VmRSS once it has stopped moving (three equal readings in a row), in KiB: the server
    has finished what the last answered request left it to do (queueing a webhook, freeing)."""
    readings: list[int] = []

    def settled() -> bool:
        readings.append(memory_kib(pid, "VmRSS"))
        return len(readings) >= 3 and len(set(readings[-3:])) == 1

    wait_until(settled, timeout=timeout, interval=0.05, what="the server's memory to settle")
    return readings[-1]


def reset_peak(pid: int) -> int:
    """Reset VmHWM to what is resident now; return it (KiB)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return memory_kib(pid, "VmHWM")


def health_seconds(server: Server, timeout: float) -> float:
    """How long a fresh connection waits for ``GET /health`` (``inf`` if not answered in ``timeout``)."""
    started = time.monotonic()
    try:
        response = requests.get(server.url + "/health", timeout=timeout)
    except requests.RequestException:
        return float("inf")
    assert response.status_code == 200, response.text
    return time.monotonic() - started


def wait_idle(server: Server, session_id: str, timeout: float = 15.0) -> dict:
    def idle() -> dict | None:
        body = server.get(f"/sessions/{session_id}").json()
        return body if body["status"] != "running" else None

    return wait_until(idle, timeout=timeout, interval=0.02, what=f"session {session_id} to finish its turn")  # type: ignore[return-value]


def raw_exchange(server: Server, data: bytes, timeout: float = 10.0) -> bytes:
    """Send ``data`` on a new connection and read until the server closes it."""
    with socket.create_connection(("127.0.0.1", port_of(server)), timeout=timeout) as sock:
        sock.sendall(data)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except OSError:
            pass
    return received


class Blackhole:
    """A loopback port that accepts connections (in the kernel's backlog) and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1000)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"

    def close(self) -> None:
        self.sock.close()  # pending connections are reset: deliveries fail at once


# -- slow readers: the answer, not the request ------------------------------------------------


@pytest.mark.xfail(strict=True, reason="responses are written with blocking sendall and no timeout: a client that never reads holds a request thread for ever, and SIGTERM waits --shutdown-timeout + 15 s")
def test_clients_that_never_read_their_answers_hold_no_thread_and_do_not_delay_sigterm(start_server) -> None:
    """Pipelined requests for a 44 KB asset (public, so no key is needed even on a keyed
    server) on connections that never read: every request thread blocks for ever in
    ``sendall`` once the socket buffers are full. Nobody else is answered, and SIGTERM waits
    for gunicorn's graceful timeout (--shutdown-timeout + 15 s)."""
    server = start_server(AGENT, "--workers", "1", "--threads", "4", "--shutdown-timeout", "1", "--read-timeout", "1", "--api-key", KEY)
    request = b"GET /ui/app.js HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" * 150
    attackers = []
    try:
        for _ in range(8):
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", port_of(server)))
            sock.sendall(request)
            attackers.append(sock)
        time.sleep(2.5)  # the answers fill the socket buffers; more than --read-timeout passes
        answered_in = health_seconds(server, timeout=1.5)
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(4)
        except subprocess.TimeoutExpired:
            pass
        stopped_in = time.monotonic() - started if server.process.poll() is not None else float("inf")
    finally:
        for sock in attackers:
            sock.close()
    server.process.wait(60)
    assert answered_in < 1.0, f"GET /health took {answered_in:.1f} s while 8 clients did not read their answers"
    assert stopped_in < 4.0, "SIGTERM did not stop the server within 4 s while clients did not read their answers"


# -- slow requests that the main loop hands to a thread early ---------------------------------

HEAD = b"POST /sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
#: A valid chunked body whose first chunk is "\n": the reader takes "\n\r\n" for the end of
#: the body and hands the request to a thread, which then waits for the rest.
CHUNK_OF_NEWLINE = (HEAD + b"Transfer-Encoding: chunked\r\n\r\n1\r\n\n\r\n", b"1\r\n \r\n")
#: A head the reader leaves to gunicorn (a list of codings) that gunicorn accepts.
CODING_LIST = (HEAD + b"Transfer-Encoding: identity, chunked\r\n\r\n", b"1\r\n \r\n")
#: Expect on HTTP/1.0: left to gunicorn too, with a body that trickles.
EXPECT_ON_HTTP10 = (HEAD.replace(b"HTTP/1.1", b"HTTP/1.0") + b"Expect: 100-continue\r\nContent-Length: 1000\r\n\r\n{", b" ")


@pytest.mark.xfail(strict=True, reason="requests the main loop hands over early (unusual head, chunk ending in a newline) are read by a thread for up to --read-timeout: slowloris again")
def test_slow_requests_with_unusual_heads_hold_no_thread(plain: Server) -> None:
    """The main loop reads a request until it is complete, except when the head is unusual
    or a chunked body seems to end: then a thread reads the rest, for up to --read-timeout.
    24 such trickling connections (reconnecting when dropped) on 4 threads delay every other
    request by about the read timeout, as slowloris did before."""
    kinds = {"newline chunk": (CHUNK_OF_NEWLINE, 8), "coding list": (CODING_LIST, 8), "expect on 1.0": (EXPECT_ON_HTTP10, 8)}
    timings: list[float] = []
    with trickling(plain, kinds, reconnect=True):
        # Sample through two rounds of drops and reconnections (stop at the first slow answer).
        deadline = time.monotonic() + 2 * READ_TIMEOUT
        while time.monotonic() < deadline and (not timings or timings[-1] < 1.0):
            timings.append(health_seconds(plain, timeout=10))
            time.sleep(0.2)
    assert max(timings) < 1.0, f"GET /health took {[round(t, 2) for t in timings]} s under the attack"


@pytest.mark.xfail(strict=True, reason="unfinished heads are buffered up to 1 MiB each and are not counted against MAX_BUFFERED_TOTAL")
def test_partial_heads_are_held_to_the_buffer_limit(plain: Server) -> None:
    """Heads that never end are buffered up to 1 MiB each in the main loop, and
    MAX_BUFFERED_TOTAL (64 MiB) counts only requests whose head has ended: such connections
    (the limit is 1,000) make the serving process hold about 1 MiB each (240 connections:
    about 240 MiB, not 64). A head past
    gunicorn's own limits (8 KiB lines, 100 fields) can never be served anyway."""
    pid = serving_pid(plain)
    before = reset_peak(pid)
    head = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 1_000_000
    socks = []
    try:
        for _ in range(240):
            sock = socket.create_connection(("127.0.0.1", port_of(plain)), timeout=10)
            sock.sendall(head)
            socks.append(sock)
        # Until the server has read what was sent (its peak stops growing), before the
        # read timeout drops the connections.
        deadline, last, still = time.monotonic() + READ_TIMEOUT - 0.5, -1, 0
        while time.monotonic() < deadline and still < 6:
            peak = memory_kib(pid, "VmHWM")
            still, last = (still + 1 if peak == last else 0), peak
            time.sleep(0.05)
        grew = memory_kib(pid, "VmHWM") - before
    finally:
        for sock in socks:
            sock.close()
    assert grew <= 100 * 1024, f"the serving process grew by {grew // 1024} MiB for 240 unfinished heads"


# -- memory: bodies within every limit --------------------------------------------------------


def _many_keys() -> tuple[str, bytes]:
    keys = b",".join(b'"%x":0' % index for index in range(600_000))
    return "/messages", b'{"content":"echo x","user_params":{' + keys + b"}}"


def _tiny_messages() -> tuple[str, bytes]:
    return "/sessions", json.dumps({"state": [{"content": ""}] * 10_000}).encode()


@pytest.mark.xfail(strict=True, reason="only objects and arrays are pre-counted: many short keys or tiny messages cost 25-60x their size at peak")
@pytest.mark.parametrize("make", [_many_keys, _tiny_messages], ids=["object-of-600k-keys", "state-of-10k-tiny-messages"])
def test_an_accepted_body_costs_at_most_20_times_its_size(start_server, make) -> None:
    """The containers count stops bodies of many tiny objects and arrays, not many tiny
    keys or numbers, and the 10,000 messages of a state cost about 60 times their 160 KB.
    (A fresh server: memory freed by other tests would be reused unseen.)"""
    plain = start_server(AGENT, "--workers", "1")
    pid = serving_pid(plain)
    path, body = make()
    if path == "/messages":
        session_id = plain.create_session()
        path = f"/sessions/{session_id}/messages"
    else:
        session_id = None
    time.sleep(0.2)
    before = reset_peak(pid)
    response = requests.post(plain.url + path, data=body, headers=JSON, timeout=60)
    assert response.status_code in (201, 202), response.text[:300]
    if session_id:
        wait_idle(plain, session_id)
    grew = (memory_kib(pid, "VmHWM") - before) * 1024
    assert grew <= 20 * len(body), f"peak grew by {grew / 2**20:.1f} MiB ({grew / len(body):.0f}x) for a {len(body) / 2**20:.2f} MiB body"


def test_queued_webhooks_do_not_each_keep_a_copy_of_the_history(start_server) -> None:
    """Every turn that ends with a webhook queues a TurnEnd holding ``list(new_state)``, the
    whole history as the worker sent it back (new objects each turn), even without
    include_messages. Behind a slow endpoint they queue (one session's deliveries are in
    order): ten ~100-byte messages keep ten copies of a 160 KB history (~3 MiB each). The
    queue holds up to 1,000: gigabytes for one session with a larger history."""
    plain = start_server(AGENT, "--workers", "1", "--shutdown-timeout", "1")
    pid = serving_pid(plain)
    created = requests.post(plain.url + "/sessions", data=_tiny_messages()[1], headers=JSON, timeout=60)
    assert created.status_code == 201, created.text
    session_id = created.json()["session_id"]
    hole = Blackhole()
    try:
        plain.send(session_id, "echo first", webhook={"url": hole.url})  # this one holds the delivery thread
        wait_idle(plain, session_id)
        before = settled_rss(pid)
        sent = 0
        for index in range(10):
            response = plain.send(session_id, f"echo {index}", webhook={"url": hole.url})
            sent += len(response.request.body or b"")
            wait_idle(plain, session_id)
        grew = (settled_rss(pid) - before) * 1024
    finally:
        hole.close()
        plain.delete(f"/sessions/{session_id}")
    assert grew < 15 * 2**20, f"ten queued webhooks ({sent} bytes of requests) kept {grew / 2**20:.0f} MiB"


# -- bodies that gunicorn cannot parse --------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [b"zz\r\n{}\r\n0\r\n\r\n", b"1\r\n{}\r\n0\r\n\r\n", b"2;\x00\r\n{}\r\n0\r\n\r\n", b"2\r\n{}\r\n0\r\nX\r\n\r\n"],
    ids=["bad-size", "chunk-longer-than-its-size", "bad-extension", "bad-trailer"],
)
def test_a_malformed_chunked_body_is_a_400_not_a_500(plain: Server, body: bytes) -> None:
    """gunicorn's chunk parser raises (InvalidChunkSize, ChunkMissingTerminator, NoMoreData
    for a client that hangs up mid-body...) straight through ``_read_body``: the app logs an
    "unexpected error" with a traceback and answers 500, for anyone who sends a bad chunk."""
    logged = len(plain.log())
    head = HEAD + b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    answer = raw_exchange(plain, head + body)  # an error is logged before its answer is sent
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    assert "unexpected error" not in plain.log()[logged:], plain.log()[logged:][:2000]


# -- Host names --------------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["[::1].evil.example", "[::1]evil.example:80", "[::1"])
def test_a_host_that_only_starts_with_a_bracketed_loopback_address_is_refused(plain: Server, host: str) -> None:
    """``split_host`` keeps ``[...]`` and drops whatever follows the bracket, so these
    non-loopback (or malformed) names pass the DNS-rebinding check. No browser sends
    them today, but the check should not depend on that."""
    response = requests.get(plain.url + "/sessions", headers={"Host": host}, timeout=10)
    assert response.status_code == 400, (response.status_code, response.text[:200])


# -- webhooks ----------------------------------------------------------------------------------


def test_the_readme_proxy_setup_does_not_let_webhooks_into_loopback(behind_proxy: Server) -> None:
    """The README's production setup binds motus to loopback behind a reverse proxy (and
    names the public host with --allowed-host). Exposure is judged from the bind address
    only, so in exactly that setup any API client can make the server POST to loopback and
    private services. With --allowed-host given, the server is reachable from elsewhere:
    loopback and private webhooks should need --webhook-allow, as on an exposed bind."""
    receiver = socket.socket()
    receiver.bind(("127.0.0.1", 0))
    receiver.listen(5)
    receiver.settimeout(3.0)
    try:
        session_id = behind_proxy.create_session()
        url = f"http://127.0.0.1:{receiver.getsockname()[1]}/internal/admin"
        behind_proxy.send(session_id, "echo x", webhook={"url": url})
        try:
            conn, _ = receiver.accept()
        except socket.timeout:
            reached = b""
        else:
            with conn:
                conn.settimeout(3)
                reached = conn.recv(200)
                conn.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")
    finally:
        receiver.close()
    assert not reached, f"the webhook reached a loopback service: {reached[:80]!r}"


def test_a_secret_in_a_webhook_path_stays_out_of_the_log(plain: Server) -> None:
    """Slack, Discord and Teams webhooks carry their secret in the path
    (``/services/T000/B000/<secret>``); the log shows ``scheme://host:port/path`` whole."""
    secret = "XyZ" + uuid.uuid4().hex
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # nothing listens there: the delivery fails and is logged
    session_id = plain.create_session()
    plain.send(session_id, "echo x", webhook={"url": f"http://127.0.0.1:{port}/services/T000/B000/{secret}"})
    wait_until(lambda: f"webhook for session {session_id}" in plain.log(), timeout=10, what="the failed delivery to be logged")
    plain.delete(f"/sessions/{session_id}")
    assert secret not in plain.log()


# -- keys --------------------------------------------------------------------------------------


def test_an_agent_cannot_read_the_api_key_from_its_parents(behind_proxy: Server) -> None:
    """MOTUS_API_KEY is popped from os.environ before the forkserver starts, but the
    gunicorn worker and arbiter keep it in their /proc/<pid>/environ (the block the process
    was started with), which any agent of the same user can read: the agent finds it two
    and three parents up."""
    session_id = behind_proxy.create_session()
    behind_proxy.send(session_id, "hunt")
    body = wait_idle(behind_proxy, session_id)
    found = body["response"]["content"]
    assert KEY not in found, found


# -- terminal ------------------------------------------------------------------------------------


def test_invisible_format_characters_are_shown_escaped_by_the_client_commands(plain: Server) -> None:
    """``visible`` escapes C0/C1 controls and the bidi controls, not the other invisible
    format characters (Cf: zero-width space, word joiner, byte order mark, soft hyphen,
    the tag characters U+E0000-E007F). An argument shown as ``notes.txt`` can then carry
    text the person approving it cannot see (here "rm -rf ~" spelled in tag characters).
    The web chat marks the same set, so it shows them raw too."""
    session_id = plain.create_session()
    plain.send(session_id, "hidden")
    wait_idle(plain, session_id)
    proc = subprocess.run(
        [sys.executable, "-m", "motus", "serve", "get", plain.url, session_id],
        capture_output=True, text=True, encoding="utf-8", cwd=ROOT, env=server_env(), timeout=60,
    )
    plain.delete(f"/sessions/{session_id}")
    assert proc.returncode == 0, proc.stderr
    assert "tool_approval" in proc.stdout, proc.stdout
    raw = sorted({f"U+{ord(c):04X}" for c in proc.stdout if unicodedata.category(c) == "Cf"})
    assert not raw, f"printed raw: {raw}"

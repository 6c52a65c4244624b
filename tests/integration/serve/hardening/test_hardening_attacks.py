"""An attacker's review of the hardening of issue 10, against real server processes.

Each test is one way in or one way down that was found by trying it, and says what should
happen instead (and, where it was measured, what it cost before the fix).

Most tests share one small server (four request threads, a 3 s read timeout, the agent of
``tests.agents.hardening``); the ones that stop their server or need other options start
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

from motus.serve.jsonshape import JSON_BYTES_PER_VALUE, MAX_JSON_VALUES_FREE, values_allowed, values_upper_bound
from tests.conftest import ROOT, Server, server_env, server_factory, wait_until
from tests.integration.serve.hardening.test_slow_clients import trickling

AGENT = "tests.agents.hardening:agent"
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


def server_sockets(port: int) -> dict[int, tuple[str, int]]:
    """The server's TCP connections on ``port`` (from /proc/net/tcp), by the client's port:
    their state ("01" is established) and how many bytes wait in their send queue."""
    found = {}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, state, queues = fields[1], fields[2], fields[3], fields[4]
        if int(local.rsplit(":", 1)[1], 16) == port and state != "0A":  # 0A: the listening socket
            found[int(remote.rsplit(":", 1)[1], 16)] = (state, int(queues.split(":")[0], 16))
    return found


def never_reading(port: int, request: bytes, count: int, opened: list[socket.socket]) -> set[int]:
    """Open ``count`` connections with a 4 KiB receive buffer (added to ``opened``, for the
    caller to close), each sending ``request`` and then never reading; their local ports."""
    for _ in range(count):
        sock = socket.socket()
        opened.append(sock)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(10)
        sock.connect(("127.0.0.1", port))
        sock.sendall(request)
    return {sock.getsockname()[1] for sock in opened}


def test_clients_that_never_read_their_answers_hold_no_thread_and_do_not_delay_sigterm(start_server) -> None:
    """Connections that pipeline requests for a public asset (no key needed even on a keyed
    server) and never read: once their socket buffers are full, gunicorn's threads blocked
    for ever in ``sendall`` (in ``sendfile`` for a file), so with as many such connections
    as threads nobody else was answered, and SIGTERM waited for gunicorn's graceful timeout
    (--shutdown-timeout + 15 s). Now the main loop holds what the socket does not take and
    closes the connection when the client has not taken it within --read-timeout."""
    server = start_server(AGENT, "--workers", "1", "--threads", "4", "--shutdown-timeout", "1", "--read-timeout", "2", "--api-key", KEY)
    port = port_of(server)
    asset = requests.get(server.url + "/ui/app.js", timeout=10)
    assert asset.status_code == 200, asset.status_code
    count = -(-8 * 2**20 // len(asset.content))  # 8 MiB of answers: more than any socket buffers
    request = b"GET /ui/app.js HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" * count
    attackers: list[socket.socket] = []
    try:
        peers = never_reading(port, request, 8, attackers)

        def stuck() -> bool:  # the server is sending to as many of them as it has threads
            return sum(1 for peer, (_, queued) in server_sockets(port).items() if peer in peers and queued) >= 4

        wait_until(stuck, timeout=20, what="answers to pile up on the connections that do not read")
        answered_in = health_seconds(server, timeout=10)

        def dropped() -> bool:
            return not any(peer in peers and state == "01" for peer, (state, _) in server_sockets(port).items())

        wait_until(dropped, timeout=20, what="the server to close the connections that do not read their answers")
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(30)
        except subprocess.TimeoutExpired:
            pass
        stopped_in = time.monotonic() - started if server.process.poll() is not None else float("inf")
    finally:
        for sock in attackers:
            sock.close()
    server.process.wait(60)
    assert answered_in < 10, "GET /health was not answered while 8 clients did not read their answers"
    # gunicorn's graceful timeout is --shutdown-timeout + 15 = 16 s: well within it.
    assert stopped_in < 8, f"SIGTERM took {stopped_in:.1f} s to stop the server after clients did not read their answers"
    assert "Traceback" not in server.log()


def test_a_sigterm_while_large_answers_go_to_clients_that_never_read_stops_cleanly(start_server) -> None:
    """Thirty clients ask for a session whose body is ~6 MB and never read: the main loop
    holds what fits in the worker's 64 MiB and threads write the rest themselves. A client
    has --read-timeout (30 s here) plus a second per 256 KiB to take its answer, so before,
    a SIGTERM meanwhile waited on them past gunicorn's graceful timeout (--shutdown-timeout
    + 15 s) and the arbiter killed the worker (found by the attack on the broadcast's
    copies). Now answers still being written get two seconds after the SIGTERM: the worker
    closes those connections and exits by itself, with status 0."""
    server = start_server(AGENT, "--workers", "1", "--threads", "4", "--shutdown-timeout", "1", "--read-timeout", "30")
    port = port_of(server)
    session_id = server.create_session()
    server.send(session_id, "echo " + "z" * 3_000_000)
    assert wait_idle(server, session_id)["status"] == "idle"
    request = f"GET /sessions/{session_id} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode()
    readers: list[socket.socket] = []
    try:
        peers = never_reading(port, request, 30, readers)

        def piled_up() -> bool:  # answers wait in the server's send queues (held or written by threads)
            return sum(1 for peer, (_, queued) in server_sockets(port).items() if peer in peers and queued) >= 12

        wait_until(piled_up, timeout=30, what="answers to pile up on the connections that do not read")
        server.process.send_signal(signal.SIGTERM)
        status = server.process.wait(60)
    finally:
        for sock in readers:
            sock.close()
    log = server.log()
    assert "SIGKILL" not in log, log[-2000:]
    assert status == 0, log[-2000:]
    assert "did not take its answer in time" in log, log[-2000:]
    assert "Traceback" not in log


# -- slow requests that the main loop hands to a thread early ---------------------------------

HEAD = b"POST /sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
#: A valid chunked body whose first chunk is "\n": the reader used to take "\n\r\n" for the end
#: of the body and hand the request to a thread, which then waited for the rest.
CHUNK_OF_NEWLINE = (HEAD + b"Transfer-Encoding: chunked\r\n\r\n1\r\n\n\r\n", b"1\r\n \r\n")
#: A list of codings, which the reader used to leave to gunicorn (which accepts it).
CODING_LIST = (HEAD + b"Transfer-Encoding: identity, chunked\r\n\r\n", b"1\r\n \r\n")
#: Expect on HTTP/1.0 (an expectation to ignore): left to gunicorn too, with a body that trickles.
EXPECT_ON_HTTP10 = (HEAD.replace(b"HTTP/1.1", b"HTTP/1.0") + b"Expect: 100-continue\r\nContent-Length: 1000\r\n\r\n{", b" ")


def test_slow_requests_with_unusual_heads_hold_no_thread(plain: Server) -> None:
    """Requests the main loop used to hand to a thread before they were complete (an
    unusual head, a chunk that seemed to end the body) were read by that thread for up to
    --read-timeout: 24 such trickling connections on 4 threads kept everyone else waiting
    that long, as slowloris did. Now every request is read whole by the main loop, so a
    health check is answered while they are all still held, and each gets its 408."""
    kinds = {"newline chunk": (CHUNK_OF_NEWLINE, 8), "coding list": (CODING_LIST, 8), "expect on 1.0": (EXPECT_ON_HTTP10, 8)}
    with trickling(plain, kinds) as attack:
        first_drop = min(conn.opened for conn in attack.live) + READ_TIMEOUT  # none goes earlier
        answered_in = health_seconds(plain, timeout=2 * READ_TIMEOUT)
        answered_at = time.monotonic()
        wait_until(lambda: attack.dropped_count() >= 24, timeout=READ_TIMEOUT + 10, what="every slow request to be dropped")
    assert answered_in < 2 * READ_TIMEOUT, "GET /health was not answered under the attack"
    assert answered_at < first_drop, f"GET /health ({answered_in:.2f} s) was answered only once slow requests were dropped"
    late = [(conn.kind, round(conn.closed - conn.opened, 2)) for conn in attack.dropped if conn.closed - conn.opened > READ_TIMEOUT + 2]
    assert not late, f"closed late: {late}"
    answers = {conn.kind: conn.received[:40] for conn in attack.dropped if not conn.received.startswith(b"HTTP/1.1 408 ")}
    assert not answers, f"not answered 408: {answers}"


def test_partial_heads_are_held_to_the_buffer_limit(plain: Server) -> None:
    """Heads that never end were buffered up to 1 MiB each in the main loop, and
    MAX_BUFFERED_TOTAL (64 MiB) counted only requests whose head had ended: 240 such
    connections made the serving process grow by 212 MiB. A head is now held to 64 KiB
    (431 past it, before gunicorn's own limits of 8 KiB lines and 100 fields could refuse
    it anyway) and counted in the total."""
    pid = serving_pid(plain)
    before = reset_peak(pid)
    head = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 1_000_000
    socks = []
    answers: list[bytes] = []
    try:
        for _ in range(240):
            sock = socket.create_connection(("127.0.0.1", port_of(plain)), timeout=10)
            socks.append(sock)
            try:
                sock.sendall(head)
            except OSError:
                pass  # refused and closed before the client had sent it all
        for sock in socks:  # each is answered (or reset, having sent more than is drained)
            received = b""
            try:
                while b"\r\n" not in received and (chunk := sock.recv(4096)):
                    received += chunk
            except OSError:
                pass
            answers.append(received)
        grew = memory_kib(pid, "VmHWM") - before
    finally:
        for sock in socks:
            sock.close()
    assert grew <= 100 * 1024, f"the serving process grew by {grew // 1024} MiB for 240 unfinished heads"
    assert all(answer.startswith(b"HTTP/1.1 431 ") for answer in answers if answer), {answer[:40] for answer in answers}
    assert sum(1 for answer in answers if answer) >= len(answers) // 2, "most clients should see their 431"


# -- memory: bodies within every limit --------------------------------------------------------


def _short_keys(count: int, key_length: int) -> bytes:
    keys = b",".join(b'"%0*x":0' % (key_length, index) for index in range(count))
    return b'{"content":"echo x","user_params":{' + keys + b"}}"


def _dense_keys_at_the_limit() -> tuple[str, bytes]:
    """The most values the body's size allows (jsonshape), in about 8 MiB of 27-byte members."""
    member = 22 + 5
    count = int(MAX_JSON_VALUES_FREE / (1 - member / JSON_BYTES_PER_VALUE))
    while values_upper_bound(body := _short_keys(count, 22)) > values_allowed(len(body)):
        count -= 50
    assert values_upper_bound(body) > 0.99 * values_allowed(len(body)) and len(body) > 6 * 2**20
    return "/messages", body


def _tiny_messages() -> tuple[str, bytes]:
    return "/sessions", json.dumps({"state": [{"content": ""}] * 10_000}).encode()


@pytest.mark.parametrize("make", [_dense_keys_at_the_limit, _tiny_messages], ids=["object-of-dense-keys-at-the-limit", "state-of-10k-tiny-messages"])
def test_an_accepted_body_costs_at_most_20_times_its_size(start_server, make) -> None:
    """The containers count stopped bodies of many tiny objects and arrays, not many short
    keys or numbers (an object of 600k short keys cost 35 times its 5.7 MiB), and the
    10,000 messages of a state cost 59 times their 160 KB (a model each, all at once).
    (A fresh server, warmed up by one small request of the same kind: memory freed by other
    tests would be reused unseen, and a first request pays for code paths it loads.)"""
    plain = start_server(AGENT, "--workers", "1")
    pid = serving_pid(plain)
    path, body = make()
    if path == "/messages":
        session_id = plain.create_session()
        path = f"/sessions/{session_id}/messages"
        warm_up = requests.post(plain.url + path, data=_short_keys(10, 22), headers=JSON, timeout=60)
        assert warm_up.status_code == 202, warm_up.text
        wait_idle(plain, session_id)
    else:
        session_id = None
        warm_up = requests.post(plain.url + path, data=json.dumps({"state": [{"content": ""}] * 10}), headers=JSON, timeout=60)
        assert warm_up.status_code == 201, warm_up.text
    settled_rss(pid)
    before = reset_peak(pid)
    file_before = memory_kib(pid, "RssFile")
    response = requests.post(plain.url + path, data=body, headers=JSON, timeout=60)
    assert response.status_code in (201, 202), response.text[:300]
    # The peak counts pages of code and libraries too: on a busy machine the kernel may have
    # dropped some of the server's from memory, which this request then reads in again. What
    # the body costs is the rest (file-backed pages read in are counted out). Measured up to
    # the answer: the turn the message starts is the agent's cost, not the body's (its result
    # carries the message back, a second copy of its 600k keys, at a moment that varies).
    code_read_in = max(0, memory_kib(pid, "RssFile") - file_before)
    grew = (memory_kib(pid, "VmHWM") - before - code_read_in) * 1024
    if session_id:
        wait_idle(plain, session_id)
    assert grew <= 20 * len(body), f"peak grew by {grew / 2**20:.1f} MiB ({grew / len(body):.0f}x) for a {len(body) / 2**20:.2f} MiB body"


def test_a_body_of_more_values_than_its_size_allows_is_refused_before_it_is_parsed(start_server) -> None:
    """An object of 600,000 short keys (5.7 MiB; 35 times that at peak once accepted) holds
    more values than 50,000 plus one per 32 bytes: refused with a 400 naming the limit,
    before it is parsed, at the cost of a few copies of its bytes."""
    plain = start_server(AGENT, "--workers", "1")
    pid = serving_pid(plain)
    session_id = plain.create_session()
    body = _short_keys(600_000, 0)
    settled_rss(pid)
    before = reset_peak(pid)
    response = requests.post(plain.url + f"/sessions/{session_id}/messages", data=body, headers=JSON, timeout=60)
    grew = (memory_kib(pid, "VmHWM") - before) * 1024
    assert response.status_code == 400, response.text[:300]
    assert "too many JSON values" in response.json()["detail"] and f"per {JSON_BYTES_PER_VALUE} bytes" in response.json()["detail"], response.text
    assert grew <= 6 * len(body), f"peak grew by {grew / 2**20:.1f} MiB ({grew / len(body):.0f}x) for a refused {len(body) / 2**20:.2f} MiB body"
    assert plain.get(f"/sessions/{session_id}").json()["status"] == "idle"


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
        # The literal address is refused when posted; a name for it, at delivery.
        literal = behind_proxy.post(f"/sessions/{session_id}/messages", json={"content": "echo x", "webhook": {"url": url}})
        assert literal.status_code == 400 and "127.0.0.1 is a loopback address" in literal.json()["detail"], literal.text
        behind_proxy.send(session_id, "echo x", webhook={"url": url.replace("127.0.0.1", "localhost")})
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

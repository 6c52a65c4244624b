"""Webhooks against a real ``motus serve`` process: bad URLs refused when posted, no
redirects, bounded responses, one slow endpoint delaying only its own session, and no way in
to link-local, metadata, loopback or private addresses where those are refused.

The endpoints are ``Receiver`` (tests/unit/serve/test_webhooks.py): raw HTTP on 127.0.0.1, the
path picking the answer, every connection recorded.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.conftest import Server, server_factory, wait_until
from tests.unit.serve.test_webhooks import Receiver


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with server_factory(tmp_path_factory.mktemp("webhooks")) as start:
        yield start("tests.agents:dispatch", "--workers", "4")


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    receiver = Receiver()
    yield receiver
    receiver.close()


def in_log(server: Server, needle: str, timeout: float = 15) -> None:
    wait_until(lambda: needle in server.log(), timeout=timeout, what=f"{needle!r} in the server log")


def turn_with_webhook(server: Server, url: str, content: str = "echo hi", **webhook: object) -> str:
    session_id = server.create_session()
    server.send(session_id, content, webhook={"url": url, **webhook})
    return session_id


# -- checked when posted ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("http://a..b/", "has a host 'a..b' that is not well-formed: it has an empty label"),
        ("http://exa mple.com/", "contains whitespace"),
        ("http://example.com/\u0000", "control or invisible character"),
        ("http://example.com/\r\nX-Evil: 1", "contains whitespace"),
        ("gopher://example.com/", "must be an http:// or https:// URL"),
        ("http:///nohost", "has no host"),
        ("http://example.com:99999/", "port '99999'"),
        ("http://999.1.1.1/", "not a valid one"),
        ("http://example.com/" + "a" * 3000, "the limit is 2048"),
    ],
)
def test_a_bad_webhook_url_is_refused_naming_the_problem(server: Server, receiver: Receiver, url: str, needle: str) -> None:
    session_id = server.create_session()
    refused = server.post(f"/sessions/{session_id}/messages", json={"content": "echo hi", "webhook": {"url": url}})
    # A webhook that may not be called is a 400 naming why (other schema errors are 422).
    assert refused.status_code == 400, refused.text
    detail = refused.json()["detail"]
    assert "webhook.url" in detail and needle in detail, detail
    assert server.get(f"/sessions/{session_id}").json()["status"] == "idle"
    assert server.get(f"/sessions/{session_id}/messages").json() == []
    # ...and webhooks of other sessions still arrive.
    other = turn_with_webhook(server, receiver.url("/after"))
    receiver.wait_for(lambda r: r.paths() == ["/after"], what="the next session's webhook")
    assert receiver.requests[0].body and other in receiver.requests[0].body.decode()


def test_a_token_that_would_break_the_header_is_refused(server: Server) -> None:
    session_id = server.create_session()
    refused = server.post(
        f"/sessions/{session_id}/messages", json={"content": "x", "webhook": {"url": "http://example.com/", "token": "a\r\nX-Evil: 1"}}
    )
    assert refused.status_code == 400 and "webhook.token" in refused.json()["detail"], refused.text


# -- delivery -----------------------------------------------------------------------------------


def test_redirects_are_not_followed(server: Server, receiver: Receiver) -> None:
    session_id = turn_with_webhook(server, receiver.url("/redirect"))
    in_log(server, f"webhook for session {session_id} to http://127.0.0.1:{receiver.port}/... answered HTTP 302 (redirects are not followed)")
    assert receiver.paths() == ["/redirect"]
    assert server.get(f"/sessions/{session_id}").json()["status"] == "idle"


def test_slow_and_huge_endpoints_delay_only_their_own_sessions(server: Server, receiver: Receiver) -> None:
    dripping = turn_with_webhook(server, receiver.url("/drip-head"))
    huge = turn_with_webhook(server, receiver.url("/huge"))
    receiver.wait_for(lambda r: {"/drip-head", "/huge"} <= set(r.paths()), what="both slow deliveries to start")
    # The huge body is cut off at 64 KiB, at once.
    in_log(server, f"webhook for session {huge} to http://127.0.0.1:{receiver.port}/...: response cut off after 65536 bytes", timeout=5)
    receiver.wait_for(lambda r: "/huge" in r.ended, timeout=5, what="the huge endpoint to see the server go")
    # Another session's webhook arrives at once, while the first endpoint is still dripping.
    fast = turn_with_webhook(server, receiver.url("/fast"))
    server.wait_for_status(fast, "idle")  # the turn has ended: its webhook is on its way
    ended_at = time.monotonic()
    receiver.wait_for(lambda r: "/fast" in r.paths(), timeout=5, what="the other session's webhook")
    assert time.monotonic() - ended_at < 3
    assert "/drip-head" not in receiver.ended, "the dripping endpoint was cut off too early"
    assert fast in receiver.requests[-1].body.decode()
    assert server.get(f"/sessions/{dripping}").json()["status"] == "idle"


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://169.254.169.254/latest/meta-data/iam/security-credentials/", "169.254.169.254 is a link-local address, refused always"),
        ("http://[fd00:ec2::254]/latest/", "fd00:ec2::254 is a cloud metadata address, refused always"),
        ("http://0.0.0.0:8080/", "0.0.0.0 is a 'this network' address (0.0.0.0/8), refused always"),
        ("http://[::ffff:169.254.169.254]/", "is a link-local address, refused always (as 169.254.169.254, embedded in ::ffff:a9fe:a9fe)"),
    ],
)
def test_a_webhook_to_a_literal_address_never_reachable_is_refused_when_posted(server: Server, receiver: Receiver, url: str, why: str) -> None:
    """A literal address the policy always refuses could never be delivered to: a 400 naming
    the rule when the message is posted, not a 202 and a refusal in a log line the client
    never sees at the end of the turn. Nothing changes, and nothing is connected to."""
    session_id = server.create_session()
    refused = server.post(f"/sessions/{session_id}/messages", json={"content": "echo hi", "webhook": {"url": url}})
    assert refused.status_code == 400, refused.text
    detail = refused.json()["detail"]
    assert detail.startswith("Invalid request body: webhook.url: ") and why in detail, detail
    assert detail.endswith("a webhook there could never be delivered"), detail
    assert server.get(f"/sessions/{session_id}").json()["status"] == "idle"
    assert server.get(f"/sessions/{session_id}/messages").json() == []
    # The session takes the next message, and its webhook goes out.
    server.send(session_id, "echo again", webhook={"url": receiver.url("/next")})
    receiver.wait_for(lambda r: r.paths() == ["/next"], timeout=5, what="the next webhook")
    assert not [line for line in server.log().splitlines() if "refused:" in line]


def test_credentials_query_and_token_never_reach_the_log(server: Server, receiver: Receiver) -> None:
    url = receiver.url("/status/500?sig=qu3ryS3cret").replace("http://", "http://alice:pa55w0rd@")
    session_id = turn_with_webhook(server, url, token="t0kenS3cret")
    in_log(server, f"webhook for session {session_id} to http://127.0.0.1:{receiver.port}/... answered HTTP 500")
    assert receiver.requests[0].headers["authorization"] == "Bearer t0kenS3cret"
    log = server.log()
    assert "pa55w0rd" not in log and "alice" not in log and "qu3ryS3cret" not in log and "t0kenS3cret" not in log


# -- a server bound beyond loopback -------------------------------------------------------------


def test_an_exposed_server_refuses_loopback_webhooks(start_server, receiver: Receiver) -> None:
    server = start_server("tests.agents:dispatch", "--host", "0.0.0.0")
    # A literal address: never deliverable from this server, refused when posted.
    literal = server.create_session()
    refused = server.post(f"/sessions/{literal}/messages", json={"content": "x", "webhook": {"url": receiver.url("/literal")}})
    assert refused.status_code == 400 and "webhook.url: 127.0.0.1 is a loopback address, refused because the server is bound " \
        "to a non-loopback address (allow it with --webhook-allow)" in refused.json()["detail"], refused.text
    # A name is judged at delivery, on what it resolves to then.
    named = turn_with_webhook(server, receiver.url("/named", host="localhost"))
    in_log(server, f"webhook for session {named} to http://localhost:{receiver.port}/... refused: localhost resolves to ")
    assert "--webhook-allow" in server.log()
    assert receiver.connections == 0


def test_webhook_allow_lets_a_network_through(start_server, receiver: Receiver) -> None:
    server = start_server("tests.agents:dispatch", "--host", "0.0.0.0", "--webhook-allow", "127.0.0.1/32")
    turn_with_webhook(server, receiver.url("/allowed"))
    receiver.wait_for(lambda r: r.paths() == ["/allowed"], what="the allowed webhook")


def test_webhook_allow_lets_a_host_name_through(start_server, receiver: Receiver) -> None:
    server = start_server("tests.agents:dispatch", "--host", "0.0.0.0", "--webhook-allow", "LocalHost")
    turn_with_webhook(server, receiver.url("/by-name", host="localhost"))
    receiver.wait_for(lambda r: r.paths() == ["/by-name"], what="the webhook to the allowed name")
    literal = server.create_session()  # the name is allowed, not the address
    refused = server.post(f"/sessions/{literal}/messages", json={"content": "x", "webhook": {"url": receiver.url("/literal")}})
    assert refused.status_code == 400 and "127.0.0.1 is a loopback address" in refused.json()["detail"], refused.text
    assert receiver.paths() == ["/by-name"]

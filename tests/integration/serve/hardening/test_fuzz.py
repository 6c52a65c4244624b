"""The API fuzzed from its own OpenAPI document, against a real server, with and without a key.

Schemathesis generates valid and invalid requests for every operation; each response must
match the document (status, content type, body schema), never be a 5xx, and a request the
server rejects (4xx) must leave every session exactly as it was. The agent never finishes a
turn (``hang``, one compute slot, no ``--timeout``, which would fail turns mid-run on a slow
machine), so the only thing that can change a session between two snapshots is the request
in between.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import CHECKS

from tests.conftest import Server, server_factory
from tests.support import http

KEY = "fuzz-" + uuid.uuid4().hex
READ_KEY = "fuzz-read-" + uuid.uuid4().hex
EXAMPLES = 8

# Checks that assume a stateful API or 2xx for every valid body do not apply to ids that
# (rightly) 404; everything about conformance and server errors stays on.
EXCLUDED = {"positive_data_acceptance", "missing_required_header", "ignored_auth", "use_after_free", "ensure_resource_availability", "unsupported_method"}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Server]]:
    with server_factory(tmp_path_factory.mktemp("fuzz")) as start:
        yield {
            "open": start("tests.agents:hang", "--workers", "1", "--allow-custom-ids", "--shutdown-timeout", "1", "--max-wait", "1"),
            "keyed": start("tests.agents:hang", "--workers", "1", "--allow-custom-ids", "--shutdown-timeout", "1", "--max-wait", "1", "--api-key", KEY, "--api-key", f"viewer={READ_KEY}:read"),
        }


def snapshot(server: Server, headers: dict[str, str]) -> list[tuple]:
    sessions = http.request("GET", server.url + "/sessions", headers=headers, timeout=10).json()
    return sorted((s["session_id"], s["status"], s["total_messages"]) for s in sessions)


def excluded_checks() -> list:
    return [check for check in CHECKS.get_all() if check.__name__ in EXCLUDED]


@dataclass(frozen=True)
class Caller:
    """One way of sending a generated case: to which server, with which key."""

    which: str  # "open" or "keyed"
    key: str | None  # the key sent: KEY, READ_KEY or none

    @property
    def name(self) -> str:
        return f"{self.which}{'' if self.key is None else ' with the read key' if self.key == READ_KEY else ' with the key'}"


#: Each case a mode generates is sent by each of its callers: the cases cost more CPU to
#: generate than the server takes to answer them, so one set serves every server and key.
CALLERS = {
    GenerationMode.POSITIVE: (Caller("open", None), Caller("keyed", KEY), Caller("keyed", None), Caller("keyed", READ_KEY)),
    GenerationMode.NEGATIVE: (Caller("open", None), Caller("keyed", KEY)),
}


@pytest.mark.slow
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=["valid", "invalid"])
def test_fuzz(servers: dict[str, Server], mode: GenerationMode) -> None:
    """Every case is sent to the open server, and to the keyed one with the key; a valid case
    also without a key (only ``/health`` answers, the rest is a 401) and with a read-only key
    (nothing that changes a session is let through)."""
    keyed_auth = {"Authorization": f"Bearer {KEY}"}
    # Invalid cases come from the open server's document: the keyed one's makes the key a
    # required header, and a case without it is no invalid request for the open server (nor
    # for the keyed one, once the caller adds its key). Valid ones from the keyed one's, so a
    # keyless case carries a made-up key.
    source = servers["keyed"] if mode is GenerationMode.POSITIVE else servers["open"]
    document = requests.get(source.url + "/openapi.json", headers=keyed_auth, timeout=10).json()
    schema = schemathesis.openapi.from_dict(document)
    excluded = excluded_checks()
    # A number or boolean query parameter "made invalid" as a one-item array serialises to
    # the same valid query string (timeout=5), so that check cannot judge query parameters;
    # bad query values are covered by test_hitl.py::test_bad_input.
    query_excluded = excluded + [check for check in CHECKS.get_all() if check.__name__ == "negative_data_rejection"]
    client = http.loopback_session()
    failures: list[str] = []

    def send(caller: Caller, case: schemathesis.Case, operation_query: bool) -> None:
        server = servers[caller.which]
        auth = keyed_auth if caller.which == "keyed" else {}  # what the snapshots are read with
        sent = {"Authorization": f"Bearer {caller.key}"} if caller.key else {}
        before = snapshot(server, auth)
        response = case.call(base_url=server.url, session=client, headers=sent, timeout=20)
        where = f"{caller.name}: {case.method} {case.formatted_path}"
        assert response.status_code < 500, f"{where}: {response.status_code} {response.text}"
        case.validate_response(response, excluded_checks=query_excluded if operation_query else excluded)
        if caller.which == "keyed" and caller.key is None and case.path != "/health":
            assert response.status_code == 401, f"{where}: {response.text}"
        if caller.key == READ_KEY and case.method.upper() not in ("GET", "HEAD", "OPTIONS") and response.status_code not in (400, 403, 405, 415):
            raise AssertionError(f"read-only key was let {case.method} {case.formatted_path}: {response.status_code} {response.text}")
        if 400 <= response.status_code < 500:
            assert snapshot(server, auth) == before, f"{where} changed state with {response.status_code}"

    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.path.endswith("/events"):
            continue  # a stream answers for as long as it is open: tests/integration/serve/approvals/test_workflow.py
        if mode is GenerationMode.NEGATIVE and not (len(operation.body) or len(operation.query)):
            continue  # only a string path parameter: nothing can be made schema-invalid
        for target in ("random", "existing"):
            overrides = {}
            if "{session_id}" in operation.path and target == "existing":
                sid = str(uuid.uuid4())  # one id, created on both servers (--allow-custom-ids)
                for server, auth in ((servers["open"], {}), (servers["keyed"], keyed_auth)):
                    created = client.put(f"{server.url}/sessions/{sid}", json={}, headers=auth, timeout=10)
                    assert created.status_code == 201, created.text
                overrides["path_parameters"] = {"session_id": sid}
            elif target == "existing":
                continue

            @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy(generation_mode=mode, **overrides))
            def run(case: schemathesis.Case) -> None:
                for caller in CALLERS[mode]:
                    send(caller, case, bool(len(operation.query)))

            try:
                run()
            except Exception as exc:  # collect every operation's failure, report them together
                failures.append(f"{operation.label} [{target}]: {exc}")
    assert not failures, "\n\n".join(failures)


HEADER_VALUES = {
    "Content-Type": [None, "application/json", "application/json; charset=utf-8", "application/problem+json", "text/plain",
                     "application/x-www-form-urlencoded", "multipart/form-data; boundary=b", "", "application/jsonx", "json"],
    "Host": [None, "localhost", "127.0.0.1", "[::1]:1", "evil.example", "127.0.0.1.evil.example", "", "localhost:notaport", "Ä.example"],
    "Origin": [None, "null", "http://evil.example", "http://localhost", "http://127.0.0.1", "file://", "https://localhost:1", "garbage"],
}


@pytest.mark.slow
def test_fuzz_browser_headers(servers: dict[str, Server]) -> None:
    """Content types, Host names and Origins as a web page or a rebinding attack would send
    them: never a 5xx; a refused request changes nothing; a request that passes the checks
    had to be same-site JSON."""
    from hypothesis import strategies as st

    server = servers["open"]
    port = server.url.rsplit(":", 1)[1]
    sid = requests.post(server.url + "/sessions", json={}, timeout=10).json()["session_id"]
    operations = [("post", "/sessions", b"{}"), ("post", f"/sessions/{sid}/resume", b'{"interrupt_id": "x", "value": 1}'),
                  ("get", "/sessions", None), ("delete", f"/sessions/{uuid.uuid4()}", None), ("get", "/ui/", None)]
    client = http.loopback_session()

    @settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(
        operation=st.sampled_from(operations),
        headers=st.fixed_dictionaries({name: st.sampled_from(values) for name, values in HEADER_VALUES.items()}),
    )
    def run(operation: tuple[str, str, bytes | None], headers: dict[str, str | None]) -> None:
        method, path, body = operation
        sent = {name: value.replace("PORT", port) for name, value in headers.items() if value is not None}
        sent.setdefault("Host", f"127.0.0.1:{port}")
        before = snapshot(server, {})
        response = client.request(method, server.url + path, data=body, headers=sent, timeout=20)
        assert response.status_code < 500, (method, path, sent, response.status_code, response.text)
        if 400 <= response.status_code < 500:
            assert snapshot(server, {}) == before, (method, path, sent)
        if response.status_code < 400 and method != "get":
            host = sent["Host"].split(":")[0] if not sent["Host"].startswith("[") else "[::1]"
            assert host in ("localhost", "127.0.0.1", "[::1]"), sent
            assert "Origin" not in sent or sent["Origin"].split("//")[-1].split(":")[0] == host.strip("[]"), sent
            assert sent.get("Content-Type", "").split(";")[0].strip().endswith("json") or body is None, sent

    run()

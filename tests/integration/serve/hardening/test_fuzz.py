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


@pytest.mark.slow
@pytest.mark.parametrize(
    ("which", "mode", "present_key"),
    [
        ("open", GenerationMode.POSITIVE, False),
        ("open", GenerationMode.NEGATIVE, False),
        ("keyed", GenerationMode.POSITIVE, True),
        ("keyed", GenerationMode.NEGATIVE, True),
        ("keyed", GenerationMode.POSITIVE, False),
        ("keyed", GenerationMode.POSITIVE, "read"),
    ],
    ids=["open-valid", "open-invalid", "keyed-valid", "keyed-invalid", "keyed-without-key", "keyed-read-only"],
)
def test_fuzz(servers: dict[str, Server], which: str, mode: GenerationMode, present_key: bool | str) -> None:
    server = servers[which]
    keyed = which == "keyed"
    auth = {"Authorization": f"Bearer {KEY}"} if keyed else {}
    read_only = present_key == "read"
    sent = {"Authorization": f"Bearer {READ_KEY}"} if read_only else auth if present_key else {}
    document = requests.get(server.url + "/openapi.json", headers=auth, timeout=10).json()
    schema = schemathesis.openapi.from_dict(document)
    excluded = excluded_checks()
    # A number or boolean query parameter "made invalid" as a one-item array serialises to
    # the same valid query string (timeout=5), so that check cannot judge query parameters;
    # bad query values are covered by test_hitl.py::test_bad_input.
    query_excluded = excluded + [check for check in CHECKS.get_all() if check.__name__ == "negative_data_rejection"]
    client = http.loopback_session()
    failures: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.path.endswith("/events"):
            continue  # a stream answers for as long as it is open: tests/integration/serve/approvals/test_workflow.py
        if mode is GenerationMode.NEGATIVE and not (len(operation.body) or len(operation.query)):
            continue  # only a string path parameter: nothing can be made schema-invalid
        for target in ("random", "existing"):
            overrides = {}
            if "{session_id}" in operation.path and target == "existing":
                sid = client.post(server.url + "/sessions", json={}, headers=auth, timeout=10).json()["session_id"]
                overrides["path_parameters"] = {"session_id": sid}
            elif target == "existing":
                continue

            @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy(generation_mode=mode, **overrides))
            def run(case: schemathesis.Case) -> None:
                before = snapshot(server, auth)
                response = case.call(base_url=server.url, session=client, headers=sent, timeout=20)
                assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.status_code} {response.text}"
                case.validate_response(response, excluded_checks=query_excluded if len(operation.query) else excluded)
                if keyed and not present_key and operation.path != "/health":
                    assert response.status_code == 401, response.text
                if read_only and case.method.upper() not in ("GET", "HEAD", "OPTIONS") and response.status_code not in (400, 403, 405, 415):
                    raise AssertionError(f"read-only key was let {case.method} {case.formatted_path}: {response.status_code} {response.text}")
                if 400 <= response.status_code < 500:
                    assert snapshot(server, auth) == before, f"{case.method} {case.formatted_path} changed state with {response.status_code}"

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

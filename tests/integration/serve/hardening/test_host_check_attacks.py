"""Attacks on the cached loopback check of the ``Host`` header: ``auth.is_loopback`` is an
``lru_cache``; it must answer as the plain function does for hostile names, stay bounded, and
a server must answer every hostile ``Host`` with the right status and never a 500.

Agents: ``tests.agents.turn_cost:agent`` (see its docstring).
"""

from __future__ import annotations

import random

from motus.serve import auth
from tests.conftest import Server
from tests.integration.serve.approvals.test_workflow_attacks import raw_request, read_head
from tests.integration.serve.workers.test_pool_manager_attacks import AGENT, StartServer, cost_env
from tests.integration.serve.workers.test_zygote import assert_no_500


# == the cached is_loopback ================================================================

HOSTILE = [
    "localhost", "LOCALHOST".lower(), "localhost.", "localhost.localdomain", "127.0.0.1", "127.1", "127.000.000.001",
    "0x7f.0.0.1", "2130706433", "[::1]", "[::1", "::1]", "::1", "[0:0:0:0:0:0:0:1]", "[::ffff:127.0.0.1]",
    "[::1%25lo]", "[::1%lo]", "::1%lo", "[]", "[", "]", "", " ", "127.0.0.1 ", "\u0131ocalhost", "ｌｏｃａｌｈｏｓｔ",
    "１２７.０.０.１", "127.0.0.1\x00", "[::1]\x00", "[[::1]]", "[127.0.0.1]", "0.0.0.0", "[::]", "128.0.0.1",
    "126.255.255.255", "127.255.255.255", "x" * 8190, "[" + "1:" * 4000 + "]", "٣٧.0.0.1",
]


def test_cached_is_loopback_agrees_with_the_plain_function_and_stays_bounded() -> None:
    plain = auth.is_loopback.__wrapped__
    expected = {host: plain(host) for host in HOSTILE}
    auth.is_loopback.cache_clear()
    rng = random.Random(3)
    for round_ in range(3):
        for host in HOSTILE:
            assert auth.is_loopback(host) == expected[host], repr(host[:40])
        for n in range(1000):  # push everything out of the cache
            junk = f"evil-{round_}-{n}-{rng.random()}.example"
            assert auth.is_loopback(junk) is False
    assert auth.is_loopback.cache_info().currsize <= 256
    assert expected["127.0.0.1"] and expected["[::1]"] and expected["localhost"]
    assert not expected["127.1"] and not expected["[::1"] and not expected["localhost."]


def _raw_get(server: Server, host: bytes) -> int:
    """The status of ``GET /health`` sent with ``Host: host``, exactly as given."""
    with raw_request(server, b"GET /health HTTP/1.1\r\nHost: " + host + b"\r\nConnection: close\r\n\r\n") as sock:
        return int(read_head(sock).split(b" ", 2)[1])


def test_hostile_host_headers_get_the_right_answer_and_never_a_500(start_server: StartServer, sandbox: Path) -> None:
    server = start_server(AGENT, "--workers", "1", env=cost_env(sandbox))
    good = [b"localhost", b"127.0.0.1:9", b"[::1]:80", b"LOCALHOST", b"[::1]"]
    bad = [b"evil.example", b"127.1", b"[::1", b"[::1].evil", b"localhost.", b"x" * 8000,
           "ｌｏｃａｌｈｏｓｔ".encode(), b"\xff\xfe", b"[" + b"1:" * 3000 + b"]"]
    for round_ in range(2):
        for host in good:
            assert _raw_get(server, host) == 200, host
        for host in bad:
            assert _raw_get(server, host) in (400, 431), host[:40]
        for n in range(300):  # more distinct names than the cache holds
            assert _raw_get(server, f"h{round_}-{n}.example".encode()) == 400
    assert_no_500(server)

"""Hardening against web pages, hostile bodies and agents that look for secrets (issue 10),
against a real server process."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import psutil
import pytest
import requests

from tests.conftest import ROOT, Server, server_env

KEY = "k-" + uuid.uuid4().hex


@pytest.fixture
def server(shared_server) -> Server:
    """One server for the module: each test counts sessions before and after what it does."""
    return shared_server("tests.agents:echo", "--workers", "1")


def raw_post(server: Server, path: str, data: bytes, headers: dict[str, str]) -> requests.Response:
    return requests.post(server.url + path, data=data, headers=headers, timeout=30)


def count_sessions(server: Server) -> int:
    return len(server.get("/sessions").json())


# -- cross-site requests ---------------------------------------------------------------------


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None])
def test_a_body_that_is_not_declared_json_is_refused_and_changes_nothing(server: Server, content_type: str | None) -> None:
    """A page can send text/plain or a form to 127.0.0.1 without a preflight; those are 415."""
    headers = {"Content-Type": content_type} if content_type else {}
    before = count_sessions(server)
    response = raw_post(server, "/sessions", b"{}", headers)
    assert response.status_code == 415, response.text
    assert "application/json" in response.json()["detail"]
    sid = server.create_session()
    refused = raw_post(server, f"/sessions/{sid}/messages", json.dumps({"content": "hi"}).encode(), headers)
    assert refused.status_code == 415
    assert server.get(f"/sessions/{sid}").json()["status"] == "idle"
    assert count_sessions(server) == before + 1


def test_json_clients_keep_working(server: Server) -> None:
    """requests' json=, an explicit charset, and an empty POST all still work."""
    assert requests.post(server.url + "/sessions", json={}, timeout=10).status_code == 201
    assert raw_post(server, "/sessions", b"{}", {"Content-Type": "application/json; charset=utf-8"}).status_code == 201
    assert requests.post(server.url + "/sessions", timeout=10).status_code == 201  # no body at all


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "127.0.0.1.evil.example", "10.0.0.1"])
def test_a_loopback_server_answers_only_to_loopback_names(server: Server, host: str) -> None:
    """DNS rebinding: a page whose own name now points at 127.0.0.1 is not let in."""
    for method, path in [("get", "/sessions"), ("post", "/sessions"), ("get", "/ui/"), ("get", "/health")]:
        response = requests.request(method, server.url + path, headers={"Host": host}, json={} if method == "post" else None, timeout=10)
        assert response.status_code == 400, (method, path, response.status_code)
        assert "--allowed-host" in response.json()["detail"]
    for good in ["localhost", f"localhost:{server.url.rsplit(':', 1)[1]}", "127.0.0.1", "127.0.0.2:1", "[::1]:80"]:
        assert requests.get(server.url + "/sessions", headers={"Host": good}, timeout=10).status_code == 200, good


def test_allowed_host_adds_a_name_and_a_public_bind_checks_no_host(start_server) -> None:
    named = start_server("tests.agents:echo", "--workers", "1", "--allowed-host", "motus.test")
    assert requests.get(named.url + "/sessions", headers={"Host": "motus.test:8000"}, timeout=10).status_code == 200
    assert requests.get(named.url + "/sessions", headers={"Host": "other.test"}, timeout=10).status_code == 400
    public = start_server("tests.agents:echo", "--workers", "1", "--host", "0.0.0.0", "--api-key", KEY)
    response = requests.get(public.url + "/sessions", headers={"Host": "motus.example.com", "Authorization": f"Bearer {KEY}"}, timeout=10)
    assert response.status_code == 200


@pytest.mark.parametrize("origin", ["http://evil.example", "null", "http://localhost:1", "file://", "https://127.0.0.1.evil.example"])
def test_a_cross_site_origin_is_refused(server: Server, origin: str) -> None:
    before = count_sessions(server)
    response = requests.post(server.url + "/sessions", json={}, headers={"Origin": origin}, timeout=10)
    assert response.status_code == 403 and "Origin" in response.json()["detail"]
    sid = server.create_session()
    assert requests.delete(f"{server.url}/sessions/{sid}", headers={"Origin": origin}, timeout=10).status_code == 403
    assert server.get(f"/sessions/{sid}").status_code == 200
    assert count_sessions(server) == before + 1


def test_the_servers_own_origin_is_accepted(server: Server) -> None:
    """The web chat's requests carry its own origin."""
    port = server.url.rsplit(":", 1)[1]
    for origin, host in [(server.url, f"127.0.0.1:{port}"), (f"http://localhost:{port}", f"localhost:{port}")]:
        response = requests.post(server.url + "/sessions", json={}, headers={"Origin": origin, "Host": host}, timeout=10)
        assert response.status_code == 201, (origin, response.text)


def test_api_answers_are_never_cached(server: Server) -> None:
    sid = server.create_session()
    for response in [server.get("/sessions"), server.get(f"/sessions/{sid}"), server.get("/health"), server.get("/sessions/nope")]:
        assert response.headers.get("Cache-Control") == "no-store", response.url


# -- memory ----------------------------------------------------------------------------------


def _peak_rss(pid: int) -> int:
    """The server process' peak resident size (VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def _serving_pid(server: Server) -> int:
    """The gunicorn worker that serves requests (the child of the arbiter that is not the forkserver)."""
    children = psutil.Process(server.process.pid).children()
    return next(child.pid for child in children if "forkserver" not in " ".join(child.cmdline()) and "resource_tracker" not in " ".join(child.cmdline()))


@pytest.mark.parametrize(
    "body",
    [
        b'{"state": [' + b",".join([b"{}"] * 3_400_000) + b"]}",
        b'{"state": [' + b",".join([b"1"] * 5_000_000) + b"]}",
        b'{"state": [' + b",".join([b'{"role":"user"}'] * 640_000) + b"]}",
        b'{"interrupt_id": "x", "value": [' + b",".join([b"[]"] * 3_400_000) + b"]}",
    ],
    ids=["empty-objects", "numbers", "tiny-messages", "empty-arrays"],
)
def test_a_ten_mib_body_of_tiny_items_costs_little_and_is_refused(shared_server, body: bytes) -> None:
    assert len(body) <= 10 * 1024 * 1024
    # One server for the four bodies: the peak is reset before each, and only one of them
    # (the resume) creates a session.
    server = shared_server("tests.agents:approval", "--workers", "1")
    pid = _serving_pid(server)
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # reset the peak to what is resident now
    baseline = _peak_rss(pid)
    path = "/sessions" if b'"state"' in body else f"/sessions/{server.create_session()}/resume"
    response = raw_post(server, path, body, {"Content-Type": "application/json"})
    assert response.status_code == 400, response.text[:200]
    detail = response.json()["detail"]
    assert "limit" in detail or "at most" in detail
    grew = _peak_rss(pid) - baseline
    assert grew <= 20 * len(body), f"peak grew by {grew / 2**20:.0f} MiB for a {len(body) / 2**20:.0f} MiB body"
    assert count_sessions(server) <= 1


def test_invalid_state_reports_a_few_errors(server: Server) -> None:
    response = server.post("/sessions", json={"state": [1] * 5000})
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert len(detail) < 1000 and "more" in detail


def test_max_sessions_has_a_finite_default(start_server) -> None:
    proc = subprocess.run([sys.executable, "-m", "motus", "serve", "start", "--help"], capture_output=True, text=True, cwd=ROOT, env=server_env(), timeout=60)
    text = re.sub(r"\s+", " ", proc.stdout)
    assert re.search(r"--max-sessions INTEGER RANGE Cap on sessions; 0 = unlimited\. \[default: 10000", text), text


# -- keys where they should not be ------------------------------------------------------------


def test_agents_do_not_see_the_api_key(start_server) -> None:
    server = start_server("tests.agents:environment", "--workers", "1", env={"MOTUS_API_KEY": KEY}).with_headers({"Authorization": f"Bearer {KEY}"})
    sid = server.create_session()
    server.send(sid, "MOTUS_API_KEY")
    reply = server.wait_for_status(sid, "idle")["response"]["content"]
    assert reply == "MOTUS_API_KEY=None"
    assert KEY not in reply


def test_a_key_given_on_the_command_line_is_in_no_process_listing(start_server) -> None:
    """``--api-key KEY`` makes ``motus serve start`` execute itself again (same pid) with the
    key in a pipe: no ``/proc/PID/cmdline`` or ``/proc/PID/environ`` of the server's tree
    shows it, and the key still opens the API. (Other tests pass their keys in a file.)"""
    server = start_server("tests.agents:echo", "--workers", "1", "--api-key", f"alice={KEY}:ops", keys_on_command_line=True)
    assert requests.get(server.url + "/sessions", timeout=10).status_code == 401
    assert requests.get(server.url + "/whoami", headers={"Authorization": f"Bearer {KEY}"}, timeout=10).json()["name"] == "alice"
    tree = [psutil.Process(server.process.pid), *server.descendants()]
    assert len(tree) >= 2  # the serving process and its gunicorn worker at least
    for proc in tree:
        for what in ("cmdline", "environ"):
            assert KEY.encode() not in Path(f"/proc/{proc.pid}/{what}").read_bytes(), (proc.pid, what)


def test_api_key_file(start_server, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"# rotation: new, then old\n{KEY}\n\nold-{KEY}\n")
    server = start_server("tests.agents:echo", "--workers", "1", "--api-key-file", str(keys))
    assert requests.get(server.url + "/sessions", timeout=10).status_code == 401
    for key in (KEY, f"old-{KEY}"):
        assert requests.get(server.url + "/sessions", headers={"Authorization": f"Bearer {key}"}, timeout=10).status_code == 200
    for proc in [psutil.Process(server.process.pid), *server.descendants()]:
        assert KEY not in " ".join(proc.cmdline())
    missing = subprocess.run(
        [sys.executable, "-m", "motus", "serve", "start", "tests.agents:echo", "--port", "1", "--api-key-file", str(tmp_path / "none")],
        capture_output=True, text=True, cwd=ROOT, env=server_env(), timeout=60,
    )
    assert missing.returncode == 2 and "Cannot read --api-key-file" in missing.stderr and "Traceback" not in missing.stderr


# -- the example agent's sandbox --------------------------------------------------------------


def test_the_example_sandbox_is_private_and_refuses_a_planted_directory(tmp_path: Path) -> None:
    code = (
        "import os, tempfile, pathlib\n"
        "from examples.serving import hitl_agent as a\n"
        "root = a.sandbox()\n"
        "print(oct(os.stat(root).st_mode & 0o777), root)\n"
    )
    env = server_env({"TMPDIR": str(tmp_path)})
    env.pop("MOTUS_EXAMPLE_DIR", None)
    made = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    assert made.returncode == 0, made.stderr
    mode, root = made.stdout.split()
    assert mode == "0o700" and root.endswith(f"motus-hitl-example-{os.getuid()}")
    # Someone else's (here: world-writable) directory at the default path is refused, not used.
    os.chmod(root, 0o777)
    refused = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    assert refused.returncode != 0 and "not a private directory" in refused.stderr
    os.chmod(root, 0o700)


def test_the_example_tools_do_not_follow_a_symlink_out_of_the_sandbox(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    code = (
        "import asyncio, os, pathlib\n"
        "from examples.serving import hitl_agent as a\n"
        "root = a.sandbox()\n"
        f"os.symlink({str(outside)!r}, root / 'link')\n"
        "os.symlink('notes.txt', root / 'alias.txt')\n"
        "print(repr(asyncio.run(a.read_file.invoke({'path': 'link/secret.txt'}))))\n"
        "print(repr(asyncio.run(a.read_file.invoke({'path': 'alias.txt'}))))\n"
        "try:\n"
        "    a.delete_file.fn('link/secret.txt')\n"
        "except ValueError as exc:\n"
        "    print('refused', exc)\n"
    )
    env = server_env({"MOTUS_EXAMPLE_DIR": str(tmp_path / "box")})
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert "outside the sandbox" in lines[0]
    assert lines[1].startswith("'Remember")  # a link inside the sandbox is resolved at the check, then used by its target
    assert lines[2].startswith("refused")
    assert (outside / "secret.txt").read_text() == "secret"
    assert stat.S_ISREG(os.lstat(outside / "secret.txt").st_mode)


def test_a_body_of_whitespace_is_not_json(server: Server) -> None:
    """Only a truly empty body means "no body" (found by the fuzz: "\\r\\n\\r\\n" created a session)."""
    before = count_sessions(server)
    response = raw_post(server, "/sessions", b"\r\n\r\n", {"Content-Type": "application/json"})
    assert response.status_code == 422 and "Malformed JSON" in response.json()["detail"]
    assert count_sessions(server) == before
    assert raw_post(server, "/sessions", b"", {"Content-Type": "application/json"}).status_code == 201

"""The README's commands and code, run as written against real servers, so they cannot drift.

Each test takes its text from ``README.md`` (the Python client snippet, the quick start's
command, the ``--param dry_run=true`` line) and runs it: only the server's address is
replaced by the test server's.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import ROOT, Server, server_env, wait_until

README = (ROOT / "README.md").read_text()
README_URL = "http://localhost:8000"


def code_blocks(language: str) -> list[str]:
    return re.findall(rf"^ *```{language}\n(.*?)^ *```", README, flags=re.M | re.S)


def section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end != -1 else None]


@pytest.fixture
def example(start_server: Callable[..., Server], tmp_path: Path) -> Server:
    """The example agent as a new user gets it: no model key, so the offline scripted model."""
    sandbox = tmp_path / "sandbox"
    server = start_server(
        "examples.serving.hitl_agent:agent",
        env={"MOTUS_EXAMPLE_DIR": str(sandbox), "OPENROUTER_API_KEY": "", "MOTUS_EXAMPLE_OFFLINE": ""},
    )
    server.extra["sandbox"] = sandbox
    return server


def test_the_python_client_snippet_runs_as_written(example: Server) -> None:
    [snippet] = [block for block in code_blocks("python") if "from motus.client import" in block and "run_turn" in block]
    assert snippet.count(README_URL) == 1, "the snippet names the quick start's server once"
    for name in ("SKIP", "TurnPaused", "delete_session", 'payload["tool_name"]', 'payload["tool_args"]'):
        assert name in snippet, f"the README's client snippet no longer shows {name}"
    ran = subprocess.run(
        [sys.executable, "-c", snippet.replace(README_URL, example.url)],
        capture_output=True, text=True, cwd=ROOT, env=server_env(), timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == (
        "Here is what happened:\n- delete_file: Deleted old_logs.txt\n"
        "1 interrupt(s) wait for a person: user_input\n"
    )
    # What the README says the snippet does: the approved call ran, and it cleaned up.
    assert "1 interrupt(s) wait for a person: user_input" in README
    assert not (example.extra["sandbox"] / "old_logs.txt").exists()
    assert example.get("/sessions").json() == []


def test_the_quick_start_is_two_commands_and_the_server_says_what_it_runs(start_server, tmp_path: Path) -> None:
    quick_start = section("Quick start")
    steps = quick_start.split("\nThen ")[0]
    commands = [block.strip() for block in re.findall(r"```bash\n(.*?)```", steps, flags=re.S)]
    assert len(commands) == 2 and all("\n" not in command for command in commands), commands
    serve, test = commands
    assert test == "pip install -e '.[test]' && python -m pytest"
    assert "keeps" in steps and "busy" in steps, "the README says the server keeps its terminal busy"
    install, _, start = serve.partition(" && ")
    assert install == "pip install -e ."
    words = shlex.split(start)
    assert words[:3] == ["motus", "serve", "start"] and words[4:] == ["--port", "8000"]

    sandbox = tmp_path / "sandbox"
    server = start_server(words[3], env={"MOTUS_EXAMPLE_DIR": str(sandbox), "OPENROUTER_API_KEY": "", "MOTUS_EXAMPLE_OFFLINE": ""})
    port = server.url.rsplit(":", 1)[1]
    announced = re.search(r"`(web chat: http://127\.0\.0\.1:8000/ui/)`", quick_start)
    assert announced, "the quick start quotes the log line with the web chat's address"
    expected = announced.group(1).replace(":8000/", f":{port}/")
    wait_until(lambda: expected in server.log(), what="the web chat's address in the log")
    offline = "using the offline scripted model because OPENROUTER_API_KEY is not set"
    wait_until(lambda: offline in server.log(), what="the offline model notice in the log")
    assert server.get("/ui/").status_code == 200
    assert server.log().count(offline) == 1, "said once, by the process whose log this is"


def test_the_dry_run_parameter_is_real(example: Server) -> None:
    [line] = [line for line in section("Talking to a served agent").splitlines() if "--param dry_run=true" in line]
    words = shlex.split(line.split("#")[0])
    assert words[:3] == ["motus", "serve", "chat"] and words[3] == README_URL
    ran = subprocess.run(
        [sys.executable, "-m", "motus", *words[1:3], example.url, *words[4:]],
        input="y\n", capture_output=True, text=True, cwd=ROOT, env=server_env(), timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    assert "The agent wants to run: delete_file" in ran.stdout
    assert ran.stdout.endswith("- delete_file: Dry run: would delete old_logs.txt (nothing was changed)\n")
    assert (example.extra["sandbox"] / "old_logs.txt").exists(), "a dry run deleted the file"
    assert "message.user_params" in README
    # Without the parameter the same message does delete it.
    ran = subprocess.run(
        [sys.executable, "-m", "motus", *words[1:3], example.url, words[4]],
        input="y\n", capture_output=True, text=True, cwd=ROOT, env=server_env(), timeout=120,
    )
    assert ran.stdout.endswith("- delete_file: Deleted old_logs.txt\n"), ran.stdout + ran.stderr
    assert not (example.extra["sandbox"] / "old_logs.txt").exists()

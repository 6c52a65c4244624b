"""Auto-detection of framework agents in ``motus.serve.agents`` (issue 16): which objects get an
adapter, that other agents never import a framework, and that what is not an agent is still
refused as before. Each check runs in a fresh interpreter, so ``sys.modules`` is its own."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT, server_env
from tests.integration.frameworks.helpers import needs


def run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=server_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_plain_agent_imports_no_framework() -> None:
    out = run(
        "import sys; from motus.serve.agents import load_agent; a = load_agent('tests.agents:echo'); "
        "print(a.__name__, 'agents' in sys.modules, 'pydantic_ai' in sys.modules, 'motus.frameworks.openai_agents' in sys.modules)"
    )
    assert out == "echo False False False"


@pytest.mark.parametrize(
    ("path", "package", "adapter"),
    [
        ("tests.agents.frameworks.openai_agents:agent", "agents", "OpenAIAgentsAgent('files')"),
        ("tests.agents.frameworks.pydantic_ai:agent", "pydantic_ai", "PydanticAIAgent('files')"),
    ],
)
def test_a_framework_agent_is_served_through_its_adapter(path: str, package: str, adapter: str) -> None:
    needs(package)
    out = run(
        "import inspect; from motus.serve.agents import load_agent, check_agent, ServableAgent; "
        f"a = load_agent({path!r}); check_agent(a); "
        "print(repr(a), isinstance(a, ServableAgent), inspect.iscoroutinefunction(a.run_turn))"
    )
    assert out == f"{adapter} True True"


def test_another_object_of_a_framework_is_refused_as_before() -> None:
    needs("agents")
    out = run(
        "from motus.serve.agents import load_agent, AgentLoadError\n"
        "try:\n    load_agent('tests.agents.frameworks.openai_agents:touch')\n"
        "except AgentLoadError as exc:\n    print('refused', exc)\n"
        "try:\n    load_agent('tests.agents.frameworks.openai_agents:PROVIDER_URL')\n"
        "except AgentLoadError as exc:\n    print('refused', exc)\n"
    )
    tool, text = out.splitlines()
    assert tool.startswith("refused") and "is a FunctionTool, not an agent" in tool, out  # an SDK tool is no agent
    assert text.startswith("refused") and "is a str, not an agent" in text, out

"""``motus.client`` loads no server module: the client shares only ``motus.api`` with it.

One fresh interpreter (the checkout root first on ``PYTHONPATH``, as the suite runs) imports
what the client builds on (``motus`` itself, ``motus.models``), the HTTP API's shared
vocabulary, and then each client module in turn, and notes which ``motus.serve*`` and
``motus.client*`` modules each import added; a test fails naming the module that pulled in
what it must not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

#: What the client builds on besides the vocabulary: they must load neither.
BASE_MODULES = ["motus", "motus.models"]
#: The shared vocabulary: it must load neither the server nor the client.
API_MODULES = ["motus.api", "motus.api.webhook_urls", "motus.api.schemas"]
#: Each client module; every one must load no server module.
#: (Importing any of them runs ``motus/client/__init__.py``, which loads ``library`` and
#: ``events``: the package comes first so that what it loads is blamed on it.)
CLIENT_MODULES = [
    "motus.client",
    "motus.client.events",
    "motus.client.library",
    "motus.client.terminal",
    "motus.client.prompts",
    "motus.client.chat",
    "motus.client.commands",
]

_PROBE = """
import importlib, json, sys

def ours():
    return {name for name in sys.modules if name.split(".")[:2] in (["motus", "serve"], ["motus", "client"])}

added = {}
for module in sys.argv[1:]:
    before = ours()
    importlib.import_module(module)
    added[module] = sorted(ours() - before)
print(json.dumps(added))
"""


@pytest.fixture(scope="module")
def added_by() -> dict[str, list[str]]:
    """For each module, in the order imported: the server and client modules its import added."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *BASE_MODULES, *API_MODULES, *CLIENT_MODULES], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, f"the imports failed:\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("module", BASE_MODULES + API_MODULES)
def test_what_the_client_builds_on_loads_neither_server_nor_client(added_by: dict[str, list[str]], module: str) -> None:
    loaded = added_by[module]
    assert not loaded, f"import {module} loaded server or client modules: {', '.join(loaded)}"


@pytest.mark.parametrize("module", CLIENT_MODULES)
def test_a_client_module_loads_no_server_module(added_by: dict[str, list[str]], module: str) -> None:
    server = [name for name in added_by[module] if name == "motus.serve" or name.startswith("motus.serve.")]
    assert not server, f"import {module} loaded server modules: {', '.join(server)}"

"""The import layering: what runs inside an agent never loads the server.

Models, tools, agents, the framework adapters and the durable API (``motus.durable``) sit
below ``motus.serve``: importing any of them must load no ``motus.serve`` module, or an
agent's process would import the server (Flask, gunicorn, the store) and a package cycle
would come back. Each module is imported with no ``motus`` module loaded before it.

One interpreter checks all of them (each framework SDK costs about 2 s of CPU to import, so
an interpreter per module would pay for the SDKs' shared dependencies again): it imports the
third-party packages first (they cannot import ``motus``, and the probe checks that they did
not), then forks one child per module, so every child starts with no ``motus`` module at all
and imports only its own. A finder on ``sys.meta_path`` notes which file and line asked for
each ``motus.serve`` module, so a failure names who imported it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: The modules that must not load the server (``motus.client`` has its own check).
BELOW_THE_SERVER = (
    "motus",
    "motus.tools",
    "motus.models",
    "motus.agent",
    "motus.frameworks",
    "motus.frameworks.openai_agents",
    "motus.frameworks.pydantic_ai",
    "motus.frameworks.anthropic",
    "motus.durable",
)

#: Imported once, before any fork: what the modules above need and cannot bring in ``motus``.
THIRD_PARTY = ("pydantic", "requests", "agents", "pydantic_ai", "anthropic")

PROBE = r"""
import json, os, sys

def is_motus(name):
    return name == "motus" or name.startswith("motus.")

def is_serve(name):
    return name == "motus.serve" or name.startswith("motus.serve.")

class Watch:
    "Notes the file and line that first asked for each motus.serve module; finds nothing itself."

    def __init__(self):
        self.importers = {}

    def find_spec(self, name, path=None, target=None):
        if is_serve(name) and name not in self.importers:
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename.startswith("<frozen"):
                frame = frame.f_back
            self.importers[name] = f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame else "?"
        return None

third_party, modules = sys.argv[1].split(","), sys.argv[2].split(",")
for name in third_party:
    __import__(name)
early = sorted(name for name in sys.modules if is_motus(name))
results = {}
for module in modules:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            watch = Watch()
            sys.meta_path.insert(0, watch)
            __import__(module)
            serve = sorted(name for name in sys.modules if is_serve(name))
            report = {"serve": {name: watch.importers.get(name, "?") for name in serve}}
        except BaseException as exc:
            report = {"error": f"{type(exc).__name__}: {exc}"}
        with os.fdopen(write, "w") as out:
            json.dump(report, out)
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as inp:
        text = inp.read()
    os.waitpid(pid, 0)
    results[module] = json.loads(text) if text else {"error": "the child died before it reported"}
print(json.dumps({"early": early, "results": results}))
"""


def test_nothing_below_the_server_loads_motus_serve() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, ",".join(THIRD_PARTY), ",".join(BELOW_THE_SERVER)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=100,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["early"] == [], f"importing {', '.join(THIRD_PARTY)} loaded motus modules: {report['early']}"
    problems = []
    for module in BELOW_THE_SERVER:
        result = report["results"][module]
        if "error" in result:
            problems.append(f"{module} could not be imported: {result['error']}")
        for name, importer in result["serve"].items() if "serve" in result else ():
            problems.append(f"import {module} loaded {name} (imported from {_relative(importer)})")
    assert not problems, "\n".join(problems)


def _relative(where: str) -> str:
    try:
        return str(Path(where).relative_to(ROOT))
    except ValueError:
        return where

"""Serve a compat agent the way the reference's serving guide does::

    server = AgentServer(agent_fn=guide_agent, max_workers=2, timeout=30.0, ttl=0)
    server.run(host="127.0.0.1", port=PORT)

Run as ``python -m tests.compat.serve_agent_fn --port PORT [--agent NAME] [--by-path]
[--allow-custom-ids] [--python-executable PATH]``. ``--by-path`` passes the import path
string (as the reference's own HITL test does) instead of the function.
``--python-executable`` sets the interpreter worker processes are started with; a missing
one makes every worker start fail, which is how the tests reach that failure for real.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os

from motus.serve import AgentServer
from tests.compat import agents


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--agent", default="guide_agent")
    parser.add_argument("--by-path", action="store_true")
    parser.add_argument("--allow-custom-ids", action="store_true")
    parser.add_argument("--python-executable")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s [%(process)d] [%(levelname)s] %(name)s: %(message)s")
    if args.python_executable:
        multiprocessing.set_executable(args.python_executable)
        # A zygote forked from the server runs no interpreter: only a fresh one uses the path.
        os.environ["MOTUS_WORKER_START"] = "fresh-zygote"
    agent_fn = f"tests.compat.agents:{args.agent}" if args.by_path else getattr(agents, args.agent)
    server = AgentServer(
        agent_fn=agent_fn, max_workers=2, timeout=30.0, ttl=0, allow_custom_ids=args.allow_custom_ids, store="memory"
    )
    server.run(host="127.0.0.1", port=args.port, threads=16)


if __name__ == "__main__":
    main()

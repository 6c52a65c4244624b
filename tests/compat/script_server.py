"""A user's one-file server: the agent is defined in the script that serves it.

Run as a file (``python tests/compat/script_server.py --port PORT``), so the agent lives in
``__main__``; each worker runs this script again (as ``__mp_main__``) to load it, which is
why the server starts under the main guard.
"""

from __future__ import annotations

import argparse

from motus.models import ChatMessage
from motus.serve import AgentServer


def my_agent(message: ChatMessage, state: list[ChatMessage]):
    response = ChatMessage.assistant_message(content=f"script says: {message.content}")
    return response, state + [message, response]


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    port = parser.parse_args().port
    AgentServer(agent_fn=my_agent, max_workers=1, store="memory").run(host="127.0.0.1", port=port, threads=8)

"""An agent that does to its state what each message says, for
``tests/integration/serve/history/test_history_writes.py`` (served as ``tests.agents.state:agent``).

The reply is always ``done: <the message>``. What happens to the state before the reply
(and, except for ``same``, the message) is appended:

- ``append``: nothing (the usual turn: the history grows by two);
- ``edit I TEXT``: message ``I`` of the state gets ``TEXT`` as its content, edited in place
  on the model the agent was given;
- ``drop N``: the last ``N`` messages are removed;
- ``insert I TEXT``: a user message ``TEXT`` goes in at position ``I``;
- ``replace``: the state becomes empty (only the message and the reply are kept);
- ``same``: the state is returned as it came, with neither the message nor the reply;
- ``unicode``: appends a message whose content is non-ASCII, a lone surrogate and a NUL.
"""

from __future__ import annotations

from motus.models import ChatMessage


def agent(message: ChatMessage, state: list[ChatMessage]) -> tuple[ChatMessage, list[ChatMessage]]:
    words = (message.content or "").split(" ", 2)
    reply = ChatMessage.assistant_message(content=f"done: {message.content}")
    command = words[0]
    if command == "same":
        return reply, state
    if command == "edit":
        state[int(words[1])].content = words[2]
    elif command == "drop":
        state = state[: len(state) - int(words[1])]
    elif command == "insert":
        state.insert(int(words[1]), ChatMessage.user_message(words[2]))
    elif command == "replace":
        state = []
    elif command == "unicode":
        state = [*state, ChatMessage.user_message("h\u00e9llo \ud800 \x00 \u4e16")]
    return reply, [*state, message, reply]

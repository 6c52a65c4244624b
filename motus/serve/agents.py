"""What ``motus serve`` accepts as an agent, and how one is found from ``module:attr``.

Shapes (serving-api.md):

- a plain function ``(message, state) -> (response, new_state)``, sync or async;
- any object with ``async def run_turn(self, message, state)`` (:class:`ServableAgent`).

``load_agent`` is called twice on purpose: once by the server at start-up, so a bad path is
a clear error before anything listens, and once inside each worker process, which runs the
turn (the agent module is preloaded in the forkserver, so that second import is free).
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Protocol, runtime_checkable

from motus.models import ChatMessage


class AgentLoadError(Exception):
    """The agent import path does not name a usable agent. The message says what to fix."""


@runtime_checkable
class ServableAgent(Protocol):
    """An object that runs one turn of a conversation. Inheriting from this is optional."""

    async def run_turn(self, message: ChatMessage, state: list[ChatMessage]) -> tuple[ChatMessage, list[ChatMessage]]:
        ...


def split_import_path(path: str) -> tuple[str, str]:
    module, sep, attr = path.partition(":")
    if not sep or not module or not attr:
        raise AgentLoadError(f"Agent import path must look like 'package.module:attribute', got {path!r}")
    return module, attr


def load_agent(path: str) -> Any:
    """Import ``module:attr`` and check that it is a servable agent."""
    module_name, attr = split_import_path(path)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise AgentLoadError(
                f"Could not import module {module_name!r} for agent {path!r}: {exc}. "
                "Check the spelling and run from the folder that contains it (or set PYTHONPATH)."
            ) from exc
        raise AgentLoadError(f"Importing {module_name!r} failed: {type(exc).__name__}: {exc}") from exc
    except Exception as exc:
        raise AgentLoadError(f"Importing {module_name!r} failed: {type(exc).__name__}: {exc}") from exc
    agent: Any = module
    for part in attr.split("."):
        try:
            agent = getattr(agent, part)
        except AttributeError:
            raise AgentLoadError(f"Module {module_name!r} has no attribute {attr!r} (agent path {path!r})") from None
    check_agent(agent, path)
    return agent


def check_agent(agent: Any, name: str = "agent") -> None:
    if isinstance(agent, ServableAgent):
        if not inspect.iscoroutinefunction(agent.run_turn):
            raise AgentLoadError(f"{name}: run_turn must be 'async def run_turn(self, message, state)'")
        return
    if not callable(agent):
        raise AgentLoadError(
            f"{name} is a {type(agent).__name__}, not an agent: expected a function "
            "(message, state) -> (response, new_state) or an object with 'async def run_turn'"
        )


def agent_module(path: str) -> str:
    return split_import_path(path)[0]


async def run_agent_turn(agent: Any, message: ChatMessage, state: list[ChatMessage]) -> Any:
    """Run one turn in whatever shape the agent has; sync code runs in a thread."""
    import asyncio

    if isinstance(agent, ServableAgent):
        return await agent.run_turn(message, state)
    if inspect.iscoroutinefunction(agent) or inspect.iscoroutinefunction(getattr(agent, "__call__", None)):
        return await agent(message, state)
    result = await asyncio.to_thread(agent, message, state)
    if inspect.isawaitable(result):
        result = await result
    return result


def check_turn_result(result: Any) -> tuple[ChatMessage, list[ChatMessage]]:
    """Accept ``(ChatMessage, list[ChatMessage])`` (dicts that validate are fine too)."""
    expected = "expected a (ChatMessage, list[ChatMessage]) tuple"
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise TypeError(f"Agent returned {_describe(result)}; {expected}")
    response, state = result
    try:
        response = response if isinstance(response, ChatMessage) else ChatMessage.model_validate(response)
    except Exception:
        raise TypeError(f"Agent returned {_describe(response)} as the response; {expected}") from None
    if not isinstance(state, (list, tuple)):
        raise TypeError(f"Agent returned {_describe(state)} as the new state; {expected}")
    messages = []
    for index, item in enumerate(state):
        try:
            messages.append(item if isinstance(item, ChatMessage) else ChatMessage.model_validate(item))
        except Exception:
            raise TypeError(f"Agent returned {_describe(item)} at new state[{index}]; {expected}") from None
    return response, messages


def _describe(value: Any) -> str:
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{type(value).__name__} {text}"

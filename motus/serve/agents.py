"""What ``motus serve`` accepts as an agent, and how one is found from ``module:attr``.

Shapes (serving-api.md):

- a plain function ``(message, state) -> (response, new_state)``, sync or async;
- any object with ``async def run_turn(self, message, state)`` (:class:`ServableAgent`);
- an agent of a supported framework, detected by its type and wrapped in an adapter from
  :mod:`motus.frameworks` (see :func:`framework_adapter`): an OpenAI Agents SDK
  ``agents.Agent`` or a Pydantic AI ``pydantic_ai.Agent``. The framework is imported only
  when the object's type says it comes from it.

``load_agent`` is called twice on purpose: once by the server at start-up, so a bad path is
a clear error before anything listens, and once inside each worker process, which runs the
turn (the agent module is already loaded in the fork server, so that second import is free).

An agent given as an object (``AgentServer(agent_fn=my_agent)``) reaches the workers
pickled: :func:`agent_blob` pickles it once, when the server is built, so an agent that
cannot travel (a lambda, a function defined inside another function, an object holding a
lock) is a ``ValueError`` then, never a turn that waits for a worker that cannot start.
A function agent must be a module-level ``def`` however it is given, as the reference
product requires.
"""

from __future__ import annotations

import importlib
import inspect
import pickle
import sys
from typing import Any, Protocol, runtime_checkable

from motus.models import ChatMessage


class AgentLoadError(Exception):
    """The agent import path does not name a usable agent. The message says what to fix."""


class AgentNotSendable(AgentLoadError, ValueError):
    """The agent cannot be loaded by a worker process: a lambda, a nested function, or an
    object that does not pickle. A ``ValueError``, as in the reference product."""


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
    adapted = framework_adapter(agent, path)
    if adapted is not None:
        return adapted
    check_agent(agent, path)
    return agent


#: Frameworks served by an adapter: the top-level module their agent types live in, and the
#: adapter's module and factory in :mod:`motus.frameworks`.
FRAMEWORKS = {
    "agents": ("motus.frameworks.openai_agents", "adapt", "openai-agents"),
    "pydantic_ai": ("motus.frameworks.pydantic_ai", "adapt", "pydantic-ai"),
}


def framework_adapter(agent: Any, name: str = "agent") -> Any | None:
    """The adapter serving ``agent`` when it is an agent of a supported framework, else None.

    Detection looks at the modules of the object's type (and its base classes) first, so a
    framework is imported only for its own objects. A framework object built wrongly is an
    ``AgentLoadError`` saying what to change."""
    if isinstance(agent, ServableAgent) or inspect.isfunction(agent) or inspect.ismodule(agent) or isinstance(agent, type):
        return None
    for cls in type(agent).__mro__:
        root = (getattr(cls, "__module__", "") or "").split(".", 1)[0]
        framework = sys.modules.get(root)
        if root not in FRAMEWORKS or framework is None or not hasattr(framework, "Agent"):
            continue  # (a module of the user's that happens to share the name is not it)
        module_name, factory, extra = FRAMEWORKS[root]
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise AgentLoadError(f"{name}: serving a {type(agent).__name__} from {root!r} failed: {exc}; pip install 'motus[{extra}]'") from exc
        try:
            adapted = getattr(module, factory)(agent)
        except (TypeError, ValueError) as exc:
            raise AgentLoadError(f"{name}: {exc}") from None
        if adapted is not None:
            return adapted
    return None


def check_agent(agent: Any, name: str = "agent") -> None:
    """Refuse what is not an agent, or is a function no worker can load (see the module doc)."""
    check_module_level(agent, name)
    if framework_adapter(agent, name) is not None:
        return
    if isinstance(agent, ServableAgent):
        if not inspect.iscoroutinefunction(agent.run_turn):
            raise AgentLoadError(f"{name}: run_turn must be 'async def run_turn(self, message, state)'")
        return
    if not callable(agent):
        raise AgentLoadError(
            f"{name} is a {type(agent).__name__}, not an agent: expected a function "
            "(message, state) -> (response, new_state) or an object with 'async def run_turn'"
        )


def check_module_level(agent: Any, name: str = "agent") -> None:
    """A function agent must be a ``def`` at the top level of its module."""
    if not inspect.isfunction(agent):
        return
    where = f"{getattr(agent, '__module__', '?')}:{agent.__qualname__}"
    if agent.__name__ == "<lambda>":
        kind = "a lambda"
    elif "<locals>" in agent.__qualname__:
        outer = agent.__qualname__.split(".<locals>", 1)[0]
        kind = f"a function defined inside {outer}()"
    else:
        return
    label = f"{name} ({where})" if name != "agent" and name != where else where
    raise AgentNotSendable(
        f"Agent must be a module-level function: {label} is {kind}; define it with 'def' at "
        "the top level of a module"
    )


def agent_blob(agent: Any) -> bytes:
    """The agent pickled for the worker processes; ``AgentNotSendable`` if it cannot go there.

    An agent defined in the script being run (``__main__``) travels too: the workers of
    such an agent run that script again as ``__mp_main__`` first, as ``multiprocessing``
    does (so keep the server start under ``if __name__ == "__main__":``). An agent typed
    into an interactive session has no file to run, so it is refused.
    """
    check_module_level(agent)
    try:
        blob = pickle.dumps(agent, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # PicklingError, TypeError ("cannot pickle '_thread.lock'"), RecursionError...
        fix = (
            "define it with 'def' at the top level of a module"
            if inspect.isfunction(agent)
            else "serve it by import path 'module:attribute' instead (each worker then imports it)"
        )
        raise AgentNotSendable(
            f"Agent must be a module-level function (or an object that pickles): {_short(agent)} cannot "
            f"be sent to a worker process ({type(exc).__name__}: {exc}); {fix}"
        ) from None
    if needs_main(blob):
        main = sys.modules.get("__main__")
        if getattr(main, "__file__", None) is None and getattr(main, "__spec__", None) is None:
            raise AgentNotSendable(
                f"Agent must be a module-level function: {_short(agent)} was defined in an interactive "
                "session, which worker processes cannot load; put it in a module and import it from there"
            )
    return blob


def needs_main(blob: bytes) -> bool:
    """Whether a pickled agent refers to the main script (its workers must run it first)."""
    return b"__main__" in blob


def _short(agent: Any) -> str:
    module = getattr(agent, "__module__", None)
    qualname = getattr(agent, "__qualname__", None)
    if module and qualname:
        return f"{module}:{qualname}"
    return f"a {type(agent).__name__} object"


def agent_module(path: str) -> str:
    return split_import_path(path)[0]


async def run_agent_turn(agent: Any, message: ChatMessage, state: list[ChatMessage]) -> Any:
    """Run one turn in whatever shape the agent has; sync code runs in a thread."""
    import asyncio

    adapted = framework_adapter(agent)
    if adapted is not None:
        agent = adapted
    if isinstance(agent, ServableAgent):
        return await agent.run_turn(message, state)
    if inspect.iscoroutinefunction(agent) or inspect.iscoroutinefunction(getattr(agent, "__call__", None)):
        return await agent(message, state)
    result = await asyncio.to_thread(agent, message, state)
    if inspect.isawaitable(result):
        result = await result
    return result


def check_turn_result(result: Any) -> tuple[ChatMessage, list[ChatMessage]]:
    """Accept ``(ChatMessage, list[ChatMessage])`` (dicts that validate are fine too).

    A value of the wrong outer shape is reported first in the reference product's words
    ("Agent must return a (response, state) tuple, got str"), which clients may match on,
    then in ours, which show the value."""
    expected = "expected a (ChatMessage, list[ChatMessage]) tuple"
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise TypeError(
            f"Agent must return a (response, state) tuple, got {type(result).__name__}: "
            f"Agent returned {_describe(result)}; {expected}"
        )
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

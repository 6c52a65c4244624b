"""Serve agents built with other frameworks, as they are.

``motus serve start myapp:agent`` detects the agent's framework from its type (see
:func:`motus.serve.agents.framework_adapter`) and wraps it in an adapter from this package:

- :mod:`motus.frameworks.openai_agents`: an OpenAI Agents SDK ``agents.Agent``
  (``pip install 'motus[openai-agents]'``);
- :mod:`motus.frameworks.pydantic_ai`: a Pydantic AI ``pydantic_ai.Agent`` whose output types
  include ``DeferredToolRequests`` (``pip install 'motus[pydantic-ai]'``).

:mod:`motus.frameworks.anthropic` holds the Anthropic SDK's tool runner with approvals
(``ToolRunner``, built by the user instead of the SDK's ``tool_runner``, so nothing is
detected; ``pip install 'motus[anthropic]'``). Its tool calls are journaled by the same
:func:`motus.durable.journal.tool_call` as ``@tool``'s.

Each adapter is a :class:`~motus.serve.agents.ServableAgent`: a turn runs the framework's
agent on the session's history, turns each tool approval the framework asks for into a
``tool_approval`` interrupt, and continues the framework's own run with the answers. Every
run segment is a ``motus.step`` whose recorded value is the framework's own pause state, so a
parked or restarted turn continues without calling the model or a tool again. The frameworks
are imported only when such an agent is served.
"""

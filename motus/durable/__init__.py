"""Durable execution: what runs inside a worker process to make a turn replayable.

- :mod:`motus.durable.records`: the wire records between the server and a worker (``Job``,
  ``Interrupt``, ``Record``, ``Ack``, ``Resume``, ``Result``, ``Failure``), the journal's
  ``JournalEntry``, and the checks that a message read from a worker has the right shape;
- :mod:`motus.durable.journal`: the turn's journal (record, replay, divergence),
  ``motus.step`` and the journaled tool call shared by ``@tool`` and the framework runners;
- :mod:`motus.durable.interrupt`: ``interrupt()`` and the worker's end of the pipe (its
  channel, the session's grants);
- :mod:`motus.durable.jsonshape`: the limits on the shape of JSON crossing the API or the pipe.

Models, tools, agents and framework adapters import this package, never ``motus.serve``; it
imports nothing of ``motus.serve`` (``tests/unit/test_layering.py`` checks both). The old
paths (``motus.serve.journal``, ``protocol``, ``interrupt``, ``jsonshape``) re-export it.
Nothing is imported here, so importing one module of the package loads only what it needs.
"""

"""``@tool``: the schema the model sees, argument validation, and the invoke path."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Annotated, Literal, Optional

import pytest
from pydantic import BaseModel, Field

from motus.tools import Tool, tool
from motus.tools.decorator import render_result
from motus.tools.schema import split_docstring


def run(coro):  # noqa: ANN001, ANN201 - tiny helper
    return asyncio.run(coro)


class Address(BaseModel):
    street: str
    zip_code: Annotated[str, Field(description="Postal code")]


def test_bare_decorator_uses_name_docstring_and_type_hints() -> None:
    @tool
    def greet(name: str, times: int = 1) -> str:
        """Greet someone.

        Args:
            name: who to greet.
            times: how often.
        """
        return " ".join([f"hi {name}"] * times)

    assert isinstance(greet, Tool)
    assert greet.name == "greet"
    assert greet.description == "Greet someone."
    assert greet.parameters == {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "name": {"type": "string", "description": "who to greet."},
            "times": {"type": "integer", "default": 1, "description": "how often."},
        },
        "required": ["name"],
    }
    assert greet.openai_schema()["type"] == "function"
    assert greet.openai_schema()["function"]["name"] == "greet"


def test_schema_covers_the_common_type_hints() -> None:
    @tool(name="kitchen_sink", description="Everything at once.")
    async def sink(
        text: Annotated[str, "Some text"],
        ratio: float,
        flag: bool,
        maybe: Optional[int],  # noqa: UP007 - the spelling under test
        tags: list[str],
        scores: dict[str, float],
        mode: Literal["fast", "slow"] = "fast",
        address: Address | None = None,
    ) -> None:
        return None

    props = sink.parameters["properties"]
    assert sink.name == "kitchen_sink" and sink.description == "Everything at once."
    assert props["text"] == {"type": "string", "description": "Some text"}
    assert props["ratio"] == {"type": "number"}
    assert props["flag"] == {"type": "boolean"}
    assert props["maybe"] == {"anyOf": [{"type": "integer"}, {"type": "null"}]}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}}
    assert props["scores"] == {"type": "object", "additionalProperties": {"type": "number"}}
    assert props["mode"] == {"enum": ["fast", "slow"], "type": "string", "default": "fast"}
    # Nested models are inlined (no $ref), titles dropped, descriptions kept.
    address = props["address"]["anyOf"][0]
    assert address["properties"]["zip_code"] == {"type": "string", "description": "Postal code"}
    assert address["required"] == ["street", "zip_code"]
    assert "$defs" not in sink.parameters
    assert sorted(sink.parameters["required"]) == ["flag", "maybe", "ratio", "scores", "tags", "text"]


def test_no_titles_or_refs_leak_into_the_schema() -> None:
    @tool
    def place(address: Address) -> str:
        """Place an order."""
        return address.street

    text = json.dumps(place.parameters)
    assert "$ref" not in text and '"title"' not in text


def test_schema_from_a_pydantic_model() -> None:
    class Move(BaseModel):
        """Move a file."""

        source: str
        destination: str = Field(description="Where to")

    @tool(schema=Move)
    def move(request: Move) -> str:
        return f"{request.source}->{request.destination}"

    @tool(schema=Move)
    def move_kwargs(source: str, destination: str) -> str:
        return f"{source}=>{destination}"

    assert move.description == "Move a file."
    assert move.parameters["required"] == ["source", "destination"]
    assert move.parameters["properties"]["destination"]["description"] == "Where to"
    assert run(move.invoke({"source": "a", "destination": "b"})) == "a->b"
    assert run(move_kwargs.invoke('{"source": "a", "destination": "b"}')) == "a=>b"


def test_tool_applied_to_an_existing_function_leaves_it_callable() -> None:
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    adder = tool(add, name="plus")
    assert adder.name == "plus" and adder.description == "Add two numbers."
    assert adder(2, 3) == 5  # calling the Tool calls the function directly
    assert run(adder.invoke({"a": "2", "b": 3})) == "5"  # coerced, rendered as JSON


def test_sync_tools_run_off_the_event_loop_and_async_tools_on_it() -> None:
    loop_threads: list[str] = []

    @tool
    def blocking() -> str:
        """Sync."""
        return threading.current_thread().name

    @tool
    async def non_blocking() -> str:
        """Async."""
        return threading.current_thread().name

    async def both() -> tuple[str, str]:
        loop_threads.append(threading.current_thread().name)
        return await blocking.invoke({}), await non_blocking.invoke(None)

    sync_thread, async_thread = run(both())
    assert async_thread == loop_threads[0]
    assert sync_thread != loop_threads[0]


def test_arguments_are_coerced_before_the_call() -> None:
    seen = {}

    @tool
    def record(count: int, ratio: float, flag: bool, tags: list[str], mode: Literal["a", "b"] = "a") -> str:
        """Record."""
        seen.update(count=count, ratio=ratio, flag=flag, tags=tags, mode=mode)
        return "ok"

    assert run(record.invoke('{"count": "3", "ratio": "0.5", "flag": "true", "tags": ["x"], "mode": "b"}')) == "ok"
    assert seen == {"count": 3, "ratio": 0.5, "flag": True, "tags": ["x"], "mode": "b"}


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ("{not json", "Invalid arguments for record: arguments are not valid JSON"),
        ("[1, 2]", "Invalid arguments for record: arguments must be a JSON object, got list"),
        ("{}", "Invalid arguments for record: count: Field required"),
        ('{"count": "many"}', "Invalid arguments for record: count: Input should be a valid integer"),
        ('{"count": 1, "extra": true}', "Invalid arguments for record: extra: Extra inputs are not permitted"),
    ],
)
def test_bad_arguments_come_back_as_an_error_result(arguments: str, expected: str) -> None:
    calls = []

    @tool
    def record(count: int) -> str:
        """Record."""
        calls.append(count)
        return "ok"

    result = json.loads(run(record.invoke(arguments)))
    assert set(result) == {"error"}
    assert result["error"].startswith(expected), result
    assert calls == []


def test_an_exception_in_the_tool_is_reported_to_the_model() -> None:
    @tool
    async def explode(path: str) -> str:
        """Fail."""
        raise FileNotFoundError(f"no file {path}")

    assert json.loads(run(explode.invoke({"path": "x"}))) == {"error": "explode failed: FileNotFoundError: no file x"}


def test_eof_from_a_cancelled_turn_is_not_swallowed() -> None:
    @tool
    async def wait_for_person() -> str:
        """Pause."""
        raise EOFError("Worker pipe closed")

    with pytest.raises(EOFError, match="Worker pipe closed"):
        run(wait_for_person.invoke({}))


def test_results_are_rendered_as_text_for_the_model() -> None:
    assert render_result("plain") == "plain"
    assert json.loads(render_result({"a": [1, 2]})) == {"a": [1, 2]}
    assert json.loads(render_result(Address(street="s", zip_code="1"))) == {"street": "s", "zip_code": "1"}
    assert render_result(None) == "null"


def test_docstring_sections_are_split() -> None:
    description, params = split_docstring(
        """Delete a file.

        Longer explanation.

        Args:
            path: the file
                to delete.
            force (bool): skip checks.

        Returns:
            What happened.
        """
    )
    assert description == "Delete a file.\n\nLonger explanation."
    assert params == {"path": "the file to delete.", "force": "skip checks."}


def test_requires_approval_prepends_the_gate_before_user_guardrails() -> None:
    def mine(path: str) -> None:
        return None

    @tool(requires_approval=True, input_guardrails=[mine])
    def delete(path: str) -> str:
        """Delete."""
        return path

    assert len(delete.input_guardrails) == 2
    assert delete.input_guardrails[0].__name__ == "approve_delete"
    assert delete.input_guardrails[1] is mine


def test_a_gated_tool_outside_a_worker_raises_instead_of_running() -> None:
    """The approval interrupt is framework machinery: its failure must not look like a tool error."""
    ran = []

    @tool(requires_approval=True)
    def delete(path: str) -> str:
        """Delete."""
        ran.append(path)
        return path

    with pytest.raises(RuntimeError, match="outside motus serve worker"):
        run(delete.invoke({"path": "x"}))
    assert ran == []


def test_schema_must_be_a_pydantic_model() -> None:
    with pytest.raises(TypeError, match="schema= must be a pydantic BaseModel"):
        tool(lambda: None, schema=dict)  # type: ignore[arg-type]


def test_errors_raised_by_interrupt_inside_a_tool_propagate() -> None:
    """``interrupt()``'s own errors end the turn, as the spec says; they are not tool failures."""
    from motus.serve.interrupt import interrupt

    @tool
    async def ask() -> str:
        """Ask."""
        return await interrupt({"type": "custom"})

    with pytest.raises(RuntimeError, match="outside motus serve worker"):
        run(ask.invoke({}))


def test_a_tool_call_in_a_turn_is_journaled_and_an_unrecordable_result_is_kept_as_its_text() -> None:
    """``Tool.invoke`` records through ``motus.durable.journal.tool_call`` (one TOOL record,
    keyed by name and validated arguments); a result the journal cannot pickle is recorded
    as the text the model reads, while outside a turn the output guardrails get the object."""
    from motus.durable import journal as journal_module
    from motus.durable.journal import Journal, digest, unpack
    from motus.durable.records import TOOL

    lock = threading.Lock()
    seen: list[object] = []

    def note(result: object) -> None:
        seen.append(result)

    @tool(output_guardrails=[note])
    def make(n: int) -> object:
        """Make one."""
        return lock

    class Channel:
        def __init__(self) -> None:
            self.records: list = []

        def send(self, message: object) -> None:
            self.records.append(message)

    assert run(make.invoke({"n": "2"})) == render_result(lock)
    assert seen == [lock]

    channel = Channel()
    journal_module._install(Journal((), channel))  # type: ignore[arg-type]
    try:
        assert run(make.invoke({"n": "2"})) == render_result(lock)
    finally:
        journal_module._install(None)
    assert seen == [lock, render_result(lock)]
    done = [record.entry for record in channel.records if record.entry.done]
    assert [(entry.kind, entry.key, entry.label) for entry in done] == [(TOOL, f"make:{digest({'n': 2})}", "make")]
    assert unpack(done[0].value) == render_result(lock)

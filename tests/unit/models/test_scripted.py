"""``ScriptedChatClient``: a model client from a script, offline (pure: no server)."""

from __future__ import annotations

import pytest

from motus.models import ChatMessage, ScriptedChatClient, tool_calls
from motus.models.base import completion_from_record, completion_record


def ask(client: ScriptedChatClient, *messages: ChatMessage) -> ChatMessage:
    return client.chat(model="m", messages=list(messages)).message


USER = ChatMessage.user_message("clean up")


def test_a_list_answers_by_how_many_calls_the_turn_made_and_repeats_its_last() -> None:
    client = ScriptedChatClient([tool_calls(("delete_file", {"path": "a"}), ("move_file", {"to": "b"}), text="Both."), "Done."])
    first = ask(client, USER)
    assert first.content == "Both." and [(c.id, c.function.name, c.function.arguments) for c in first.tool_calls or []] == [
        ("call_1", "delete_file", '{"path": "a"}'), ("call_2", "move_file", '{"to": "b"}')]
    after_tools = [USER, first, ChatMessage.tool_message("ok", tool_call_id="call_1"), ChatMessage.tool_message("ok", tool_call_id="call_2")]
    assert ask(client, *after_tools).content == "Done."
    assert ask(client, *after_tools, ChatMessage.assistant_message("x"), ChatMessage.tool_message("y", tool_call_id="z")).content == "Done."
    # A new turn (a user message after the history) starts the script again: no state kept.
    assert ask(client, *after_tools, ChatMessage.assistant_message("Done."), USER).content == "Both."


def test_a_function_gets_the_messages_and_the_tools() -> None:
    seen = []
    client = ScriptedChatClient(lambda messages, tools: seen.append((len(messages), tools)) or {"role": "user", "content": "hi"})
    reply = client.chat(model="m", messages=[USER], tools=[{"name": "t"}])
    assert (reply.message.role, reply.message.content, reply.model, seen) == ("assistant", "hi", "m", [(1, [{"name": "t"}])])


@pytest.mark.parametrize("script, error", [([], ValueError), ([5], TypeError), ([{"role": "nobody"}], ValueError)])
def test_a_bad_script_is_refused_when_the_client_is_made(script: list, error: type) -> None:
    with pytest.raises(error):
        ScriptedChatClient(script)


def test_a_reply_round_trips_through_its_journal_record_in_the_openai_shape() -> None:
    client = ScriptedChatClient([tool_calls(("touch", {"path": "x"}), text="I'll touch x.")])
    completion = client.chat(model="m", messages=[USER])
    record = completion_record(completion)
    assert record["choices"][0]["message"]["content"] == "I'll touch x."
    assert record["choices"][0]["message"]["tool_calls"][0]["function"] == {"name": "touch", "arguments": '{"path": "x"}'}
    again = completion_from_record(record)
    assert (again.message, again.model, again.finish_reason, again.usage) == (completion.message, "m", "tool_calls", completion.usage)


def test_a_reply_whose_usage_is_the_providers_dict_is_recorded() -> None:
    class Own:
        message = {"role": "assistant", "content": "hi"}
        usage = {"prompt_tokens": 3, "completion_tokens": 4}

    record = completion_record(Own())  # type: ignore[arg-type]
    assert record["usage"] == {"prompt_tokens": 3, "completion_tokens": 4}
    assert completion_from_record(record).usage.total_tokens == 7

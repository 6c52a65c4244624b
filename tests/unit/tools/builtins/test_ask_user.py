"""``ask_user_question``: the spec's schema, and validation before any pause."""

from __future__ import annotations

import asyncio
import json

import pytest

from motus.tools.builtins.ask_user import AskUserQuestionInput, ask_user_question


def option(label: str, **extra: object) -> dict:
    return {"label": label, "description": f"about {label}", **extra}


def question(n_options: int = 2, **extra: object) -> dict:
    return {"question": "Which one?", "header": "Pick", "options": [option(f"o{i}") for i in range(n_options)], **extra}


def test_schema_matches_the_spec_table() -> None:
    params = ask_user_question.parameters
    assert ask_user_question.name == "ask_user_question"
    assert params["required"] == ["questions"]
    questions = params["properties"]["questions"]
    assert (questions["minItems"], questions["maxItems"]) == (1, 4)
    item = questions["items"]
    assert sorted(item["properties"]) == ["header", "multiSelect", "options", "question"]
    assert sorted(item["required"]) == ["header", "options", "question"]
    assert item["properties"]["multiSelect"]["default"] is False
    options = item["properties"]["options"]
    assert (options["minItems"], options["maxItems"]) == (2, 4)
    assert sorted(options["items"]["properties"]) == ["description", "label", "markdown"]
    assert sorted(options["items"]["required"]) == ["description", "label"]
    assert options["items"]["properties"]["markdown"]["anyOf"] == [{"type": "string"}, {"type": "null"}]


def test_defaults_fill_in() -> None:
    parsed = AskUserQuestionInput.model_validate({"questions": [question()]})
    assert parsed.questions[0].multiSelect is False
    assert parsed.questions[0].options[0].markdown is None


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        ({"questions": []}, "questions: List should have at least 1 item"),
        ({"questions": [question()] * 5}, "questions: List should have at most 4 items"),
        ({"questions": [question(1)]}, "questions.0.options: List should have at least 2 items"),
        ({"questions": [question(5)]}, "questions.0.options: List should have at most 4 items"),
        ({"questions": [{"question": "Q?", "options": [option("a"), option("b")]}]}, "questions.0.header: Field required"),
        ({"questions": [question(2, multiSelect="often")]}, "questions.0.multiSelect: Input should be a valid boolean"),
        ({"questions": [{**question(), "options": [{"label": "a"}, option("b")]}]}, "questions.0.options.0.description: Field required"),
        ({}, "questions: Field required"),
    ],
)
def test_invalid_question_sets_return_the_error_without_pausing(arguments: dict, fragment: str) -> None:
    # Outside a worker a pause would raise RuntimeError; an error *result* proves no pause was tried.
    result = json.loads(asyncio.run(ask_user_question.invoke(arguments)))
    assert set(result) == {"error"}
    assert fragment in result["error"], result


@pytest.mark.parametrize("count", [1, 4])
def test_valid_question_sets_go_on_to_pause(count: int) -> None:
    questions = [question(2 + i % 3, question=f"Q{i}?") for i in range(count)]
    questions[0]["options"][0]["markdown"] = "```py\nprint(1)\n```"
    questions[-1]["multiSelect"] = True
    # Outside a worker the pause itself raises: the call got past validation and tried to pause.
    with pytest.raises(RuntimeError, match="outside motus serve worker"):
        asyncio.run(ask_user_question.invoke({"questions": questions}))

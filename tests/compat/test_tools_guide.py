"""The tools and human-in-the-loop guides: the names their code and tests reach for."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

import motus.guardrails
import motus.tools
import motus.tools.approval
from motus.tools import tool
from motus.tools.builtins.ask_user import AskUserQuestionInput, AskUserQuestionSchema, ask_user_question
from tests.compat.agents import QUESTION, delete_file


def test_builtin_tools_carry_their_tool_name() -> None:
    assert ask_user_question.__tool_name__ == "ask_user_question"
    assert delete_file.__tool_name__ == "delete_file"

    @tool(name="renamed")
    def original() -> None:
        """Nothing."""

    assert original.__tool_name__ == "renamed" == original.name
    assert original.__name__ == "original"  # the function's own name is kept


def test_ask_user_question_schema_is_the_input_model() -> None:
    assert AskUserQuestionSchema is AskUserQuestionInput
    parsed = AskUserQuestionSchema.model_validate({"questions": [QUESTION]})
    assert parsed.questions[0].options[1].label == "B"
    with pytest.raises(ValidationError):
        AskUserQuestionSchema.model_validate({"questions": [QUESTION] * 5})  # 1 to 4 questions


def test_tool_rejected_is_one_class_wherever_it_is_imported_from() -> None:
    assert motus.guardrails.ToolRejected is motus.tools.ToolRejected is motus.tools.approval.ToolRejected
    assert str(motus.guardrails.ToolRejected("user said no")) == "user said no"
    assert "ToolRejected" in motus.guardrails.__all__

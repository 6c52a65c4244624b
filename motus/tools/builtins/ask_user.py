"""``ask_user_question``: let the model ask the person 1 to 4 multiple-choice questions.

The arguments are validated against :class:`AskUserQuestionInput` (1 to 4 questions,
each with 2 to 4 options, enforced) *before* anything pauses: an invalid call returns
the validation error to the model as ``{"error": ...}`` and the turn does not stop.
A valid call pauses the turn with::

    interrupt({"type": "user_input", "questions": [...]})

(``multiSelect`` always present, ``markdown`` only when set), and the value the client
resumes with, ``{"answers": {"<question text>": "<label or free text>", ...}}``, is
what the tool returns, so the model reads it as the JSON tool result. A resume value
that is not an object is wrapped as ``{"answers": {}, "response": <value>}`` so the
model always gets an object it can reason about.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from motus.tools.decorator import tool

__all__ = ["QuestionOption", "Question", "AskUserQuestionInput", "AskUserQuestionSchema", "ask_user_question"]


class QuestionOption(BaseModel):
    """One choice the person can pick."""

    model_config = ConfigDict(extra="forbid")

    label: str = Field(description="Display text of the choice, 1 to 5 words.")
    description: str = Field(description="What choosing this option means.")
    markdown: str | None = Field(
        default=None,
        description="Optional code snippet or technical preview the frontend shows in a monospace box.",
    )


class Question(BaseModel):
    """One question with predefined options."""

    model_config = ConfigDict(extra="forbid")

    question: str = Field(description="The full question text, ending with '?'.")
    header: str = Field(description="Short label for the UI (under about 12 characters).")
    multiSelect: bool = Field(default=False, description="True when several options may be chosen together.")
    options: list[QuestionOption] = Field(min_length=2, max_length=4, description="2 to 4 choices.")


class AskUserQuestionInput(BaseModel):
    """Ask the user 1 to 4 structured questions with predefined options, when you need
    information or a decision from them before you can continue. The user may also
    answer in free text. Returns {"answers": {"<question text>": "<answer>"}}."""

    model_config = ConfigDict(extra="forbid")

    questions: list[Question] = Field(min_length=1, max_length=4, description="1 to 4 questions to ask.")


#: The reference product's name for the input model.
AskUserQuestionSchema = AskUserQuestionInput


@tool(name="ask_user_question", schema=AskUserQuestionInput)
async def ask_user_question(request: AskUserQuestionInput) -> dict[str, Any]:
    from motus.durable.interrupt import interrupt  # worker-only machinery, imported when needed

    questions = [question.model_dump(exclude_none=True) for question in request.questions]
    value = await interrupt({"type": "user_input", "questions": questions})
    if isinstance(value, dict):
        return value
    return {"answers": {}, "response": value}

"""Guardrails: checks on what goes to the model and on what comes back.

An input guardrail is ``fn(text: str) -> str | None``: ``None`` lets the user message pass,
a string replaces its text. An output guardrail is ``fn(message: AiMessage) -> AiMessage |
str | None``: ``None`` lets the answer pass, a message or a string replaces it. Either may
raise ``GuardrailError(reason)`` to refuse: the call raises it and records nothing (an
input refusal never reaches the model). An output guardrail may raise ``Reprompt(reason)``
to have the model asked again with the reason; neither the rejected answer nor the reason is
recorded, and after ``max_output_retries`` reprompts the call raises ``GuardrailError``.

Guardrails go on the service (``ai_service(input_guardrails=[...],
output_guardrails=[...])``) or on one method (``@guardrails(input=[...], output=[...])``);
a method's run after the service's. They may be ``async def``, for async methods only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final, TypeAlias, TypeVar

from .messages import AiMessage

__all__ = ["InputGuardrail", "OutputGuardrail", "guardrails"]

InputGuardrail: TypeAlias = Callable[[str], "str | Awaitable[str | None] | None"]
"""Checks a user message's text: ``None`` passes, a string replaces the text."""

OutputGuardrail: TypeAlias = Callable[
    [AiMessage], "AiMessage | str | Awaitable[AiMessage | str | None] | None"
]
"""Checks an answer: ``None`` passes, a message or a string replaces it."""

GUARDRAILS_ATTRIBUTE: Final = "__aiservices_guardrails__"

_F = TypeVar("_F", bound=Callable[..., Any])


def guardrails(
    *,
    input: Sequence[InputGuardrail] = (),  # noqa: A002 - the name design.md gives
    output: Sequence[OutputGuardrail] = (),
) -> Callable[[_F], _F]:
    """Give one interface method guardrails of its own, run after the service's."""
    checked_input = tuple(input)
    checked_output = tuple(output)
    for kind, given in (("input", checked_input), ("output", checked_output)):
        for guardrail in given:
            if not callable(guardrail):
                raise TypeError(f"@guardrails({kind}=[...]) takes callables, not {guardrail!r}")

    def mark(method: _F) -> _F:
        setattr(method, GUARDRAILS_ATTRIBUTE, (checked_input, checked_output))
        return method

    return mark

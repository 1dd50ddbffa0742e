"""Guardrails: checks on what goes to the model and on what comes back.

An input guardrail is ``fn(text: str) -> str | None``: ``None`` lets the user message pass,
a string replaces its text. An output guardrail is ``fn(message: AiMessage) -> AiMessage |
str | None``: ``None`` lets the answer pass, a message or a string replaces it. Either may
raise ``GuardrailError(reason)`` to refuse: the call raises it and records nothing (an
input refusal never reaches the model). An output guardrail may raise ``Reprompt(reason)``
to have the model asked again with the reason; neither the rejected answer nor the reason is
recorded, and after ``max_output_retries`` reprompts the call raises ``GuardrailError``.

Guardrails go on the service (``ai_service(input_guardrails=[...],
output_guardrails=[...])``), on the interface class or on one method (``@guardrails(input=[...],
output=[...])``); they run in that order. They may be ``async def``, for async methods only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Final, TypeAlias, TypeVar

from .messages import AiMessage
from .prompts import check_decorated

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
    """Give one interface method guardrails of its own, run after the service's.

    On the interface class, they apply to every method, after the service's and before each
    method's own. Stacked, they run in the order written, the top one's first.
    """
    checked_input = _listed("input", input)
    checked_output = _listed("output", output)

    def mark(target: _F) -> _F:
        check_decorated(target, "@guardrails(...)")
        # Below this decorator, applied first: its guardrails run after these. A class's
        # own only: those of the interfaces it extends are gathered when it is planned.
        below_input, below_output = getattr(target, "__dict__", {}).get(
            GUARDRAILS_ATTRIBUTE, ((), ())
        )
        setattr(
            target,
            GUARDRAILS_ATTRIBUTE,
            (checked_input + below_input, checked_output + below_output),
        )
        return target

    return mark


def not_a_list(given: object) -> bool:
    """Whether ``given``, passed where a list belongs, is one item instead (a function, an
    object, a string)."""
    return callable(given) or isinstance(given, (str, bytes)) or not isinstance(given, Iterable)


def _listed(kind: str, given: object) -> tuple[Any, ...]:
    if not_a_list(given):
        raise TypeError(
            f"@guardrails({kind}=...) takes a list of guardrails, not {given!r:.60}; "
            f"write @guardrails({kind}=[check])"
        )
    listed: tuple[Any, ...] = tuple(given)  # type: ignore[arg-type]  # a list, checked above
    for guardrail in listed:
        if not callable(guardrail):
            raise TypeError(f"@guardrails({kind}=[...]) takes callables, not {guardrail!r:.60}")
    return listed

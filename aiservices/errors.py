"""Errors raised by aiservices.

```
AiServiceError
 ├── InterfaceError    (also TypeError)   the Protocol cannot become a service
 ├── OutputParseError  (also ValueError)  the model's answer never parsed
 ├── ToolLimitError                       too many tool rounds in one call
 ├── GuardrailError                       a guardrail refused the input or the answer
 └── IncompleteResponseError              a streamed answer ended before its last event
```

``Reprompt`` is not an error a call raises: an output guardrail raises it to have the
model asked again.

Provider and store errors keep their own types (an ``openai.RateLimitError``, a
``sqlite3.OperationalError``) and are never wrapped or swallowed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

__all__ = [
    "AiServiceError",
    "GuardrailError",
    "IncompleteResponseError",
    "InterfaceError",
    "OutputParseError",
    "Reprompt",
    "ToolLimitError",
]


class AiServiceError(Exception):
    """Base class of every error aiservices raises itself."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled (sent to another process), an error comes back with its message and its
        # attributes, whatever its constructor's keyword arguments.
        return _remade, (type(self), self.args, self.__dict__)


def _remade(kind: type[AiServiceError], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    error = kind.__new__(kind)
    Exception.__init__(error, *args)
    error.__dict__.update(state)
    return error


class InterfaceError(AiServiceError, TypeError):
    """The interface cannot be turned into a service; raised when the service is built.

    ``problems`` lists every mistake found, each starting with ``Class.method(param)``.
    """

    def __init__(self, problems: str | Sequence[str]) -> None:
        self.problems: list[str] = [problems] if isinstance(problems, str) else list(problems)
        if len(self.problems) == 1:
            message = self.problems[0]
        else:
            message = f"{len(self.problems)} problems:\n" + "\n".join(
                f"  - {p}" for p in self.problems
            )
        super().__init__(message)


class OutputParseError(AiServiceError, ValueError):
    """The model's answer could not be parsed into the declared return type.

    ``raw_text`` is the last answer the model gave; ``attempts`` how many answers were tried.
    """

    retry_instruction: ClassVar[str] = "Answer again with JSON matching the schema."
    """What the parser's error text ends with when it is sent back to the model."""

    def __init__(self, message: str, *, raw_text: str | None, attempts: int = 1) -> None:
        # Whoever reads this error wants what went wrong, not what the model was told to do
        # about it: the instruction is left out.
        super().__init__(message.rstrip().removesuffix(self.retry_instruction).rstrip())
        self.raw_text = raw_text
        self.attempts = attempts


class ToolLimitError(AiServiceError):
    """The model kept asking for tools past ``max_tool_invocations``; no tool of that answer ran."""

    def __init__(self, message: str, *, limit: int) -> None:
        super().__init__(message)
        self.limit = limit


class GuardrailError(AiServiceError):
    """A guardrail refused the call's input or its answer; nothing of the turn was recorded.

    ``reason`` is the guardrail's own words; ``str(error)`` is ``message`` when given (it
    says where the refusal happened), else the reason.
    """

    def __init__(self, reason: str, *, message: str | None = None) -> None:
        super().__init__(reason if message is None else message)
        self.reason = reason


class Reprompt(Exception):
    """Raised by an output guardrail: ask the model again, telling it ``reason``.

    Neither the rejected answer nor the reason is recorded; after ``max_output_retries``
    reprompts the call raises ``GuardrailError``.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class IncompleteResponseError(AiServiceError):
    """An answer that ended before it was whole: a stream without the provider's final
    event, or tool calls cut at the output token limit.

    The answer may be cut short (a dropped connection, a proxy that closed the stream, a
    server that answered a stream request with a plain body, a tool call's arguments cut by
    ``max_output_tokens``), so the call fails and records nothing instead of taking part of
    an answer for the whole.
    """

"""What a typed event stream yields: ``Iterator[StreamEvent]`` / ``AsyncIterator[StreamEvent]``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from ._result import Result
from .messages import ToolExecutionRequest
from .tools import ToolExecution  # at run time: pydantic reads the events' fields

__all__ = ["StreamEvent", "TextDelta", "ToolCallFinished", "ToolCallStarted", "TurnCompleted"]


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of the answer's text, as the model wrote it."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolCallStarted:
    """A tool the model asked for is about to run."""

    request: ToolExecutionRequest


@dataclass(frozen=True, slots=True)
class ToolCallFinished:
    """A tool ran; ``execution`` holds its request and its result (or its error's text)."""

    execution: ToolExecution


@dataclass(frozen=True, slots=True)
class TurnCompleted:
    """The last event: the turn is recorded, and ``result`` is the call's ``Result[str]``."""

    result: Result[str]


StreamEvent: TypeAlias = TextDelta | ToolCallStarted | ToolCallFinished | TurnCompleted
"""Any event of a typed event stream."""

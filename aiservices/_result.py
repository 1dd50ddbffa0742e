"""``Result[T]``: a typed answer together with what the call cost and did."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Generic, TypeVar

from pydantic import WithJsonSchema

from .messages import AiMessage
from .models import TokenUsage
from .tools import ToolExecution  # at run time: pydantic (a FastAPI response) resolves it

__all__ = ["Result"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Result(Generic[T]):
    """A method's answer with its metadata; declare ``-> Result[T]`` to get one.

    ``token_usage`` is summed over every model round of the call (``None`` when the model
    reported none); ``tool_executions`` lists each tool request with its result, in order;
    ``memory_id`` is the conversation the call used (a new uuid when an optional memory id
    was ``None``); ``sources`` the texts the service's retriever found for the call, in
    order (empty without a retriever).
    """

    content: T
    token_usage: TokenUsage | None = None
    finish_reason: str | None = None
    tool_executions: Sequence[ToolExecution] = field(default_factory=tuple)
    memory_id: Annotated[Hashable | None, WithJsonSchema({})] = None  # (any JSON value)
    ai_message: AiMessage | None = None
    sources: tuple[str, ...] = ()

"""Message helpers the store tests share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiservices.messages import ChatMessage, UserMessage, new_message_id


def user(text: str, **metadata: Any) -> UserMessage:
    """A user message with a fresh message id (unless one is given)."""
    return UserMessage(text, message_id=metadata.pop("message_id", new_message_id()), **metadata)


def texts(messages: Sequence[ChatMessage]) -> list[str | None]:
    """The text of each message, in order."""
    return [getattr(m, "text", None) for m in messages]

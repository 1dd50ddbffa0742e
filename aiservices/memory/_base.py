"""The memory seam: what a service needs from a conversation's memory."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import Protocol, TypeAlias, runtime_checkable

from ..messages import ChatMessage

__all__ = ["DEFAULT_MEMORY_ID", "ChatMemory", "ChatMemoryProvider"]

DEFAULT_MEMORY_ID = "default"
"""The id of a memory made without one, and of a call whose method has no MemoryId."""


@runtime_checkable
class ChatMemory(Protocol):
    """The messages of one conversation that the model is shown."""

    @property
    def id(self) -> Hashable: ...

    def add(self, *messages: ChatMessage) -> None:
        """Add messages in order, as one write; the window's rules then apply."""
        ...

    def messages(self) -> list[ChatMessage]:
        """The messages in the window now, oldest first."""
        ...

    def clear(self) -> None:
        """Remove every message."""
        ...

    def set(self, messages: Iterable[ChatMessage]) -> None:
        """Replace the messages (the window's rules apply)."""
        ...


ChatMemoryProvider: TypeAlias = Callable[[Hashable], ChatMemory]
"""Gives each memory id its own memory."""

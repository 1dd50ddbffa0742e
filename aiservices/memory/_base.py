"""The memory seam: what a service needs from a conversation's memory."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Protocol, TypeAlias, runtime_checkable

from ..messages import ChatMessage

__all__ = ["DEFAULT_MEMORY_ID", "ChatMemory", "ChatMemoryProvider", "is_own_store", "own_store"]

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


# The memory id is Any: a provider annotated with the ids it is given (`memory_id: str`)
# is one too.
ChatMemoryProvider: TypeAlias = Callable[[Any], ChatMemory]
"""Gives each memory id its own memory."""


# Stores a memory made for itself, when it was given none: no other memory writes to them.
_own: weakref.WeakSet[object] = weakref.WeakSet()


def own_store(store: object) -> None:
    """Note ``store`` as one a memory made for itself alone."""
    _own.add(store)


def is_own_store(store: object) -> bool:
    """Whether ``store`` is one a memory made for itself alone."""
    try:
        return store in _own
    except TypeError:  # (a store that can't be weakly referenced was never noted)
        return False

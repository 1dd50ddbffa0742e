"""The store seam: where a memory keeps its messages."""

from __future__ import annotations

import functools
from collections.abc import Collection, Hashable, Sequence
from typing import Any, Protocol, runtime_checkable

from ..errors import AiServiceError
from ..messages import ChatMessage

__all__ = [
    "AsyncChatMemoryStore",
    "ChatMemoryStore",
    "ConcurrentChangeError",
    "IncrementalChatMemoryStore",
    "memory_id_of",
    "store_key",
]


@runtime_checkable
class ChatMemoryStore(Protocol):
    """Keeps each conversation's messages. Unknown ids read as ``[]``; deleting one is a no-op."""

    def get_messages(self, memory_id: Hashable) -> list[ChatMessage]: ...

    def update_messages(self, memory_id: Hashable, messages: Sequence[ChatMessage]) -> None:
        """Make the stored conversation equal to ``messages``."""
        ...

    def delete_messages(self, memory_id: Hashable) -> None: ...


@runtime_checkable
class IncrementalChatMemoryStore(ChatMemoryStore, Protocol):
    """A store that applies a memory's changes without rewriting the conversation.

    Memories use ``apply_changes`` when a store has it, so that a writer that had not
    seen another writer's messages (another process, say) never erases them.

    A store that also has ``get_messages_since(memory_id, since) -> (messages, since)``
    may take a ``since=`` keyword in ``apply_changes``: the ``since`` of the read (or of the
    checked write) the memory planned this write on. If another writer has appended to the
    conversation or cleared it (``delete_messages``, ``forget``) since, the store writes
    nothing and raises `ConcurrentChangeError`; the memory then reads again and plans the
    write anew, so that its window's rules hold over what every writer stored. (A write that
    only removes messages need not be detected: it can't push a window over its limit.)
    Such an ``apply_changes`` returns the ``since`` for the next read and checked write;
    ``since=None`` writes unchecked.
    """

    def apply_changes(
        self,
        memory_id: Hashable,
        *,
        appended: Sequence[ChatMessage],
        removed: Collection[str],
    ) -> None:
        """Atomically append ``appended`` after every stored message and remove the stored
        messages whose ``message_id`` is in ``removed``; messages appended meanwhile by
        other writers are kept. Every appended message carries a ``message_id``."""
        ...


class ConcurrentChangeError(AiServiceError, RuntimeError):
    """Another writer changed the conversation since the read a checked write was planned
    on; nothing was written. Memories handle it by reading again: a caller never sees it."""

    def __init__(self, memory_id: Hashable) -> None:
        super().__init__(
            f"conversation {memory_id!r} was changed by another writer since it was read; "
            "nothing was written: read it again and plan the write on what it holds now"
        )
        self.memory_id = memory_id


_TYPED = "\x1f"


def store_key(memory_id: Hashable) -> str:
    """The text key a store files a memory id under, one-to-one.

    Strings are their own key (unless they start with the unit separator ``\\x1f``); other
    ids (ints, UUIDs) are prefixed with it and their type name, so that ``1``, ``"1"`` and
    ``"int:1"`` stay different conversations.
    """
    if type(memory_id) is str:
        return _TYPED + memory_id if memory_id.startswith(_TYPED) else memory_id
    kind = type(memory_id)
    if kind is frozenset or kind is tuple:
        text: object = _ordered(memory_id)
    else:
        _check_text(memory_id)
        text = memory_id
    return f"{_TYPED}{kind.__name__}:{text}"


def _check_text(value: object) -> None:
    """Raise ``TypeError`` if ``value``'s text is its address: ``object``'s own repr."""
    kind = type(value)
    if kind.__repr__ is object.__repr__ and kind.__str__ is object.__str__:
        name = kind.__name__
        raise TypeError(
            f"a memory id is filed under its text, and {name} has neither __str__ nor "
            f"__repr__: its text is its address in memory, which another {name} may have "
            "later (it would continue this conversation) and an equal one never has. Pass "
            f"an id with a text of its own (a str, an int, a UUID), or give {name} a "
            "__repr__ made of its fields (a dataclass has one)"
        )


def _ordered(value: object) -> str:
    """``str(value)`` with the members of its frozensets in one order: a frozenset's own
    order follows hashes, which differ between processes for strings."""
    if type(value) is frozenset:
        if not value:
            return "frozenset()"
        members = sorted(_ordered_repr(m) for m in value)
        return "frozenset({" + ", ".join(members) + "})"
    if type(value) is tuple:
        items = [_ordered_repr(m) for m in value]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    return str(value)


def _ordered_repr(value: object) -> str:
    if type(value) is frozenset or type(value) is tuple:
        return _ordered(value)
    _check_text(value)
    return repr(value)


def memory_id_of(key: str) -> Hashable:
    """The memory id a store filed under ``key`` (see `store_key`), as it was given.

    ``str``, ``int``, ``float``, ``bool``, ``None``, ``UUID``, ``Decimal``, ``date`` and
    ``datetime`` ids come back as they were given, and tuples of literals (strings, numbers,
    ``None``, tuples); an id of another type comes back as its text.
    """
    if not key.startswith(_TYPED):
        return key
    rest = key[1:]
    if rest.startswith(_TYPED):
        return rest  # a str id that began with the separator
    name, _, text = rest.partition(":")
    if name == "str":
        return text  # a str subclass (an enum member, say)
    decode = _decoders().get(name)
    if decode is None:
        return text
    try:
        value: Hashable = decode(text)
    except (ValueError, LookupError, SyntaxError, TypeError, ArithmeticError, RecursionError):
        return text
    # Only a value that files under the same key is the id given; else it was another type.
    return value if type(value).__name__ == name and store_key(value) == key else text


@functools.cache
def _decoders() -> dict[str, Any]:
    import ast
    import datetime
    import decimal
    import uuid

    return {
        "int": int,
        "float": float,
        "bool": {"True": True, "False": False}.__getitem__,
        "NoneType": {"None": None}.__getitem__,
        "UUID": uuid.UUID,
        "Decimal": decimal.Decimal,
        "date": datetime.date.fromisoformat,
        "datetime": datetime.datetime.fromisoformat,
        "tuple": ast.literal_eval,
    }


@runtime_checkable
class AsyncChatMemoryStore(Protocol):
    """A store with native async I/O; async service calls use these methods when present.

    A store whose sync methods do no I/O at all may instead set ``is_blocking = False``;
    async calls then use its sync methods directly instead of a worker thread.
    """

    async def aget_messages(self, memory_id: Hashable) -> list[ChatMessage]: ...

    async def aupdate_messages(
        self, memory_id: Hashable, messages: Sequence[ChatMessage]
    ) -> None: ...

    async def adelete_messages(self, memory_id: Hashable) -> None: ...

    async def aapply_changes(
        self,
        memory_id: Hashable,
        *,
        appended: Sequence[ChatMessage],
        removed: Collection[str],
    ) -> None: ...

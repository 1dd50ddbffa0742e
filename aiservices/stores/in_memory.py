"""The default store: conversations kept in this process's memory."""

from __future__ import annotations

import threading
from collections.abc import Collection, Hashable, Sequence
from collections.abc import Set as AbstractSet
from typing import ClassVar

from ..messages import ChatMessage
from ._base import store_key
from ._common import check_appended, check_unique_ids, duplicate_id_error, with_message_ids

__all__ = ["InMemoryChatMemoryStore"]


class _Conversation:
    # messages[start:] is the conversation. Evicting from the front only moves start; the
    # dead head is cut off once it outgrows the rest, so a turn costs the same however long
    # the window. The ids mirror the messages: duplicate checks and removals need no scan.
    __slots__ = ("ids", "messages", "start")

    def __init__(self, messages: list[ChatMessage]) -> None:
        self.messages = messages
        self.start = 0
        self.ids: set[str | None] = {m.message_id for m in messages}


class InMemoryChatMemoryStore:
    """Keeps conversations in this process's memory: thread-safe, fast, gone at exit.

    Messages are immutable, so reads return a new list of the stored message objects.
    Within a conversation every message has its own ``message_id``: ``update_messages``
    gives one to a message that has none, and a duplicate id is a ``ValueError``.
    """

    is_blocking: ClassVar[bool] = False
    """Its methods do no I/O: async calls use them directly, not through a worker thread."""

    __slots__ = ("_conversations", "_lock")

    def __init__(self) -> None:
        self._conversations: dict[str, _Conversation] = {}
        self._lock = threading.Lock()

    def get_messages(self, memory_id: Hashable) -> list[ChatMessage]:
        """The stored messages, oldest first; ``[]`` for an unknown id."""
        key = store_key(memory_id)
        with self._lock:
            conversation = self._conversations.get(key)
            return [] if conversation is None else conversation.messages[conversation.start :]

    def update_messages(self, memory_id: Hashable, messages: Sequence[ChatMessage]) -> None:
        """Make the stored conversation equal to ``messages``."""
        key = store_key(memory_id)
        stored = with_message_ids(messages)
        check_unique_ids(stored)
        with self._lock:
            if stored:
                self._conversations[key] = _Conversation(stored)
            else:
                self._conversations.pop(key, None)

    def apply_changes(
        self,
        memory_id: Hashable,
        *,
        appended: Sequence[ChatMessage],
        removed: Collection[str],
    ) -> None:
        """Remove the messages whose id is in ``removed``, then append ``appended``."""
        key = store_key(memory_id)
        new_ids = [m.message_id for m in appended]
        if None in new_ids or (len(new_ids) > 1 and len(set(new_ids)) < len(new_ids)):
            check_appended(appended)  # raises, saying which message is wrong
        with self._lock:
            conversation = self._conversations.get(key)
            if conversation is None:
                if appended:
                    self._conversations[key] = _Conversation(list(appended))
                return
            ids = conversation.ids
            gone = ids.intersection(removed) if removed else _NOTHING
            if not ids.isdisjoint(new_ids):
                for mid in new_ids:
                    if mid in ids and mid not in gone:
                        raise duplicate_id_error(mid, memory_id)
            if gone:
                _remove(conversation, gone)
                ids -= gone
            if appended:
                conversation.messages.extend(appended)
                ids.update(new_ids)
            elif not ids:
                del self._conversations[key]

    def delete_messages(self, memory_id: Hashable) -> None:
        """Delete the conversation; a no-op for an unknown id."""
        key = store_key(memory_id)
        with self._lock:
            self._conversations.pop(key, None)

    def forget(self, memory_id: Hashable) -> None:
        """Erase the conversation (this store keeps no history beside it)."""
        self.delete_messages(memory_id)


_NOTHING: frozenset[str | None] = frozenset()


def _remove(conversation: _Conversation, gone: AbstractSet[str | None]) -> None:
    # A window evicts from its front (after a pinned system message, perhaps): scan only up
    # to the last removed message.
    messages, start = conversation.messages, conversation.start
    left = len(gone)
    end, size = start, len(messages)
    while end < size:
        end += 1
        if messages[end - 1].message_id in gone:
            left -= 1
            if not left:
                break
    if end - start == len(gone):
        start = end
    else:
        messages[start:end] = [m for m in messages[start:end] if m.message_id not in gone]
    if start > 32 and start * 2 > len(messages):
        del messages[:start]
        start = 0
    conversation.start = start

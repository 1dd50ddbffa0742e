"""The default store: conversations kept in this process's memory."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Collection, Hashable, Iterator, Sequence
from datetime import timedelta
from typing import ClassVar

from ..messages import ChatMessage
from ._base import ConcurrentChangeError, memory_id_of, store_key
from ._common import (
    appended_ids,
    check_retention,
    check_unique_ids,
    duplicate_id_error,
    purge_interval,
    with_message_ids,
)

__all__ = ["InMemoryChatMemoryStore"]


class _Conversation:
    # messages[start:] is the conversation. Evicting from the front only moves start; the
    # dead head is cut off once it outgrows the rest, so a turn costs the same however long
    # the window. mids holds each message's id, in step with messages, and ids the same as
    # a set: a window's eviction is recognised by one slice comparison, and duplicate
    # checks need no scan.
    # written: time.monotonic() of the last write, for retention. version: the store's
    # count of writes when this conversation was last written (0: no conversation).
    __slots__ = ("ids", "messages", "mids", "start", "version", "written")

    def __init__(self, messages: list[ChatMessage], written: float, version: int) -> None:
        self.messages = messages
        self.start = 0
        self.mids: list[str | None] = [m.message_id for m in messages]
        self.ids: set[str | None] = set(self.mids)
        self.written = written
        self.version = version


class InMemoryChatMemoryStore:
    """Keeps conversations in this process's memory: thread-safe, fast, gone at exit.

    Messages are immutable, so reads return a new list of the stored message objects.
    Within a conversation every message has its own ``message_id``: ``update_messages``
    gives one to a message that has none, and a duplicate id is a ``ValueError``.

    ``retention`` (a ``timedelta``) drops conversations that no write has touched for
    longer, so that a long-running process does not keep abandoned conversations forever:
    `purge_idle` runs from the first write that starts a conversation (the only
    writes that grow the store) once ``min(retention / 10, 1 hour)`` has passed since the
    last purge.
    """

    is_blocking: ClassVar[bool] = False
    """Its methods do no I/O: async calls use them directly, not through a worker thread."""

    __slots__ = (
        "__weakref__",
        "_conversations",
        "_lock",
        "_next_purge",
        "_versions",
        "retention",
    )

    def __init__(self, *, retention: timedelta | None = None) -> None:
        self._conversations: dict[str, _Conversation] = {}
        self._lock = threading.Lock()
        # Each write's number, from one count over the store: a conversation deleted and
        # begun again never has a version a writer read before.
        self._versions = itertools.count(1)
        self.retention = check_retention(retention)
        self._next_purge = (
            float("inf")
            if self.retention is None
            else _monotonic() + purge_interval(self.retention)
        )

    def __repr__(self) -> str:
        if self.retention is None:
            return f"{type(self).__name__}()"
        return f"{type(self).__name__}(retention={self.retention!r})"

    def check_memory_id(self, memory_id: Hashable) -> None:
        """Raise if ``memory_id`` can't be filed: this store holds any id ``store_key`` takes."""
        store_key(memory_id)

    def get_messages(self, memory_id: Hashable) -> list[ChatMessage]:
        """The stored messages, oldest first; ``[]`` for an unknown id."""
        return self.get_messages_since(memory_id)[0]

    def get_messages_since(
        self, memory_id: Hashable, since: object = None
    ) -> tuple[list[ChatMessage], object]:
        """The stored messages, and the conversation's version for a checked write: the
        messages are the stored objects themselves, so there is nothing else to reuse."""
        key = store_key(memory_id)
        # acquire/release rather than `with`: this runs on every call of a service.
        lock = self._lock
        lock.acquire()
        try:
            conversation = self._conversations.get(key)
            if conversation is None:
                return [], 0
            return conversation.messages[conversation.start :], conversation.version
        finally:
            lock.release()

    def update_messages(self, memory_id: Hashable, messages: Sequence[ChatMessage]) -> None:
        """Make the stored conversation equal to ``messages``."""
        key = store_key(memory_id)
        stored = with_message_ids(messages)
        check_unique_ids(stored)
        now = _monotonic()
        with self._lock:
            if stored:
                self._conversations[key] = _Conversation(stored, now, next(self._versions))
            else:
                self._conversations.pop(key, None)
        if now >= self._next_purge:
            self._purge_by_retention(now)

    def apply_changes(
        self,
        memory_id: Hashable,
        *,
        appended: Sequence[ChatMessage],
        removed: Collection[str],
        since: object = None,
    ) -> int:
        """Remove the messages whose id is in ``removed``, then append ``appended``; return
        the conversation's version after the write.

        ``since`` (a version a read or write returned) checks the write: if another write
        has changed the conversation since, nothing changes and `ConcurrentChangeError` is
        raised.
        """
        key = store_key(memory_id)
        new_ids = appended_ids(appended, removed)
        # acquire/release rather than `with`: this runs on every call of a service.
        lock = self._lock
        lock.acquire()
        try:
            conversation = self._conversations.get(key)
            if since is not None and since != (0 if conversation is None else conversation.version):
                raise ConcurrentChangeError(memory_id)
            if conversation is not None:
                ids = conversation.ids
                if not ids.isdisjoint(new_ids):
                    # An appended id already stored is a duplicate, unless it is removed.
                    gone = ids.intersection(removed)
                    for mid in new_ids:
                        if mid in ids and mid not in gone:
                            raise duplicate_id_error(mid, memory_id)
                return self._write(key, conversation, appended, new_ids, removed)
            if not appended:
                return 0
            now = _monotonic()
            version = next(self._versions)
            self._conversations[key] = _Conversation(list(appended), now, version)
        finally:
            lock.release()
        # The store grows only when a conversation starts: that is when it purges.
        if now >= self._next_purge:
            self._purge_by_retention(now)
        return version

    def _write(
        self,
        key: str,
        conversation: _Conversation,
        appended: Sequence[ChatMessage],
        new_ids: list[str],
        removed: Collection[str | None],
    ) -> int:
        """Apply a checked write to a stored conversation, the store's lock held; return its
        version after."""
        conversation.written = _monotonic()
        conversation.version = version = next(self._versions)
        if removed:
            _remove(conversation, removed)
        if appended:
            conversation.messages += appended
            conversation.mids += new_ids
            conversation.ids.update(new_ids)
        elif not conversation.ids:
            del self._conversations[key]
            return 0
        return version

    def memory_ids(self) -> Iterator[Hashable]:
        """The ids of the conversations this store holds, each as it was given."""
        with self._lock:
            keys = list(self._conversations)
        return map(memory_id_of, keys)

    def delete_messages(self, memory_id: Hashable) -> None:
        """Delete the conversation; a no-op for an unknown id."""
        key = store_key(memory_id)
        with self._lock:
            self._conversations.pop(key, None)

    def forget(self, memory_id: Hashable) -> None:
        """Erase the conversation (this store keeps no history beside it)."""
        self.delete_messages(memory_id)

    def purge_idle(self, older_than: timedelta) -> int:
        """Delete the conversations idle for longer than ``older_than``; return how many."""
        if not isinstance(older_than, timedelta):
            raise TypeError(f"older_than must be a timedelta, got {type(older_than).__name__}")
        if older_than < timedelta(0):
            raise ValueError(f"older_than must not be negative, got {older_than!r}")
        before = _monotonic() - older_than.total_seconds()
        with self._lock:
            conversations = self._conversations
            idle = [key for key, c in conversations.items() if c.written < before]
            for key in idle:
                del conversations[key]
        return len(idle)

    def _purge_by_retention(self, now: float) -> None:
        retention = self.retention
        assert retention is not None
        self._next_purge = now + purge_interval(retention)
        self.purge_idle(retention)


_monotonic = time.monotonic


def _remove(conversation: _Conversation, removed: Collection[str | None]) -> None:
    """Remove the stored messages whose id is in ``removed``; unknown ids are ignored."""
    messages, mids, start = conversation.messages, conversation.mids, conversation.start
    ids = conversation.ids
    count = len(removed)
    if type(removed) is list and mids[start : start + count] == removed:
        # A window evicting its oldest messages, in order: the usual case.
        start += count
        ids.difference_update(removed)
    else:
        gone = ids.intersection(removed)
        if not gone:
            return
        ids -= gone
        # A window evicts from its front (after a pinned system message, perhaps): scan
        # only up to the last removed message.
        left = len(gone)
        end, size = start, len(mids)
        while end < size:
            end += 1
            if mids[end - 1] in gone:
                left -= 1
                if not left:
                    break
        if end - start == len(gone):
            start = end
        else:
            kept = [i for i in range(start, end) if mids[i] not in gone]
            messages[start:end] = [messages[i] for i in kept]
            mids[start:end] = [mids[i] for i in kept]
    conversation.start = start
    if start > 32:
        _compact(conversation)


def _compact(conversation: _Conversation) -> None:
    """Cut off the dead head once it outgrows the live conversation."""
    start = conversation.start
    if start * 2 > len(conversation.messages):
        del conversation.messages[:start]
        del conversation.mids[:start]
        conversation.start = 0

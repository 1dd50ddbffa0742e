"""The one door a memory writes through: a store resolved once to the operations it needs.

A window needs four operations: read the window (reusing what an earlier read parsed, when
the store can), write a delta (append these, remove those), replace the conversation, and
delete it; each sync and async. `store_ops` resolves a store to them once, by what it
offers: ``get_messages_since`` for reads that parse only new rows, ``apply_changes`` for
delta writes, the ``a``-prefixed twins for native async I/O, ``check_memory_id`` to refuse
an id the store can't hold when a memory is made. A plain three-method store
gets delta writes through a generic adapter (read, apply the delta, write back), so a
memory has one write path whatever the store. Messages an add evicts at once (a turn longer
than the window) reach the history of a store that keeps one, through ``apply_changes``'
``history_only=``.
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Callable, Hashable, Sequence
from typing import Any, NamedTuple

from ..messages import ChatMessage

__all__ = ["AsyncMode", "Change", "StoreOps", "store_ops"]


class Change(NamedTuple):
    """One add's store write."""

    appended: list[ChatMessage]
    removed: list[ChatMessage]
    snapshot: Callable[[], list[ChatMessage]]  # the whole window, for stores without deltas
    passed: list[ChatMessage]  # left the window in the add that brought them


class AsyncMode(enum.Enum):
    """How async callers reach a store."""

    DIRECT = "direct"  # the store does no I/O: call the sync methods
    NATIVE = "native"  # the store has async methods
    THREAD = "thread"  # run the sync methods in a worker thread


class StoreOps:
    """A store's operations, as a memory calls them; one object per kind of store."""

    __slots__ = ("apply", "check", "checks_writes", "history_only", "mode", "since")

    def __init__(
        self,
        *,
        since: bool,
        apply: bool,
        mode: AsyncMode,
        check: bool = False,
        history_only: bool = False,
        checks_writes: bool = False,
    ) -> None:
        self.since = since  # the store has get_messages_since
        self.apply = apply  # the store has apply_changes
        self.mode = mode
        self.check = check  # the store has check_memory_id
        # apply_changes takes history_only=: the messages an add evicted at once reach the
        # history of a store that keeps one.
        self.history_only = history_only
        # apply_changes takes since=: a write planned on a read that another writer has
        # outdated is refused, and planned again.
        self.checks_writes = checks_writes

    def check_id(self, store: Any, memory_id: Hashable) -> None:
        """Raise the store's ``ValueError`` if it can't hold ``memory_id``."""
        if self.check:
            store.check_memory_id(memory_id)

    def reader(self, store: Any) -> Callable[[Hashable, object], tuple[list[ChatMessage], object]]:
        """The store's read, bound once: ``(memory id, since)`` to the stored window and what
        to pass as ``since`` to the next read."""
        if self.since:
            return store.get_messages_since  # type: ignore[no-any-return]
        get = store.get_messages

        def read(memory_id: Hashable, since: object) -> tuple[list[ChatMessage], object]:
            return get(memory_id), None

        return read

    def write(self, store: Any, memory_id: Hashable, change: Change, since: object) -> object:
        """Append and remove what ``change`` says, planned on the read that returned
        ``since``; its passed messages go to a history the store keeps. Returns the ``since``
        for the next read and write; raises ``ConcurrentChangeError`` if the store refuses
        a write whose read another writer outdated."""
        appended, removed, snapshot, passed = change
        if not self._kept(store, passed):
            if not appended and not removed:
                return since
            passed = []
        ids = [m.message_id for m in removed]
        if None not in ids and self.apply:
            if self.checks_writes:
                if passed:
                    return store.apply_changes(
                        memory_id, appended=appended, removed=ids, history_only=passed, since=since
                    )
                return store.apply_changes(memory_id, appended=appended, removed=ids, since=since)
            if passed:
                store.apply_changes(memory_id, appended=appended, removed=ids, history_only=passed)
            else:
                store.apply_changes(memory_id, appended=appended, removed=ids)
            return since
        if self.apply:
            # A removed message without an id can only be removed by writing the window.
            store.update_messages(memory_id, snapshot())
        else:
            stored = store.get_messages(memory_id)
            store.update_messages(memory_id, [*_without(stored, removed), *appended])
        return None if self.checks_writes else since

    def _kept(self, store: Any, passed: Sequence[ChatMessage]) -> bool:
        """Whether ``passed`` go to a history ``store`` keeps."""
        return bool(passed) and self.history_only and getattr(store, "keep_history", False)

    def replace(self, store: Any, memory_id: Hashable, messages: Sequence[ChatMessage]) -> None:
        store.update_messages(memory_id, messages)

    def delete(self, store: Any, memory_id: Hashable) -> None:
        store.delete_messages(memory_id)

    # Native async twins (mode NATIVE only).

    async def aread(
        self, store: Any, memory_id: Hashable, since: object
    ) -> tuple[list[ChatMessage], object]:
        if self.since:
            return await store.aget_messages_since(memory_id, since)  # type: ignore[no-any-return]
        return await store.aget_messages(memory_id), None

    async def awrite(
        self, store: Any, memory_id: Hashable, change: Change, since: object
    ) -> object:
        appended, removed, snapshot, passed = change
        if not self._kept(store, passed):
            if not appended and not removed:
                return since
            passed = []
        ids = [m.message_id for m in removed]
        if None not in ids and self.apply:
            more: dict[str, object] = {"history_only": passed} if passed else {}
            if self.checks_writes:
                return await store.aapply_changes(
                    memory_id, appended=appended, removed=ids, since=since, **more
                )
            await store.aapply_changes(memory_id, appended=appended, removed=ids, **more)
            return since
        if self.apply:
            await store.aupdate_messages(memory_id, snapshot())
        else:
            stored = await store.aget_messages(memory_id)
            await store.aupdate_messages(memory_id, [*_without(stored, removed), *appended])
        return None if self.checks_writes else since

    async def areplace(
        self, store: Any, memory_id: Hashable, messages: Sequence[ChatMessage]
    ) -> None:
        await store.aupdate_messages(memory_id, messages)

    async def adelete(self, store: Any, memory_id: Hashable) -> None:
        await store.adelete_messages(memory_id)


def _without(stored: list[ChatMessage], removed: Sequence[ChatMessage]) -> list[ChatMessage]:
    """``stored`` less the removed messages: by id, else the same object, else an equal one."""
    if not removed:
        return stored
    ids = {m.message_id for m in removed if m.message_id is not None}
    objects = {id(m) for m in removed}
    equal = [m for m in removed if m.message_id is None]
    kept: list[ChatMessage] = []
    for m in stored:
        mid = m.message_id
        if mid is not None and mid in ids:
            continue
        if mid is None:
            if id(m) in objects:
                continue
            match = next((i for i, e in enumerate(equal) if e == m), None)
            if match is not None:
                del equal[match]
                continue
        kept.append(m)
    return kept


_RESOLVED: dict[tuple[type, bool], StoreOps] = {}


def store_ops(store: object) -> StoreOps:
    """The operations of ``store``, resolved by what it offers (cached per kind of store)."""
    blocking = getattr(store, "is_blocking", True) is not False
    key = (type(store), blocking)
    ops = _RESOLVED.get(key)
    if ops is None:
        ops = _RESOLVED[key] = _resolve(store, blocking)
    return ops


def _resolve(store: object, blocking: bool) -> StoreOps:
    def has(name: str) -> bool:
        return callable(getattr(store, name, None))

    since = has("get_messages_since") and not _reads_elsewhere(type(store))
    apply = has("apply_changes")
    if not blocking:
        mode = AsyncMode.DIRECT
    else:
        needed = ["aget_messages", "aupdate_messages", "adelete_messages"]
        if apply:
            needed.append("aapply_changes")
        if since:
            needed.append("aget_messages_since")
        mode = AsyncMode.NATIVE if all(map(has, needed)) else AsyncMode.THREAD
    history_only = apply and _takes(store, "apply_changes", "history_only")
    # Checked writes plan on what a read returned: only with reads that return a since.
    checks_writes = apply and since and _takes(store, "apply_changes", "since")
    if mode is AsyncMode.NATIVE:
        history_only = history_only and _takes(store, "aapply_changes", "history_only")
        checks_writes = checks_writes and _takes(store, "aapply_changes", "since")
    return StoreOps(
        since=since,
        apply=apply,
        mode=mode,
        check=has("check_memory_id"),
        history_only=history_only,
        checks_writes=checks_writes,
    )


def _takes(store: object, method: str, name: str) -> bool:
    try:
        return name in inspect.signature(getattr(store, method)).parameters
    except (TypeError, ValueError):
        return False


def _reads_elsewhere(kind: type) -> bool:
    """Whether a subclass overrides the plain reads of the class that reads since a mark:
    its reads then keep going through its own methods."""
    owner = next(c for c in kind.__mro__ if "get_messages_since" in c.__dict__)
    return any(
        getattr(kind, name, None) is not getattr(owner, name, None)
        for name in ("get_messages", "aget_messages")
    )

"""The window engine both window memories share: the same rules, counted differently.

A memory keeps the conversation's non-system messages in a list with each one's cost (1 for
a message window, its tokens for a token window) and the system message apart, with the
number of messages before it. Eviction takes whole *units* from the front: a message; an
``AiMessage`` with tool requests together with the tool results that follow it; or, with
``evict_whole_turns``, a ``UserMessage`` and everything up to the next one.

Store traffic: :meth:`messages` reads the store once; :meth:`add` writes once, and reads
only when the memory holds no list yet. The write is a delta (``apply_changes``) when the
store offers one, else the whole window (``update_messages``).

Calibration (``calibrate=True``): after a turn, :meth:`WindowChatMemory._observe_usage`
compares the provider's count of the request's input with the memory's estimate of the same
messages; the ratio divides the limit from then on. The window is trimmed to it at the next
add, never at a read: a read never hides a message that the store still holds in the window.
"""

from __future__ import annotations

import enum
import operator
import threading
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any, ClassVar, Generic, Protocol, TypeAlias, TypeVar

from ..messages import (
    AiMessage,
    ChatMessage,
    SystemMessage,
    ToolExecutionResultMessage,
    UserMessage,
    new_message_id,
)
from ..stores._base import ChatMemoryStore

__all__ = ["Limit", "ReportedUsage", "WindowChatMemory", "WindowChatMemoryProvider"]

Limit: TypeAlias = int | Callable[[Any], int]
"""A window's size: a number, or a callable taking the memory id, read at every add and read."""

_MESSAGE_TYPES = (SystemMessage, UserMessage, AiMessage, ToolExecutionResultMessage)


class ReportedUsage(Protocol):
    """What calibration reads of a reported ``TokenUsage``."""

    @property
    def input_tokens(self) -> int | None: ...


class AsyncMode(enum.Enum):
    DIRECT = "direct"  # the store does no I/O: call the sync methods
    NATIVE = "native"  # the store has async methods
    THREAD = "thread"  # run the sync methods in a worker thread


def check_limit(value: object, name: str, *, source: str | None = None) -> int:
    """``value`` as a window size, or a clear error; ``source`` names the callable it came from."""
    number: int
    if type(value) is int:
        number = value
    else:
        index: Any = getattr(type(value), "__index__", None)
        if index is None or isinstance(value, bool):
            where = f"{source} returned" if source else f"{name} must be an int or a callable, got"
            unit = "tokens" if name == "max_tokens" else "messages"
            raise TypeError(
                f"{where} {value!r} ({type(value).__name__}); {name} is a whole number of {unit}"
            )
        number = index(value)
    if number < 1:
        where = f"{source} returned {number}" if source else f"got {number}"
        raise ValueError(
            f"{name} must be at least 1 ({where}): a window needs room for one message; "
            "for a conversation without memory, give the service no memory"
        )
    return number


class WindowState:
    """What the memory knows of the stored conversation since its last read or write."""

    __slots__ = (
        "answered",
        "costs",
        "known",
        "limit",
        "msgs",
        "open",
        "pending",
        "rewrite",
        "system",
        "system_cost",
        "system_pos",
        "total",
    )

    def __init__(self) -> None:
        self.msgs: list[ChatMessage] = []  # non-system messages, oldest first
        self.costs: list[int] = []  # each message's cost, in step with msgs
        self.total = 0  # sum(costs)
        self.system: SystemMessage | None = None
        self.system_cost = 0
        self.system_pos = 0  # how many of msgs come before the system message
        # Cost of every message the store holds, by message_id (the message itself when it
        # has none): a message is counted once, however many adds and reads follow.
        self.known: dict[object, int] = {}
        self.open: dict[str, int] = {}  # tool request id -> AiMessages in msgs asking it
        self.answered: dict[str, int] = {}  # tool request id -> tool results in msgs
        self.pending: list[str] = []  # ids the store holds that the window dropped at read
        self.rewrite = False  # the store holds a dropped message with no id: write it whole
        self.limit = 0  # the limit the window was last trimmed to

    def snapshot(self) -> list[ChatMessage]:
        out = self.msgs.copy()
        if self.system is not None:
            out.insert(self.system_pos, self.system)
        return out


def message_key(message: ChatMessage) -> object:
    mid = message.message_id
    return message if mid is None else mid


class StoreWrite:
    __slots__ = ("appended", "full", "removed")

    def __init__(
        self,
        full: list[ChatMessage] | None,
        appended: list[ChatMessage],
        removed: list[str],
    ) -> None:
        self.full = full
        self.appended = appended
        self.removed = removed


class WindowChatMemory:
    """Base of the window memories: keeps the newest messages whose cost fits the limit."""

    _limit_name: str = "limit"
    _state_type: type[WindowState] = WindowState

    def __init__(
        self,
        limit: Limit,
        *,
        id: Hashable,  # noqa: A002
        store: ChatMemoryStore | None,
        always_keep_system_message_first: bool,
        evict_whole_turns: bool,
        calibrate: bool = False,
    ) -> None:
        try:
            hash(id)
        except TypeError:
            raise TypeError(
                f"a memory id must be hashable (a str, int, UUID...), got {type(id).__name__}"
            ) from None
        self._id = id
        self._limit_spec = limit
        if callable(limit):
            self._fixed_limit = 0
            self._limit_fn: Callable[[Any], object] | None = limit
        else:
            self._fixed_limit = check_limit(limit, self._limit_name)
            self._limit_fn = None
        self._store = _default_store() if store is None else _check_store(store)
        self._get = self._store.get_messages
        self._update = self._store.update_messages
        self._apply: Callable[..., None] | None = getattr(self._store, "apply_changes", None)
        self._async = _async_mode(self._store, self._apply is not None)
        self._keep_system_first = bool(always_keep_system_message_first)
        self._whole_turns = bool(evict_whole_turns)
        self._lock = threading.Lock()
        self._state: WindowState | None = None
        self.evicted_messages = 0
        """Messages this memory object's adds removed from its store's window."""
        self._calibrate = bool(calibrate)
        self._base_limit = self._fixed_limit
        self._factor = 1.0  # provider tokens per estimated token
        # Costs of the messages the last add evicted, kept for calibration only: the request
        # it observes held them, and the store no longer does.
        self._gone: dict[object, int] | None = None
        # Costs the fast add path counted before handing a batch to the general one, by
        # id() of the message: each message is counted once.
        self._counted: dict[int, int] = {}
        # Whether an add may take the fast path for plain messages (see _stage_plain).
        self._plain_adds = not self._whole_turns and not self._calibrate and self._apply is not None
        if self._calibrate:
            self._gone = {}
            # Only a calibrating memory wraps its _trim: the others pay nothing per add.
            self._trim = self._trim_keeping_costs  # type: ignore[method-assign]

    # What a subclass supplies.

    # A cost every message has (a message window's 1), so hot paths need not ask _cost.
    _unit_cost: ClassVar[int | None] = None

    def _cost(self, message: ChatMessage) -> int:
        raise NotImplementedError

    # The ChatMemory protocol.

    @property
    def id(self) -> Hashable:
        """The memory id: the key of this conversation in the store."""
        return self._id

    @property
    def store(self) -> ChatMemoryStore:
        """The store that keeps this memory's messages."""
        return self._store

    @property
    def is_blocking(self) -> bool:
        """Whether the store does I/O; when not, async callers use the sync methods."""
        return self._async is not AsyncMode.DIRECT

    def messages(self) -> list[ChatMessage]:
        """The messages in the window, oldest first; reads the store once.

        A limit lowered since the last write trims here; the store is trimmed at the next add.
        """
        # acquire/release rather than `with`, and the usual case inline: this runs on every
        # call of a service.
        lock = self._lock
        lock.acquire()
        try:
            limit = self._fixed_limit if self._limit_fn is None else self._read_limit()
            stored = self._get(self._id)
            state = self._state
            if (
                state is not None
                and state.system is None
                and state.limit == limit
                and not state.pending
                and not state.rewrite
                and len(stored) == len(state.msgs)
                and all(map(operator.is_, stored, state.msgs))
            ):
                return state.msgs.copy()
            self._state = state = self._refresh(stored, limit)
            return state.snapshot()
        finally:
            lock.release()

    def add(self, *messages: ChatMessage) -> None:
        """Add messages in order with one store write, then evict what no longer fits.

        A message without a ``message_id`` is stored with a new one.
        """
        if not messages:
            return
        lock = self._lock
        lock.acquire()
        try:
            limit = self._fixed_limit if self._limit_fn is None else self._read_limit()
            state = self._state
            if state is not None and self._plain_adds and not state.pending and not state.rewrite:
                plain = self._stage_plain(messages, state, limit)
                if plain is not None:
                    try:
                        self._apply(self._id, appended=plain[0], removed=plain[1])  # type: ignore[misc]
                    except BaseException:
                        self._state = None
                        raise
                    self.evicted_messages += len(plain[1])
                    return
            check_messages(messages, "add")
            if state is None:
                state = self._state = self._build(self._get(self._id), limit, from_store=True)
                write = self._stage(messages, state, limit)
            else:
                write = self._stage_any(messages, state, limit)
            if write is None:
                return
            try:
                if write.full is None and self._apply is not None:
                    self._apply(self._id, appended=write.appended, removed=write.removed)
                    self.evicted_messages += len(write.removed)
                else:
                    self._update(self._id, write.full or [])
            except BaseException:
                self._state = None
                raise
        finally:
            lock.release()

    def set(self, messages: Iterable[ChatMessage]) -> None:
        """Replace the conversation with ``messages``, under the window's rules."""
        given = list(messages)
        check_messages(given, "set")
        with self._lock:
            limit = self._read_limit()
            state = self._build(given, limit, from_store=False)
            try:
                self._update(self._id, state.snapshot())
            except BaseException:
                self._state = None
                raise
            self._state = state

    def clear(self) -> None:
        """Remove every message of this conversation from the store."""
        with self._lock:
            try:
                self._store.delete_messages(self._id)
            except BaseException:
                self._state = None
                raise
            self._state = self._state_type()

    # The async twins, for async callers: never block the event loop on store I/O.

    async def amessages(self) -> list[ChatMessage]:
        """:meth:`messages` for async callers."""
        import asyncio

        if self._async is AsyncMode.DIRECT:
            return self.messages()
        if self._async is AsyncMode.THREAD:
            return await asyncio.to_thread(self.messages)
        await acquire_polling(self._lock)
        try:
            limit = self._read_limit()
            stored = await self._store.aget_messages(self._id)  # type: ignore[attr-defined]
            self._state = self._refresh(stored, limit)
            return self._state.snapshot()
        finally:
            self._lock.release()

    async def aadd(self, *messages: ChatMessage) -> None:
        """:meth:`add` for async callers."""
        import asyncio

        if self._async is AsyncMode.DIRECT:
            return self.add(*messages)
        if self._async is AsyncMode.THREAD:
            return await asyncio.to_thread(self.add, *messages)
        if not messages:
            return None
        check_messages(messages, "add")
        store: Any = self._store
        await acquire_polling(self._lock)
        try:
            limit = self._read_limit()
            if self._state is None:
                stored = await store.aget_messages(self._id)
                self._state = self._build(stored, limit, from_store=True)
            write = self._stage(messages, self._state, limit)
            if write is not None:
                try:
                    if write.full is None:
                        await store.aapply_changes(
                            self._id, appended=write.appended, removed=write.removed
                        )
                        self.evicted_messages += len(write.removed)
                    else:
                        await store.aupdate_messages(self._id, write.full)
                except BaseException:
                    self._state = None
                    raise
        finally:
            self._lock.release()
        return None

    async def aset(self, messages: Iterable[ChatMessage]) -> None:
        """:meth:`set` for async callers."""
        import asyncio

        if self._async is AsyncMode.DIRECT:
            return self.set(messages)
        if self._async is AsyncMode.THREAD:
            return await asyncio.to_thread(self.set, list(messages))
        given = list(messages)
        check_messages(given, "set")
        await acquire_polling(self._lock)
        try:
            limit = self._read_limit()
            state = self._build(given, limit, from_store=False)
            try:
                await self._store.aupdate_messages(  # type: ignore[attr-defined]
                    self._id, state.snapshot()
                )
            except BaseException:
                self._state = None
                raise
            self._state = state
        finally:
            self._lock.release()
        return None

    async def aclear(self) -> None:
        """:meth:`clear` for async callers."""
        import asyncio

        if self._async is AsyncMode.DIRECT:
            return self.clear()
        if self._async is AsyncMode.THREAD:
            return await asyncio.to_thread(self.clear)
        await acquire_polling(self._lock)
        try:
            try:
                await self._store.adelete_messages(self._id)  # type: ignore[attr-defined]
            except BaseException:
                self._state = None
                raise
            self._state = self._state_type()
        finally:
            self._lock.release()
        return None

    # The engine.

    def _read_limit(self) -> int:
        limit_fn = self._limit_fn
        if limit_fn is None:
            return self._fixed_limit
        value = limit_fn(self._id)
        if type(value) is not int or value < 1:
            value = check_limit(value, self._limit_name, source=f"{self._limit_name}({self._id!r})")
        factor = self._factor
        return value if factor == 1.0 else max(1, int(value / factor))

    # Calibration.

    def _observe_usage(self, messages: Sequence[ChatMessage], usage: ReportedUsage) -> None:
        """Compare the provider's input count for ``messages`` with the memory's estimate.

        The ratio divides the limit from now on; the next add trims the window to it. Best
        effort: a busy lock or a failing estimator skips the observation.
        """
        if not self._calibrate:
            return
        reported = usage.input_tokens
        if type(reported) is not int or reported <= 0:
            return
        # Never wait: on an async caller's event loop this runs without awaiting, and a
        # busy lock only means one observation fewer.
        if not self._lock.acquire(blocking=False):
            return
        try:
            state = self._state
            if state is None:
                return
            known, gone = state.known, self._gone or {}
            estimate = 0
            for m in messages:
                key = message_key(m)
                cost = known.get(key)
                if cost is None:
                    cost = gone.get(key)
                    if cost is None:
                        # A message the memory never held (a parse retry's feedback).
                        cost = self._cost(m)
                estimate += cost
            if estimate <= 0:
                return
            self._factor = reported / estimate
            if self._limit_fn is None:
                self._fixed_limit = max(1, int(self._base_limit / self._factor))
            # The window as it is counts as trimmed to the new limit, so that a read shows
            # what the store holds; the next add evicts what no longer fits, in its write.
            state.limit = self._read_limit()
        except Exception:
            return  # this runs after the turn's commit: nothing here may fail the call
        finally:
            self._lock.release()

    def _refresh(self, stored: Sequence[ChatMessage], limit: int) -> WindowState:
        """The state for what the store holds: the current one when nothing has changed."""
        state = self._state
        if (
            state is not None
            and state.limit == limit
            and not state.pending
            and not state.rewrite
            and holds(state, stored)
        ):
            return state
        return self._build(stored, limit, from_store=True)

    def _build(
        self, messages: Sequence[ChatMessage], limit: int, *, from_store: bool
    ) -> WindowState:
        """A state for ``messages`` under the rules; from the store, or given to :meth:`set`.

        Nothing of the current state changes until it is swapped in, so an estimator or
        store that raises leaves the memory as it was.
        """
        old = self._state
        known_before = old.known if old is not None else {}
        state = self._state_type()
        msgs, costs, known, opened, answered = (
            state.msgs,
            state.costs,
            state.known,
            state.open,
            state.answered,
        )
        dropped: list[ChatMessage] = []
        total = 0
        system: SystemMessage | None = None
        for given in messages:
            m = given
            if not from_store:
                mid = m.message_id
                if mid is None or mid in known:
                    m = m.with_metadata(message_id=new_message_id())
            key = message_key(m)
            cost = known_before.get(key)
            if cost is None:
                cost = known.get(key)
                if cost is None:
                    cost = self._cost(m)
            known[key] = cost
            if isinstance(m, SystemMessage):
                if system is not None:
                    dropped.append(system)
                system = m
                state.system_cost = cost
                state.system_pos = len(msgs)
                continue
            if isinstance(m, ToolExecutionResultMessage):
                if not opened.get(m.id):
                    dropped.append(m)  # its request is not (or no longer) in the window
                    continue
                answered[m.id] = answered.get(m.id, 0) + 1
            elif isinstance(m, AiMessage) and m.tool_execution_requests:
                for r in m.tool_execution_requests:
                    opened[r.id] = opened.get(r.id, 0) + 1
            msgs.append(m)
            costs.append(cost)
            total += cost
        state.total = total
        state.system = system
        if system is not None and self._keep_system_first:
            state.system_pos = 0
        dropped += self._trim(state, limit)
        if from_store:
            for m in dropped:
                if m.message_id is None:
                    state.rewrite = True
                else:
                    state.pending.append(m.message_id)
        else:
            for m in dropped:
                known.pop(message_key(m), None)
        return state

    def _stage(
        self, messages: Sequence[ChatMessage], state: WindowState, limit: int
    ) -> StoreWrite | None:
        """Apply an add to ``state`` and return the store write it needs (``None``: none)."""
        if self._plain_adds and not state.pending and not state.rewrite:
            plain = self._stage_plain(messages, state, limit)
            if plain is not None:
                return StoreWrite(None, plain[0], plain[1])
        return self._stage_any(messages, state, limit)

    def _stage_plain(
        self,
        messages: Sequence[ChatMessage],
        state: WindowState,
        limit: int,
    ) -> tuple[list[ChatMessage], list[str]] | None:
        """The common add, fast: user and AI messages without tools, each with a new id,
        into a window whose front is plain messages too; returns (appended, removed).

        ``None`` when anything is less simple; :meth:`_stage_any` then handles the add.
        Nothing changes before the checks pass.
        """
        ids: list[str | None] = list(map(_message_id, messages))
        known = state.known
        n = len(ids)
        if (
            not all(map(_plain, messages))
            or None in ids
            or not known.keys().isdisjoint(ids)
            or (n > 1 and (ids[0] == ids[1] if n == 2 else len(set(ids)) < n))
        ):
            return None
        unit = self._unit_cost
        if unit is None:
            cost = self._cost
            costs = [cost(m) for m in messages]  # may raise: nothing has changed yet
            added = sum(costs)
        else:
            costs = [unit] * n
            added = unit * n
        msgs = state.msgs
        over = state.total + added + state.system_cost - limit
        removed: list[str] = []
        if over > 0:
            # Evict plain front messages only; the rules for tool exchanges, whole turns
            # and an oversize newest message stay with the general path.
            front_costs = state.costs
            if unit is not None:
                k = -(-over // unit)
                over -= k * unit
            else:
                k = 0
                size = len(msgs)
                while over > 0 and k < size:
                    over -= front_costs[k]
                    k += 1
            front = msgs[:k]
            if (
                over > 0
                or len(front) < k
                # no tool exchange in the window: every message in it is plain
                or ((state.open or state.answered) and not all(map(_plain, front)))
            ):
                self._counted = dict(zip(map(id, messages), costs, strict=False))
                return None
            removed = list(map(_message_id, front))
            if None in removed:
                self._counted = dict(zip(map(id, messages), costs, strict=False))
                return None
            for mid in removed:
                del known[mid]
            state.total -= k * unit if unit is not None else sum(front_costs[:k])
            del msgs[:k]
            del front_costs[:k]
            if state.system_pos:
                state.system_pos = max(0, state.system_pos - k)
        state.limit = limit
        msgs += messages
        state.costs += costs
        state.total += added
        known.update(zip(ids, costs, strict=False))
        return list(messages), removed

    def _stage_any(
        self, messages: Sequence[ChatMessage], state: WindowState, limit: int
    ) -> StoreWrite | None:
        """Apply any add to ``state``: system messages, tool exchanges, reused ids."""
        # First decide and count, changing nothing: an estimator that raises leaves the
        # state as it was.
        known, opened, pending = state.known, state.open, state.pending
        system = state.system
        new_system: SystemMessage | None = None
        new_system_at = -1  # its index in kept
        batch_open: dict[str, int] = {}
        tools = False  # whether the batch holds tool requests or results
        kept: list[ChatMessage] = []
        kept_ids: list[str] = []
        kept_costs: list[int] = []
        batch_ids: set[str] = set()
        for given in messages:
            m = given
            if isinstance(m, SystemMessage):
                current = new_system if new_system is not None else system
                if current is not None and current == m:
                    continue
                if new_system is not None:  # replaced within the batch: never stored
                    del kept[new_system_at], kept_ids[new_system_at], kept_costs[new_system_at]
                new_system_at = len(kept)
            elif isinstance(m, ToolExecutionResultMessage):
                if not opened.get(m.id) and not batch_open.get(m.id):
                    continue  # its request is not in the window: never stored
                tools = True
            elif isinstance(m, AiMessage) and m.tool_execution_requests:
                for r in m.tool_execution_requests:
                    batch_open[r.id] = batch_open.get(r.id, 0) + 1
                tools = True
            mid = m.message_id
            if mid is None or mid in known or mid in batch_ids or (pending and mid in pending):
                mid = new_message_id()
                m = m.with_metadata(message_id=mid)
            if new_system_at == len(kept) and isinstance(m, SystemMessage):
                new_system = m
            batch_ids.add(mid)
            kept.append(m)
            kept_ids.append(mid)
            counted = self._counted.pop(id(given), None) if self._counted else None
            kept_costs.append(self._cost(m) if counted is None else counted)
        if not kept and not pending and not state.rewrite:
            return None

        # Then change the state.
        removed = pending
        for mid in pending:
            known.pop(mid, None)
        state.pending = []
        rewrite = state.rewrite
        state.rewrite = False
        known.update(zip(kept_ids, kept_costs, strict=True))
        msgs, costs = state.msgs, state.costs
        base = len(msgs)
        if new_system is None:
            msgs += kept
            costs += kept_costs
            state.total += sum(kept_costs)
        else:
            for m, cost in zip(kept, kept_costs, strict=True):
                if m is not new_system:
                    msgs.append(m)
                    costs.append(cost)
                    state.total += cost
            if system is not None:
                known.pop(message_key(system), None)
                if system.message_id is None:
                    rewrite = True
                else:
                    removed.append(system.message_id)
            state.system = new_system
            state.system_cost = kept_costs[new_system_at]
            # Where it was added: after the window and the batch's messages before it.
            state.system_pos = 0 if self._keep_system_first else base + new_system_at
        if tools:
            answered = state.answered
            for m in kept:
                if isinstance(m, ToolExecutionResultMessage):
                    answered[m.id] = answered.get(m.id, 0) + 1
                elif isinstance(m, AiMessage):
                    for r in m.tool_execution_requests:
                        opened[r.id] = opened.get(r.id, 0) + 1

        evicted = self._trim(state, limit)
        batch_evicted = False
        for m in evicted:
            mid = m.message_id
            if mid is None:
                known.pop(m, None)
                rewrite = True
            else:
                known.pop(mid, None)
                if mid in batch_ids:
                    batch_evicted = True
                else:
                    removed.append(mid)
        if rewrite or self._apply is None:
            return StoreWrite(state.snapshot(), [], [])
        if batch_evicted:
            gone = {id(m) for m in evicted}
            kept = [m for m in kept if id(m) not in gone]
        if not kept and not removed:
            return None
        return StoreWrite(None, kept, removed)

    def _trim_keeping_costs(self, state: WindowState, limit: int) -> list[ChatMessage]:
        """:meth:`_trim`, keeping the evicted messages' costs for :meth:`_observe_usage`."""
        evicted = type(self)._trim(self, state, limit)
        gone = self._gone
        if gone is not None:
            gone.clear()
            known = state.known
            for m in evicted:
                key = message_key(m)
                cost = known.get(key)
                if cost is not None:
                    gone[key] = cost
        return evicted

    def _trim(self, state: WindowState, limit: int) -> list[ChatMessage]:
        """Evict whole units from the front until the window fits; return what was evicted."""
        state.limit = limit
        evicted: list[ChatMessage] = []
        while True:
            over = state.total + state.system_cost - limit
            if over <= 0:
                return evicted
            k, stale = self._front(state, over, limit)
            if k:
                msgs, costs = state.msgs, state.costs
                evicted += msgs[:k]
                del msgs[:k]
                state.total -= sum(costs[:k])
                del costs[:k]
                state.system_pos = max(0, state.system_pos - k)
            if not stale:
                return evicted
            # Tool results further on lost their request: drop them, then count again.
            evicted += _drop_orphans(state)

    def _front(self, state: WindowState, over: int, limit: int) -> tuple[int, bool]:
        """How many front messages to evict for ``over`` less, updating the tool counts;
        and whether that leaves tool results further on without their request."""
        msgs, costs = state.msgs, state.costs
        opened, answered = state.open, state.answered
        whole_turns = self._whole_turns
        n = len(msgs)
        k = 0
        while over > 0 and k < n:
            j = k + 1
            if whole_turns:
                while j < n and not isinstance(msgs[j], UserMessage):
                    j += 1
            else:
                first = msgs[k]
                if isinstance(first, AiMessage) and first.tool_execution_requests:
                    while j < n and isinstance(msgs[j], ToolExecutionResultMessage):
                        j += 1
            unit = costs[k] if j == k + 1 else sum(costs[k:j])
            if j == n and unit > limit:
                break  # the newest unit alone is larger than the window: kept alone
            over -= unit
            asked: list[str] = []
            for m in msgs[k:j]:
                if isinstance(m, ToolExecutionResultMessage):
                    decrement(answered, m.id)
                elif isinstance(m, AiMessage) and m.tool_execution_requests:
                    for r in m.tool_execution_requests:
                        decrement(opened, r.id)
                        asked.append(r.id)
            k = j
            if asked and any(answered.get(r) and not opened.get(r) for r in asked):
                return k, True
        return k, False

    def __repr__(self) -> str:
        spec = self._limit_spec
        limit = spec if not callable(spec) else getattr(spec, "__qualname__", spec)
        return (
            f"{type(self).__name__}({self._limit_name}={limit!r}, id={self._id!r}, "
            f"store={self._store!r})"
        )


def holds(state: WindowState, stored: Sequence[ChatMessage]) -> bool:
    """Whether ``stored`` is the window ``state`` holds, message for message."""
    system, msgs = state.system, state.msgs
    if system is None:
        if len(stored) != len(msgs):
            return False
        others = stored
    else:
        if len(stored) != len(msgs) + 1:
            return False
        pos = state.system_pos
        there = stored[pos]
        if there is not system and (
            there.message_id is None or there.message_id != system.message_id
        ):
            # The store keeps the system message where it was appended, and the window
            # shows it first: find it the long way.
            return _holds_elsewhere(state.msgs, system, stored)
        others = [*stored[:pos], *stored[pos + 1 :]]
    if all(map(operator.is_, others, msgs)):
        return True
    # A store that builds new message objects at each read: compare the ids.
    ids = [m.message_id for m in others]
    return None not in ids and ids == [m.message_id for m in msgs]


def _holds_elsewhere(
    msgs: list[ChatMessage], system: SystemMessage, stored: Sequence[ChatMessage]
) -> bool:
    system_id = system.message_id
    pending_system = True
    window = iter(msgs)
    for m in stored:
        if pending_system and (
            m is system or (system_id is not None and m.message_id == system_id)
        ):
            pending_system = False
            continue
        mine = next(window, None)
        if mine is None or (
            m is not mine and (m.message_id is None or m.message_id != mine.message_id)
        ):
            return False
    return not pending_system


def decrement(counts: dict[str, int], key: str) -> int:
    left = counts.get(key, 0) - 1
    if left > 0:
        counts[key] = left
        return left
    counts.pop(key, None)
    return 0


def _drop_orphans(state: WindowState) -> list[ChatMessage]:
    """Drop tool results whose request left the window (rare: results not right after it)."""
    opened, answered = state.open, state.answered
    msgs: list[ChatMessage] = []
    costs: list[int] = []
    dropped: list[ChatMessage] = []
    before_system = 0
    for i, (m, cost) in enumerate(zip(state.msgs, state.costs, strict=True)):
        if isinstance(m, ToolExecutionResultMessage) and not opened.get(m.id):
            dropped.append(m)
            decrement(answered, m.id)
            state.total -= cost
            if i < state.system_pos:
                before_system += 1
            continue
        msgs.append(m)
        costs.append(cost)
    state.msgs, state.costs = msgs, costs
    state.system_pos -= before_system
    return dropped


_message_id = operator.attrgetter("message_id")


def _plain(m: ChatMessage) -> bool:
    """A user message, or an AI message without tool requests: a unit of its own."""
    kind = type(m)
    return kind is UserMessage or (kind is AiMessage and not m.tool_execution_requests)  # type: ignore[union-attr]


def check_messages(messages: Sequence[object], method: str) -> None:
    for i, m in enumerate(messages):
        if not isinstance(m, _MESSAGE_TYPES):
            hint = " (wrap text in UserMessage(...))" if isinstance(m, str) else ""
            raise TypeError(
                f"{method}() takes chat messages; item {i} is a {type(m).__name__}: {m!r:.60}{hint}"
            )


def _check_store(store: object) -> ChatMemoryStore:
    if isinstance(store, type):
        raise TypeError(
            f"store must be a store object, got the class {store.__name__}; "
            f"pass an instance: store={store.__name__}(...)"
        )
    missing = [
        name
        for name in ("get_messages", "update_messages", "delete_messages")
        if not callable(getattr(store, name, None))
    ]
    if missing:
        raise TypeError(
            f"store must be a ChatMemoryStore; {type(store).__name__} has no "
            f"{', '.join(missing)} (pass InMemoryChatMemoryStore(), SqliteChatMemoryStore(path)...)"
        )
    return store  # type: ignore[return-value]


def _default_store() -> ChatMemoryStore:
    from ..stores.in_memory import InMemoryChatMemoryStore

    return InMemoryChatMemoryStore()


def _async_mode(store: object, incremental: bool) -> AsyncMode:
    if getattr(store, "is_blocking", True) is False:
        return AsyncMode.DIRECT
    needed = ["aget_messages", "aupdate_messages", "adelete_messages"]
    if incremental:
        needed.append("aapply_changes")
    if all(callable(getattr(store, name, None)) for name in needed):
        return AsyncMode.NATIVE
    return AsyncMode.THREAD


async def acquire_polling(lock: threading.Lock) -> None:
    # The lock also guards sync callers in other threads, so it is a thread lock; polling
    # it keeps the event loop free while another caller holds it, and a cancelled waiter
    # leaves nothing behind (a worker thread blocked in acquire() would).
    import asyncio

    delay = 0.0001
    while not lock.acquire(blocking=False):
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.01)


_M = TypeVar("_M", bound=WindowChatMemory)


class WindowChatMemoryProvider(Generic[_M]):
    """Gives each memory id its own window memory, all on one store."""

    __slots__ = ("_factory", "_options", "store")

    def __init__(
        self, factory: Callable[[Hashable], _M], store: ChatMemoryStore, options: str
    ) -> None:
        self._factory = factory
        self._options = options
        self.store = store

    def __call__(self, memory_id: Hashable) -> _M:
        """A memory for ``memory_id`` on the shared store."""
        return self._factory(memory_id)

    def __repr__(self) -> str:
        return f"{self._options}, store={self.store!r})"

    @classmethod
    def create(
        cls,
        memory_class: type[_M],
        make: Callable[[Hashable, ChatMemoryStore], _M],
        store: ChatMemoryStore | None,
        options: str,
    ) -> WindowChatMemoryProvider[_M]:
        """A provider whose memories ``make(memory_id, store)`` builds on one shared store."""
        shared = _default_store() if store is None else _check_store(store)
        return cls(
            lambda memory_id: make(memory_id, shared),
            shared,
            f"{memory_class.__name__}.provider({options}",
        )

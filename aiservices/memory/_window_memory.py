"""A window kept in step with a store: the memory both window memories and summaries share.

Each operation (read, add, set, clear) is one generator that yields its store I/O and asks
for model calls; a sync and an async driver perform them under the memory's lock, so the
rules are written once. Store traffic: a read reads once (only the rows newer than the
window when the store can); an add writes one delta, and reads only when the memory holds
no window yet.

Calibration (``calibrate=True``): after a turn, `WindowChatMemory.observe_usage`
compares the provider's count of the request's input with the memory's estimate of the same
messages; the ratio divides the limit from then on. The window is trimmed to it at the next
add, never at a read: a read never hides a message that the store still holds in the window.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Hashable, Iterable, Sequence
from typing import Any, Final, Generic, Protocol, TypeVar

from .._locks import TurnLock
from .._threads import is_carried_to_its_end, waited_out
from ..messages import ChatMessage, SystemMessage, UserMessage, new_message_id
from ..stores._base import ChatMemoryStore, ConcurrentChangeError
from ._base import own_store
from ._store_ops import AsyncMode, Change, store_ops
from ._window import EVICT, Limit, OverflowPolicy, Window, check_limit, check_messages, message_key

__all__ = ["ReportedUsage", "WindowChatMemory", "WindowChatMemoryProvider"]

READ: Final = 0
WRITE: Final = 1
REPLACE: Final = 2
DELETE: Final = 3
ASK: Final = 4  # a model call an overflow policy asks for: (model, request)

# How many times in a row an add plans again on a conversation other writers keep changing
# before it gives up: each refusal means another writer's write went through.
_REPLANS: Final = 100

_Steps = Generator[tuple[int, Any], Any, Any]


class ReportedUsage(Protocol):
    """What calibration reads of a reported ``TokenUsage``."""

    @property
    def input_tokens(self) -> int | None: ...


_NOTHING: Final = UserMessage("")


class WindowChatMemory:
    """A memory whose window keeps the newest messages that fit its limit, in a store.

    ``count`` gives a message's cost (``None``: 1 per message); ``policy`` decides what
    becomes of the units that no longer fit (by default they are evicted).
    """

    _limit_name: str = "limit"

    def __init__(
        self,
        limit: Limit,
        *,
        id: Hashable,  # noqa: A002
        store: ChatMemoryStore | None,
        always_keep_system_message_first: bool,
        evict_whole_turns: bool,
        count: Callable[[ChatMessage], int] | None = None,
        calibrate: bool = False,
        policy: OverflowPolicy = EVICT,
        count_text: Callable[[str], int] | None = None,
        counting_waits: Callable[[], bool] | None = None,
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
        self._store: Any = default_store() if store is None else check_store(store)
        self._ops = store_ops(self._store)
        self._read = self._ops.reader(self._store)
        # Before any turn: an id the store can't hold fails here, not at the write that
        # follows a paid model call.
        self._ops.check_id(self._store, id)
        self._keep_system_first = bool(always_keep_system_message_first)
        self._whole_turns = bool(evict_whole_turns)
        self._count = count
        self._policy = policy
        self._lock = TurnLock()
        self._handed_off = False  # an async caller left the lock to a worker thread
        self._costs: dict[object, int] = {}  # by message_key, for the window's messages
        self._window: Window | None = None  # None: read the store first
        self._since: object = None  # what the store's last read said to pass to the next
        # Stored messages the window left out at a read: the next add removes them.
        self._pending: list[ChatMessage] = []
        self.evicted_messages = 0
        """Messages this memory object's adds removed from its store's window."""
        self._calibrate = bool(calibrate)
        self._base_limit = self._fixed_limit
        self._factor = 1.0  # provider tokens per estimated token
        # Estimated tokens of what the last observed request carried beside its messages
        # (tool definitions, a response schema): the window's limit leaves room for them.
        self._overhead = 0
        self._count_text = count_text
        # Whether counting may wait on I/O now (an estimator asking an API): async callers
        # then run the memory's operations in a worker thread, off their event loop.
        self._counting_waits = counting_waits
        self._overhead_of: tuple[object, object, int] | None = None  # (tools, format, cost)
        # Costs of the messages the last add evicted, kept for calibration: the request it
        # observes held them, and the window no longer does.
        self._gone: dict[object, int] = {}

    # The ChatMemory protocol.

    @property
    def id(self) -> Hashable:
        """The memory id: the key of this conversation in the store."""
        return self._id

    @property
    def store(self) -> ChatMemoryStore:
        """The store that keeps this memory's messages."""
        return self._store  # type: ignore[no-any-return]

    @property
    def is_blocking(self) -> bool:
        """Whether the store or the counting does I/O; when not, async callers use the sync
        methods."""
        return self._ops.mode is not AsyncMode.DIRECT or self._waits_to_count()

    def _waits_to_count(self) -> bool:
        waits = self._counting_waits
        return waits is not None and waits()

    def messages(self) -> list[ChatMessage]:
        """The messages in the window, oldest first; reads the store once.

        A limit lowered since the last write trims here; the store is trimmed at the next add.
        """
        lock = self._lock
        lock.acquire()
        try:
            if self._count is not None and self._waits_to_count():
                # A count that must load first (a tokenizer's encoding) loads at the read
                # that opens a turn: one that cannot load fails it before the model is
                # called, not at the write after a paid answer.
                self._count(_NOTHING)
            limit = self._read_limit()
            stored, self._since = self._read(self._id, self._since)
            return self._settle(stored, limit)
        except BaseException:
            self._reset()
            raise
        finally:
            lock.release()

    def add(self, *messages: ChatMessage) -> None:
        """Add messages in order with one store write, then evict what no longer fits.

        A message without a ``message_id`` is stored with a new one.
        """
        if not messages:
            return
        check_messages(messages, "add")
        self._run(self._adding(messages))

    def set(self, messages: Iterable[ChatMessage]) -> None:
        """Replace the conversation with ``messages``, under the window's rules."""
        given = list(messages)
        check_messages(given, "set")
        self._run(self._setting(given))

    def clear(self) -> None:
        """Remove every message of this conversation from the store."""
        self._run(self._clearing())

    async def amessages(self) -> list[ChatMessage]:
        """`messages` for async callers: never blocks the event loop on the store."""
        if self._waits_to_count():
            return await _in_worker(self.messages)  # type: ignore[no-any-return]
        return await self._arun(self._reading())  # type: ignore[no-any-return]

    async def aadd(self, *messages: ChatMessage) -> None:
        """`add` for async callers."""
        if not messages:
            return
        check_messages(messages, "add")
        if self._waits_to_count():
            await _in_worker(self.add, *messages)
            return
        await self._arun(self._adding(messages))

    async def aset(self, messages: Iterable[ChatMessage]) -> None:
        """`set` for async callers."""
        given = list(messages)
        check_messages(given, "set")
        if self._waits_to_count():
            await _in_worker(self.set, given)
            return
        await self._arun(self._setting(given))

    async def aclear(self) -> None:
        """`clear` for async callers."""
        await self._arun(self._clearing())

    # Calibration.

    def _request_overhead(self, request: object) -> int:
        """Estimated tokens of ``request``'s tool definitions and response schema; counted
        once for the same objects (a service sends the same ones on every turn)."""
        count_text = self._count_text
        if request is None or count_text is None:
            return 0
        tools = getattr(request, "tools", ())
        response_format = getattr(request, "response_format", None)
        cached = self._overhead_of
        if cached is not None and cached[0] is tools and cached[1] is response_format:
            return cached[2]
        from pydantic_core import to_json

        parts: list[object] = list(tools)
        if response_format is not None:
            parts.append(response_format)
        cost = count_text(to_json(parts, fallback=str).decode()) if parts else 0
        self._overhead_of = (tools, response_format, cost)
        return cost

    def _observe_usage(
        self, messages: Sequence[ChatMessage], usage: ReportedUsage, request: object = None
    ) -> None:
        """Compare the provider's input count for ``messages`` with the memory's estimate.

        The ratio divides the limit from now on; the next add trims the window to it. Best
        effort: a busy lock or a failing estimator skips the observation.
        """
        if not self._calibrate or self._waits_to_count():
            # (An estimator that asks an API counts as the provider does: nothing to
            # correct, and its count would wait on the caller's event loop.)
            return
        reported = usage.input_tokens
        if type(reported) is not int or reported <= 0:
            return
        # Never wait: on an async caller's event loop this runs without awaiting, and a
        # busy lock only means one observation fewer.
        if not self._lock.try_acquire():
            return
        try:
            window = self._window
            if window is None:
                return
            known, gone = self._costs, self._gone
            # A message sent in another form than the one held under its id (the user
            # message with what a retriever found) is counted as it was sent.
            held = {message_key(h): h for h in window.snapshot()}
            estimate = 0
            for m in messages:
                key = message_key(m)
                cost = known.get(key)
                if cost is not None:
                    same = held.get(key)
                    if same is not m and same != m:
                        count = self._count
                        cost = 1 if count is None else count(m)
                if cost is None:
                    cost = gone.get(key)
                    if cost is None:
                        # A message the memory never held (a parse retry's feedback).
                        cost = window.cost(m)
                estimate += cost
            overhead = self._request_overhead(request)
            if estimate + overhead <= 0:
                return
            # The provider's count covers the messages and what the request carries beside
            # them; taken as one ratio, a fixed overhead would shrink a short window to
            # nothing (300 tokens of tools over a 3-token "hi" is a ratio of 100).
            self._factor = reported / (estimate + overhead)
            self._overhead = overhead
            if self._limit_fn is None:
                self._fixed_limit = self._corrected(self._base_limit)
            # The window as it is counts as trimmed to the new limit, so that a read shows
            # what the store holds; the next add evicts what no longer fits, in its write.
            window.limit = self._read_limit()
        except Exception:
            return  # this runs after the turn's commit: nothing here may fail the call
        finally:
            self._lock.release()

    # The operations, as steps.

    def _reading(self) -> _Steps:
        limit = self._read_limit()
        stored = yield READ, None
        return self._settle(stored, limit)

    def _adding(self, messages: Sequence[ChatMessage]) -> _Steps:
        limit = self._read_limit()
        replans = 0
        while True:
            window = self._window
            # (A checked write is planned on a read: after set() there is none.)
            if window is None or self._pending or (self._since is None and self._ops.checks_writes):
                window = self._load((yield READ, None), limit, trim=False)
            added, removed, outcome = self._begin_add(window, messages, limit)
            if type(outcome) is not tuple:
                outcome = yield from outcome
            write = self._end_add(window, added, removed, outcome)
            if write is None:
                return None
            try:
                yield WRITE, write
            except ConcurrentChangeError:
                # Another writer changed the conversation since the read this add was
                # planned on: plan it again on what the store holds now.
                replans += 1
                if replans > _REPLANS:
                    raise
                self._window = None
                continue
            self.evicted_messages += len(write.removed)
            return None

    def _settle(self, stored: list[ChatMessage], limit: int) -> list[ChatMessage]:
        """The window for what a read found: the one held when the store holds just it."""
        window = self._window
        if window is None or window.limit != limit or self._pending or not window.holds(stored):
            window = self._load(stored, limit)
        return window.snapshot()

    def _begin_add(
        self, window: Window, messages: Sequence[ChatMessage], limit: int
    ) -> tuple[list[ChatMessage], list[ChatMessage], Any]:
        """Add to ``window``; return what was added, what left, and the policy's outcome
        (or the generator that makes it, asking a model first)."""
        policy = self._policy
        lead: ChatMessage | None = None
        if policy is not EVICT:
            # A copied conversation (add(*other.messages())) brings its lead along. Of
            # several, the last leads and the others stay plain messages, as a load keeps
            # them: each may cover turns the others do not.
            for m in messages:
                if policy.is_lead(m):
                    lead = m
            if lead is not None:
                messages = [m for m in messages if m is not lead]
        added, removed = window.add(messages)
        if self._pending:
            removed = [*self._pending, *removed]
            self._pending = []
        if lead is not None and (window.lead is None or window.lead.message_id != lead.message_id):
            old = window.set_lead(lead, window.cost(lead))
            added.append(lead)
            if old is not None:
                window.forget([old])
                removed.append(old)
        return added, removed, policy.overflow(window, limit, added)

    def _end_add(
        self,
        window: Window,
        added: list[ChatMessage],
        removed: list[ChatMessage],
        outcome: tuple[list[ChatMessage], list[ChatMessage]],
    ) -> Change | None:
        """The store write for an add whose overflow came out as ``outcome``, if any: what
        to append, what to remove, the window, and what left in the add that brought it."""
        evicted, inserted = outcome
        passed: list[ChatMessage] = []
        if evicted:
            if self._calibrate:
                self._gone = {}
                window.forget(evicted, self._gone)
            else:
                window.forget(evicted)
            held = window.known
            for m in added:
                if m.message_id not in held:
                    # Evicted by the add that brought it: never in the window, and in the
                    # history of a store that keeps one.
                    batch = {m.message_id for m in added}
                    passed = [m for m in added if m.message_id not in held]
                    added = [m for m in added if m.message_id in held]
                    evicted = [m for m in evicted if m.message_id not in batch]
                    break
            removed += evicted
        if inserted:
            added += inserted
        if added or removed or passed:
            return Change(added, removed, window.snapshot, passed)
        return None

    def _setting(self, given: list[ChatMessage]) -> _Steps:
        limit = self._read_limit()
        seen: set[str] = set()
        messages: list[ChatMessage] = []
        for m in given:
            mid = m.message_id
            if mid is None or mid in seen:
                mid = new_message_id()
                messages.append(m.with_metadata(message_id=mid))
            else:
                messages.append(m)
            seen.add(mid)
        window = self._new_window()
        window.load(
            messages, self._lead_test(), self._shown()
        )  # what it leaves out is never stored
        if self._policy.evicts_on_read:
            window.forget(window.trim(limit))
        else:
            window.limit = limit
        kept = window.snapshot()
        if self._keep_system_first and kept and type(kept[0]) is SystemMessage:
            # Shown first, a system message is stored where it arrived: written back, it
            # stays there (else the store and its history would be reordered).
            stored = yield READ, None
            kept = _in_stored_place(kept, stored)
        yield REPLACE, kept
        self._window = window
        self._pending = []
        self._since = None
        return None

    def _clearing(self) -> _Steps:
        yield DELETE, None
        # The next read or add starts from the emptied store. Clearing reads no limit: one
        # that fails for an id being erased (a deleted account) must not fail the erasure.
        self._window = None
        self._pending = []
        self._since = None
        self._costs.clear()  # a message stored again under an old id is counted afresh
        return None

    def _new_window(self) -> Window:
        return Window(
            self._count,
            self._costs,
            keep_system_first=self._keep_system_first,
            whole_turns=self._whole_turns,
        )

    def _shown(self) -> list[ChatMessage]:
        """What the memory's window showed before it is rebuilt (empty: none yet), and what
        a read left out that the store still holds: the messages whose costs it knows."""
        window = self._window
        return [] if window is None else [*window.snapshot(), *self._pending]

    def _lead_test(self) -> Callable[[ChatMessage], bool] | None:
        policy = self._policy
        return None if policy is EVICT else policy.is_lead

    def _load(self, stored: Sequence[ChatMessage], limit: int, *, trim: bool = True) -> Window:
        """The window for what the store holds; what it leaves out is removed at the next add.

        An add loads without trimming (``trim=False``): it applies the limit to what the
        store holds with the new messages, so that what it keeps never depends on a read
        made before it. What a read trims keeps its cost, counted once, while the store
        holds it.
        """
        window = self._new_window()
        dropped = window.load(stored, self._lead_test(), self._shown())
        if trim and self._policy.evicts_on_read:
            dropped += window.trim(limit)
        else:
            window.limit = limit
        self._window = window
        self._pending = dropped
        return window

    def _read_limit(self) -> int:
        limit_fn = self._limit_fn
        if limit_fn is None:
            return self._fixed_limit
        value = limit_fn(self._id)
        if type(value) is not int or value < 1:
            value = check_limit(value, self._limit_name, source=f"{self._limit_name}({self._id!r})")
        return self._corrected(value)

    def _corrected(self, limit: int) -> int:
        """``limit`` in provider tokens as the window's limit in estimated tokens."""
        factor, overhead = self._factor, self._overhead
        if factor == 1.0 and not overhead:
            return limit
        return max(1, int(limit / factor) - overhead)

    # The drivers: they perform the steps' I/O and hold the lock; no rule lives here.

    def _run(self, steps: _Steps) -> Any:
        lock = self._lock
        lock.acquire()
        try:
            return self._drive(steps)
        except BaseException:
            self._reset()
            raise
        finally:
            lock.release()

    def _drive(self, steps: _Steps) -> Any:
        perform = self._perform
        value: Any = None
        refused: ConcurrentChangeError | None = None
        while True:
            try:
                if refused is None:
                    op, argument = steps.send(value)
                else:
                    op, argument = steps.throw(refused)
                    refused = None
            except StopIteration as stop:
                return stop.value
            try:
                value = perform(op, argument)
            except ConcurrentChangeError as error:  # the steps plan again
                refused = error

    def _perform(self, op: int, argument: Any) -> Any:
        ops, store, memory_id = self._ops, self._store, self._id
        if op == READ:
            stored, self._since = self._read(memory_id, self._since)
            return stored
        if op == WRITE:
            self._since = ops.write(store, memory_id, argument, self._since)
        elif op == REPLACE:
            ops.replace(store, memory_id, argument)
        elif op == DELETE:
            ops.delete(store, memory_id)
        else:
            model, request = argument
            try:
                return model.chat(request)
            except Exception as error:  # handed back to the policy, which decides
                return error
        return None

    async def _arun(self, steps: _Steps) -> Any:
        await self._lock.aacquire()
        try:
            return await self._adrive(steps)
        except BaseException:
            if not self._handed_off:  # else the worker thread resets when it ends
                self._reset()
            raise
        finally:
            self._unlock()

    async def _adrive(self, steps: _Steps) -> Any:
        value: Any = None
        refused: ConcurrentChangeError | None = None
        while True:
            try:
                if refused is None:
                    op, argument = steps.send(value)
                else:
                    op, argument = steps.throw(refused)
                    refused = None
            except StopIteration as stop:
                return stop.value
            try:
                value = await (_aask(*argument) if op == ASK else self._aio(op, argument))
            except ConcurrentChangeError as error:  # the steps plan again
                refused = error

    async def _aio(self, op: int, argument: Any) -> Any:
        """Perform a store step for an async caller, the lock held."""
        import asyncio
        import threading

        mode = self._ops.mode
        if mode is AsyncMode.DIRECT:
            return self._perform(op, argument)
        if mode is AsyncMode.NATIVE:
            return await self._aperform(op, argument)
        # The worker thread ends the call itself when the caller has left meanwhile (what
        # it did is forgotten, then the lock released): a callback on the loop would never
        # run if the loop closed first, and the caller resetting the memory while the
        # worker still used it would race with it.
        guard = threading.Lock()
        left = [False, False]  # [the caller gave up the lock to the worker, the worker ended]
        lock = self._lock

        def perform() -> Any:
            try:
                return self._perform(op, argument)
            finally:
                with guard:
                    left[1] = True
                    if left[0]:
                        self._reset()
                        lock.release()

        work = asyncio.get_running_loop().run_in_executor(None, perform)
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            if is_carried_to_its_end():
                # A service's commit: the call learns whether its turn was written.
                if await waited_out(work):
                    return work.result()
                raise
            with guard:
                if not left[1]:
                    left[0] = True  # the worker thread goes on, and releases the lock
                    self._handed_off = True
                    lock.pass_to_thread()
            raise

    def _unlock(self) -> None:
        if self._handed_off:
            self._handed_off = False
        else:
            self._lock.release()

    async def _aperform(self, op: int, argument: Any) -> Any:
        ops, store, memory_id = self._ops, self._store, self._id
        if op == READ:
            stored, self._since = await ops.aread(store, memory_id, self._since)
            return stored
        if op == WRITE:
            self._since = await ops.awrite(store, memory_id, argument, self._since)
        elif op == REPLACE:
            await ops.areplace(store, memory_id, argument)
        else:
            await ops.adelete(store, memory_id)
        return None

    def _reset(self) -> None:
        # After a failure the store may or may not hold the write: read it again, and count
        # what it holds afresh.
        self._window = None
        self._pending = []
        self._since = None
        self._costs.clear()

    def __repr__(self) -> str:
        spec = self._limit_spec
        limit = spec if not callable(spec) else getattr(spec, "__qualname__", spec)
        return (
            f"{type(self).__name__}({self._limit_name}={limit!r}, id={self._id!r}, "
            f"store={self._store!r})"
        )


def _in_stored_place(kept: list[ChatMessage], stored: list[ChatMessage]) -> list[ChatMessage]:
    """``kept``, shown system message first, with that message moved back after the one it
    follows in ``stored``, when both are stored and kept."""
    system_id = kept[0].message_id
    ids = [m.message_id for m in stored]
    if system_id not in ids or ids.index(system_id) == 0:
        return kept
    before = ids[ids.index(system_id) - 1]
    rest = kept[1:]
    for i, message in enumerate(rest):
        if message.message_id == before:
            return [*rest[: i + 1], kept[0], *rest[i + 1 :]]
    return kept


async def _aask(model: Any, request: Any) -> Any:
    import asyncio

    try:
        achat = getattr(model, "achat", None)
        if achat is not None:
            return await achat(request)
        return await asyncio.to_thread(model.chat, request)
    except Exception as error:  # handed back to the policy, which decides
        return error


def check_store(store: object) -> ChatMemoryStore:
    """``store`` if it is a ``ChatMemoryStore`` object, else a ``TypeError`` saying why not."""
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


def default_store() -> ChatMemoryStore:
    """A new ``InMemoryChatMemoryStore``."""
    from ..stores.in_memory import InMemoryChatMemoryStore

    store = InMemoryChatMemoryStore()
    own_store(store)
    return store


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
        shared = default_store() if store is None else check_store(store)
        return cls(
            lambda memory_id: make(memory_id, shared),
            shared,
            f"{memory_class.__name__}.provider({options}",
        )


async def _in_worker(operation: Callable[..., Any], *args: Any) -> Any:
    """``operation(*args)`` in a worker thread (it takes the memory's lock there)."""
    import asyncio

    return await asyncio.to_thread(operation, *args)

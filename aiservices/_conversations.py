"""A service's conversations: the memory of each id, cached, with the lock that serialises
its turns.

Ids are keyed as the stores key them (``store_key``), so ``1``, ``True``, ``1.0`` and
``"1"`` are four conversations here as in every store. The provider is called once per id
however many first calls arrive together; a provider that gives ``None`` is a
``TypeError`` before any turn runs.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Hashable
from typing import TYPE_CHECKING, Any

from ._locks import LoopBlocked, Reentered, TurnLock
from ._threads import carried_to_its_end, in_thread
from .memory import ChatMemory
from .memory._base import DEFAULT_MEMORY_ID, ChatMemoryProvider, is_own_store
from .stores._base import store_key

if TYPE_CHECKING:
    import asyncio

__all__ = ["Conversation", "Conversations", "aerase", "erase", "key_of", "settled", "to_the_end"]


def key_of(memory_id: Hashable) -> str:
    """The key of ``memory_id`` in the cache; a ``TypeError`` names an unhashable id."""
    if type(memory_id) is str:
        return store_key(memory_id)
    hash(memory_id)  # the stores' key would accept a list; a conversation id must not
    return store_key(memory_id)


class Conversation:
    """A memory with the lock its turns hold.

    ``retired`` is set, with the lock held, when the cache drops the conversation: a caller
    that looked it up just before then finds the flag once it holds the lock, and looks the
    id up again instead of running beside the conversation's successor.
    """

    __slots__ = (
        "blocking",
        "erased",
        "evicted_before",
        "lock",
        "memory",
        "observe",
        "retired",
        "turns",
    )

    def __init__(self, memory: ChatMemory) -> None:
        self.memory = memory
        self.lock = TurnLock()
        self.retired = False
        # Retired because a turn erased it (a scope that ended while the turn ran): a forget
        # that waited for it has nothing left to do.
        self.erased = False
        self.turns = 0  # turns committed, counted with the lock held
        # What the memory had evicted before it was cached here: a provider may hand back
        # a memory it made before, whose evictions were counted when it was last dropped.
        self.evicted_before: int = getattr(memory, "evicted_messages", 0)
        # Async calls use a memory that does no I/O (`is_blocking = False`) directly.
        self.blocking = getattr(memory, "is_blocking", True) is not False
        # A memory that counts tokens may calibrate its estimate with the provider's count.
        self.observe: Callable[..., None] | None = _observer(memory)


def _observer(memory: object) -> Callable[..., None] | None:
    """The memory's ``observe_usage`` as ``(messages, usage, request)``; one written before
    it took the request is given the first two."""
    observe = getattr(memory, "observe_usage", None)
    if observe is None:
        return None
    import inspect

    try:
        parameters = inspect.signature(observe).parameters
    except (TypeError, ValueError):
        parameters = {}  # type: ignore[assignment]
    if "request" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    ):
        return observe  # type: ignore[no-any-return]

    def without_request(messages: object, usage: object, request: object = None) -> None:
        observe(messages, usage)

    return without_request


def _check_made(memory: object, memory_id: Hashable) -> None:
    """Raise ``TypeError`` for what a provider returned that can't be the conversation's
    memory: not a memory at all, or one that stores under the default id although it was
    made for another (made without ``id=memory_id``)."""
    if not (callable(getattr(memory, "messages", None)) and callable(getattr(memory, "add", None))):
        raise TypeError(
            f"chat_memory_provider returned {type(memory).__name__} for the memory id "
            f"{memory_id!r}; it must return a ChatMemory, such as MessageWindowChatMemory(20, "
            "id=memory_id)"
        )
    made_for = getattr(memory, "id", memory_id)
    store = getattr(memory, "store", None)
    if (
        made_for == DEFAULT_MEMORY_ID
        and memory_id != DEFAULT_MEMORY_ID
        and store is not None
        and not is_own_store(store)
    ):
        # Made without its id: every conversation would be stored under the default one.
        # (A memory with no store, or a store of its own, keeps to itself; a store given
        # to the memories of several ids files them all under that one key.)
        raise TypeError(
            f"chat_memory_provider returned a memory with the default id {made_for!r} for the "
            f"memory id {memory_id!r}: every user would share one stored conversation. Make "
            "it with the id it is given, such as MessageWindowChatMemory(20, id=memory_id, "
            "store=store)"
        )


class _Making:
    """A conversation whose memory the provider is making; later callers wait for it."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = threading.Event()


class Conversations:
    """The cached conversations of one service, least recently used first."""

    __slots__ = (
        "_forgotten",
        "_lock",
        "_making",
        "_provider",
        "_retired_evictions",
        "_retired_turns",
        "_size",
        "_table",
    )

    def __init__(self, provider: ChatMemoryProvider | None, size: int) -> None:
        self._provider = provider
        self._size = size
        self._table: OrderedDict[str, Conversation] = OrderedDict()
        self._making: dict[str, _Making] = {}
        self._lock = threading.Lock()
        # What conversations no longer cached had counted, and the conversations forgotten.
        self._retired_turns = 0
        self._retired_evictions = 0
        self._forgotten = 0

    def counts(self, *others: Conversation) -> tuple[int, int, int, int]:
        """Cached conversations, turns committed, messages evicted, conversations forgotten.

        ``others``: conversations outside the cache (a service's own memory) to count too.
        """
        with self._lock:
            entries = [*self._table.values(), *others]
            turns, evictions, forgotten = (
                self._retired_turns,
                self._retired_evictions,
                self._forgotten,
            )
            cached = len(self._table) + len(others)
        for entry in entries:
            turns += entry.turns
            evictions += _evicted_while_cached(entry)
        return cached, turns, evictions, forgotten

    @property
    def has_provider(self) -> bool:
        """Whether the service has a ``chat_memory_provider`` to make conversations."""
        return self._provider is not None

    def cached(self, key: str) -> Conversation | None:
        """The cached conversation of ``key`` (``key_of(memory_id)``), now the most recently
        used; ``None`` on a miss."""
        table = self._table
        entry = table.get(key)
        if entry is not None:
            # Atomic under the GIL, as is the lookup: a hit takes no lock. (A `with
            # suppress(...)` would cost more than the rest of the lookup.)
            try:  # noqa: SIM105
                table.move_to_end(key)
            except KeyError:  # dropped meanwhile: the caller finds it retired
                pass
        return entry

    def get(self, memory_id: Hashable, key: str) -> Conversation:
        """The conversation of ``memory_id`` (``key`` is ``key_of(memory_id)``), made on a miss."""
        entry = self.cached(key)
        return self._make(memory_id, key) if entry is None else entry

    async def aget(self, memory_id: Hashable, key: str) -> Conversation:
        """`get` for a task: a provider that makes a memory runs in a worker thread."""
        entry = self.cached(key)
        if entry is not None:
            return entry
        import asyncio

        return await asyncio.to_thread(self._make, memory_id, key)

    def forget(self, entry: Conversation, memory_id: Hashable, key: str | None) -> None:
        """Erase ``entry``'s conversation (memory, stored messages, history), between turns."""
        held = self.hold(entry, memory_id, key, erasing=True)
        if held is None:
            return
        entry = held
        try:
            erase(entry.memory)
        finally:
            entry.lock.release()
        self._forgot(key)

    async def aforget(self, entry: Conversation, memory_id: Hashable, key: str | None) -> None:
        """`forget` without blocking the event loop."""
        held = await self.ahold(entry, memory_id, key, erasing=True)
        if held is None:
            return
        entry = held
        try:
            await aerase(entry)
        finally:
            entry.lock.release()
        self._forgot(key)

    def _forgot(self, key: str | None) -> None:
        with self._lock:
            self._forgotten += 1
        if key is not None:
            self.evict(key)

    def drop_held(self, entry: Conversation, key: str, *, forgotten: bool) -> None:
        """Drop ``entry`` from the cache while its caller holds its lock (the next caller
        makes a new one); ``forgotten``: its conversation was just erased."""
        with self._lock:
            if forgotten:
                self._forgotten += 1
                entry.erased = True
            if self._table.get(key) is entry:
                self._drop(key, entry)

    def _make(self, memory_id: Hashable, key: str) -> Conversation:
        provider = self._provider
        assert provider is not None
        while True:
            with self._lock:
                entry = self._table.get(key)
                if entry is not None:
                    return entry
                making = self._making.get(key)
                mine = making is None
                if mine:
                    making = self._making[key] = _Making()
            assert making is not None
            if mine:
                break
            making.done.wait()
        try:
            memory: Any = provider(memory_id)
            if memory is None:
                raise TypeError(
                    f"chat_memory_provider returned None for the memory id {memory_id!r}; "
                    "it must return a ChatMemory, such as MessageWindowChatMemory(20, "
                    "id=memory_id)"
                )
            _check_made(memory, memory_id)
            entry = Conversation(memory)
            with self._lock:
                self._table[key] = entry
                self._trim()
            return entry
        finally:
            with self._lock:
                del self._making[key]
            making.done.set()

    def _trim(self) -> None:
        table = self._table
        excess = len(table) - self._size
        if excess <= 0:
            return
        # Least recently used first; a conversation in use (its lock held or awaited) stays,
        # and so does the newest, which its caller is about to take.
        for key, entry in list(table.items())[:-1]:
            if self._retire(key, entry):
                excess -= 1
                if not excess:
                    return

    def evict(self, key: str) -> None:
        """Drop the cached conversation of ``key`` unless a turn holds it."""
        with self._lock:
            entry = self._table.get(key)
            if entry is not None:
                self._retire(key, entry)

    def _retire(self, key: str, entry: Conversation) -> bool:
        # Called with the table's lock held.
        if not entry.lock.try_acquire():
            return False
        self._drop(key, entry)
        entry.lock.release()
        return True

    def _drop(self, key: str, entry: Conversation) -> None:
        # Called with the table's lock and the entry's held.
        entry.retired = True
        del self._table[key]
        self._retired_turns += entry.turns
        self._retired_evictions += _evicted_while_cached(entry)

    def hold(
        self,
        entry: Conversation | None,
        memory_id: Hashable,
        key: str | None,
        *,
        erasing: bool = False,
    ) -> Conversation | None:
        """Take ``entry``'s turn lock, following the id to a new entry if it was retired
        (``None``: not cached yet, made now). ``erasing``: ``None`` instead when a turn
        erased the entry meanwhile."""
        if entry is None:
            assert key is not None
            entry = self.get(memory_id, key)
        while True:
            try:
                entry.lock.acquire()
            except Reentered:
                raise _reentered(memory_id) from None
            if not entry.retired:
                return entry
            entry.lock.release()
            if erasing and entry.erased:
                return None
            assert key is not None  # a service's own memory (chat_memory=) is never retired
            entry = self.get(memory_id, key)

    async def ahold(
        self,
        entry: Conversation | None,
        memory_id: Hashable,
        key: str | None,
        *,
        erasing: bool = False,
    ) -> Conversation | None:
        """`hold` for a task: waits, and makes a memory, without blocking the event loop."""
        if entry is None:
            assert key is not None
            entry = await self.aget(memory_id, key)
        while True:
            try:
                await entry.lock.aacquire()
            except Reentered:
                raise _reentered(memory_id) from None
            if not entry.retired:
                return entry
            entry.lock.release()
            if erasing and entry.erased:
                return None
            assert key is not None
            entry = await self.aget(memory_id, key)


def _reentered(memory_id: Hashable) -> Reentered:
    return Reentered(
        f"a call on the conversation {memory_id!r} was made from inside a call that holds it "
        "(its tool, guardrail or retriever, or the code reading its stream, called the "
        "service again), and would wait for itself forever. Give the inner call a memory id "
        "of its own, or make it on a service without this memory (a method without a "
        "MemoryId parameter shares the service's conversation); a stream's reader may call "
        "once it has seen TurnCompleted or the stream has ended"
    )


def _evicted_while_cached(entry: Conversation) -> int:
    """The messages ``entry``'s memory has evicted since it was cached."""
    return int(getattr(entry.memory, "evicted_messages", 0)) - entry.evicted_before


def erase(memory: ChatMemory) -> None:
    """Clear ``memory`` and, when its store keeps history, erase that too.

    History is erased even when clearing fails: what a user asked to forget must not stay
    behind because the memory's own step went wrong (the error is raised after).
    """
    forget = getattr(getattr(memory, "store", None), "forget", None)
    try:
        memory.clear()
    finally:
        if forget is not None:
            forget(memory.id)


async def aerase(entry: Conversation) -> None:
    """`erase` ``entry``'s memory without blocking the event loop, to its end even when the
    caller is cancelled meanwhile."""
    if not entry.blocking:
        try:
            erase(entry.memory)
            return
        except LoopBlocked:
            pass  # a task of this loop has the memory, or is queued for it: wait in a thread
    await settled(in_thread(erase, entry.memory))


async def settled(write: Coroutine[Any, Any, Any]) -> Any:
    """Await a write to its end, even when the caller is cancelled meanwhile.

    A cancelled caller must not be told the call failed while the write goes on and lands
    (in a worker thread, or a request already sent to a server): the write runs as a task
    of its own, the conversation's lock stays held until it has finished, and the caller
    gets its outcome: the answer when the turn was written, the store's error when not.
    """
    # Cancelled itself (every task is, when a loop shuts down), the write still waits for
    # what a thread has under way and hands back its outcome; it raises CancelledError only
    # when nothing was under way, or when its store is a network client whose request the
    # cancellation stopped, which may or may not have landed.
    task, _ = await to_the_end(carried_to_its_end(write), absorb=True)
    return task.result()


async def to_the_end(
    work: Coroutine[Any, Any, Any], *, absorb: bool = False
) -> tuple[asyncio.Task[Any], BaseException | None]:
    """Run ``work`` as a task of its own and wait for its end, even when cancelled meanwhile;
    the ended task, and the cancellation that came meanwhile, if one did.

    With ``absorb``, the caller will not raise that cancellation: the current task's count
    of pending cancellations is taken back down, so that an ``asyncio.timeout`` around the
    caller that expires later still raises ``TimeoutError``, not ``CancelledError``.
    """
    import asyncio

    task = asyncio.ensure_future(work)
    cancelled: BaseException | None = None
    while not task.done():
        try:
            await asyncio.wait((task,))  # (which never cancels the task it waits for)
        except asyncio.CancelledError as stopped:
            cancelled = stopped
            current = asyncio.current_task() if absorb else None
            if current is not None:
                current.uncancel()
    return task, cancelled

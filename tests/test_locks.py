"""The turn lock: one holder at a time across threads and asyncio tasks, in FIFO order."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from types import SimpleNamespace

import pytest

from aiservices import _locks
from aiservices._locks import TurnLock


def test_threads_take_turns() -> None:
    lock = TurnLock()
    inside = 0
    overlap = False

    def work() -> None:
        nonlocal inside, overlap
        for _ in range(200):
            lock.acquire()
            inside += 1
            overlap = overlap or inside > 1
            inside -= 1
            lock.release()

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not overlap
    assert not lock.locked


async def test_tasks_are_served_in_arrival_order() -> None:
    lock = TurnLock()
    order: list[int] = []
    await lock.aacquire()

    async def waiter(i: int) -> None:
        await lock.aacquire()
        order.append(i)
        lock.release()

    tasks = [asyncio.create_task(waiter(i)) for i in range(5)]
    await asyncio.sleep(0.01)
    lock.release()
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3, 4]


async def test_a_cancelled_waiter_does_not_keep_the_lock() -> None:
    lock = TurnLock()
    await lock.aacquire()
    waiting = asyncio.create_task(lock.aacquire())
    await asyncio.sleep(0)
    waiting.cancel()
    await asyncio.sleep(0)
    lock.release()
    await asyncio.wait_for(lock.aacquire(), timeout=1)
    lock.release()
    assert not lock.locked


async def test_a_thread_and_a_task_share_the_lock() -> None:
    lock = TurnLock()
    events: list[str] = []
    lock.acquire()

    def in_thread() -> None:
        time.sleep(0.05)
        events.append("thread done")
        lock.release()

    thread = threading.Thread(target=in_thread)
    thread.start()
    await lock.aacquire()
    events.append("task got it")
    lock.release()
    await asyncio.to_thread(thread.join)
    assert events == ["thread done", "task got it"]


def test_threads_and_tasks_of_two_loops_never_overlap_or_hang() -> None:
    # Free-lock acquires take no mutex, so a release racing a waiter that is queuing must
    # still wake it: a lost wake-up would hang this test, an overlap would be counted.
    lock = TurnLock()
    inside = 0
    overlaps = 0
    done = 0

    def enter() -> None:
        nonlocal inside, overlaps
        inside += 1
        if inside > 1:
            overlaps += 1
        time.sleep(0)  # let another thread run while this one holds the lock
        inside -= 1

    def in_thread() -> None:
        nonlocal done
        for i in range(300):
            if i % 3 == 0 and lock.try_acquire():
                enter()
                lock.release()
                continue
            lock.acquire()
            enter()
            lock.release()
        done += 1

    def in_loop() -> None:
        async def task() -> None:
            for _ in range(150):
                await lock.aacquire()
                enter()
                await asyncio.sleep(0)
                lock.release()

        async def main() -> None:
            await asyncio.gather(*(task() for _ in range(3)))

        nonlocal done
        asyncio.run(main())
        done += 1

    workers = [threading.Thread(target=in_thread) for _ in range(3)]
    workers += [threading.Thread(target=in_loop) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=60)
    assert not any(w.is_alive() for w in workers), "a waiter was never woken"
    assert done == 5
    assert overlaps == 0
    assert not lock.locked


class _Interrupted(Exception):
    pass


def _raise_interrupted(signum: int, frame: object) -> None:
    raise _Interrupted


def test_a_thread_interrupted_while_waiting_leaves_the_queue() -> None:
    # As Ctrl-C would: a signal whose handler raises, delivered to the main thread while it
    # waits for a lock held by another thread.
    lock = TurnLock()
    holder_has_it, release_now = threading.Event(), threading.Event()

    def holder() -> None:
        lock.acquire()
        holder_has_it.set()
        release_now.wait(5)
        lock.release()

    def interrupter() -> None:
        time.sleep(0.1)  # the main thread waits by now
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGUSR1)
        time.sleep(0.05)
        release_now.set()

    previous = signal.signal(signal.SIGUSR1, _raise_interrupted)
    threads = [threading.Thread(target=holder), threading.Thread(target=interrupter)]
    try:
        threads[0].start()
        assert holder_has_it.wait(5)
        threads[1].start()
        with pytest.raises(_Interrupted):
            lock.acquire()
    finally:
        for t in threads:
            t.join(5)
        signal.signal(signal.SIGUSR1, previous)
    got = threading.Event()

    def later() -> None:
        lock.acquire()
        got.set()
        lock.release()

    threading.Thread(target=later, daemon=True).start()
    assert got.wait(2), "the lock went to the interrupted waiter and was never released"
    assert not lock.locked


def test_a_lock_handed_to_an_interrupted_waiter_is_passed_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lock = TurnLock()
    lock.acquire()

    class HandedOverThenInterrupted(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            lock.release()  # the holder is done: the lock is handed to this waiter
            assert self.is_set()
            raise _Interrupted

    monkeypatch.setattr(
        _locks, "threading", SimpleNamespace(Event=HandedOverThenInterrupted, Lock=threading.Lock)
    )
    with pytest.raises(_Interrupted):
        lock.acquire()
    assert not lock.locked, "the lock handed over to the interrupted waiter stayed held"


async def test_a_blocking_wait_behind_a_queued_task_of_this_loop_is_refused() -> None:
    # The task is next: it would get the lock while this thread, its loop's, waits for it.
    lock = TurnLock()
    holder_in = threading.Event()
    holder_out = threading.Event()

    def holder() -> None:
        lock.acquire()
        holder_in.set()
        holder_out.wait(5)
        lock.release()

    thread = threading.Thread(target=holder, daemon=True)
    thread.start()
    assert holder_in.wait(5)
    queued = asyncio.ensure_future(lock.aacquire())
    await asyncio.sleep(0.01)  # the task now waits in the queue
    with pytest.raises(RuntimeError, match="holds or waits for"):
        lock.acquire()
    holder_out.set()
    await asyncio.wait_for(queued, 5)  # the task goes on once the thread releases
    lock.release()
    thread.join(5)
    assert not lock.locked


async def test_a_blocking_wait_on_the_loop_of_the_task_holding_the_lock_is_refused() -> None:
    # The task could never go on while its loop's thread waits: a deadlock, said instead.
    lock = TurnLock()
    await lock.aacquire()
    with pytest.raises(RuntimeError, match="a task of the event loop running in this thread"):
        lock.acquire()
    # Another thread may wait for it: the task goes on and releases it.
    got = threading.Event()

    def other() -> None:
        lock.acquire()
        got.set()
        lock.release()

    thread = threading.Thread(target=other, daemon=True)
    thread.start()
    await asyncio.sleep(0.05)
    assert not got.is_set()
    lock.release()
    await asyncio.to_thread(thread.join, 5)
    assert got.is_set()
    lock.acquire()  # held by no task now: a blocking acquire on the loop's thread is fine
    lock.release()


async def test_a_blocking_call_on_the_loop_of_a_task_mid_turn_says_so() -> None:
    from typing import Annotated, Protocol

    from aiservices import MemoryId, MessageWindowChatMemory, ai_service
    from aiservices.testing import ScriptedChatModel

    answering, go = asyncio.Event(), asyncio.Event()

    class Waiting(ScriptedChatModel):
        async def achat(self, request: object) -> object:
            answering.set()
            await go.wait()
            return await super().achat(request)  # type: ignore[arg-type]

    class Bot(Protocol):
        def chat(self, user: Annotated[str, MemoryId], text: str) -> str: ...

        async def achat(self, user: Annotated[str, MemoryId], text: str) -> str: ...

    bot = ai_service(
        Bot, model=Waiting(default="ok"), chat_memory_provider=MessageWindowChatMemory.provider()
    )
    turn = asyncio.ensure_future(bot.achat("ann", "first"))
    await answering.wait()
    with pytest.raises(RuntimeError, match=r"await the async method"):
        bot.chat("ann", "second")
    go.set()
    assert await turn == "ok"

"""The turn lock: one holder at a time across threads and asyncio tasks, in FIFO order."""

from __future__ import annotations

import asyncio
import threading
import time

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

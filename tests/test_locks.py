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

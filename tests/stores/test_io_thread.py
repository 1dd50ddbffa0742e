"""A store's own thread for async callers: order, errors, cancellation, loops, idle, close."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
from pathlib import Path

import pytest

from aiservices import AiMessage, UserMessage
from aiservices.stores import SqliteChatMemoryStore, _io_thread
from aiservices.stores._io_thread import IoThread


async def test_calls_run_in_order_on_one_thread_and_return_their_results() -> None:
    io = IoThread("test")
    ran: list[tuple[int, str]] = []

    def work(i: int) -> int:
        ran.append((i, threading.current_thread().name))
        return i * i

    results = await asyncio.gather(*(io.run(work, i) for i in range(50)))
    assert results == [i * i for i in range(50)]
    assert [i for i, _ in ran] == list(range(50))
    assert {name for _, name in ran} == {"test"}
    io.close()


async def test_an_exception_reaches_its_caller_and_the_thread_goes_on() -> None:
    io = IoThread("test")

    def fail() -> None:
        raise ValueError("no such row")

    with pytest.raises(ValueError, match="no such row"):
        await io.run(fail)
    assert await io.run(lambda: 7) == 7
    io.close()


async def test_a_call_cancelled_while_queued_never_runs() -> None:
    io = IoThread("test")
    release = threading.Event()
    ran: list[str] = []
    first = asyncio.ensure_future(io.run(release.wait, 10))
    await asyncio.sleep(0.02)  # the first call holds the thread
    queued = asyncio.ensure_future(io.run(ran.append, "queued"))
    await asyncio.sleep(0.01)
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    release.set()
    assert await first is True
    assert await io.run(ran.append, "later") is None
    assert ran == ["later"]
    io.close()


async def test_a_call_cancelled_while_running_is_waited_for() -> None:
    io = IoThread("test")
    started, release = threading.Event(), threading.Event()
    ended: list[float] = []

    def slow() -> None:
        started.set()
        release.wait(10)
        ended.append(time.monotonic())

    call = asyncio.ensure_future(io.run(slow))
    while not started.is_set():  # noqa: ASYNC110
        await asyncio.sleep(0.001)
    call.cancel()
    await asyncio.sleep(0.05)
    # Cancelled, but the call still runs: the caller has not been told yet.
    assert not call.done()
    call.cancel()  # a second cancel does not cut the wait short either
    await asyncio.sleep(0.01)
    assert not call.done()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert ended, "the caller heard of the cancellation before the call ended"
    io.close()


def test_callers_on_two_event_loops_each_get_their_own_results() -> None:
    io = IoThread("test")
    out: dict[int, list[int]] = {}

    def loop_in_thread(k: int) -> None:
        async def main() -> list[int]:
            return list(
                await asyncio.gather(*(io.run(lambda i=i: k * 1000 + i) for i in range(200)))
            )

        # Debug mode raises if a result is handed over from another thread than the loop's.
        out[k] = asyncio.run(main(), debug=True)

    threads = [threading.Thread(target=loop_in_thread, args=(k,)) for k in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert out == {k: [k * 1000 + i for i in range(200)] for k in (1, 2)}
    io.close()


async def test_an_idle_thread_ends_and_the_next_call_starts_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_io_thread, "_IDLE", 0.05)
    io = IoThread("idle-test")
    first = await io.run(threading.current_thread)
    first.join(5)
    assert not first.is_alive()
    second = await io.run(threading.current_thread)
    assert second is not first
    assert second.name == "idle-test"
    io.close()


async def test_close_runs_what_was_queued_then_refuses_calls() -> None:
    io = IoThread("test")
    release = threading.Event()
    ran: list[int] = []
    calls = [asyncio.ensure_future(io.run(release.wait, 10))]
    await asyncio.sleep(0.01)
    calls += [asyncio.ensure_future(io.run(ran.append, i)) for i in range(3)]
    await asyncio.sleep(0.01)
    release.set()
    await asyncio.to_thread(io.close)
    await asyncio.gather(*calls)
    assert ran == [0, 1, 2]
    with pytest.raises(RuntimeError, match="closed"):
        await io.run(ran.append, 4)


async def test_a_result_is_handed_back_while_a_later_call_still_runs() -> None:
    # The later call waits for what the caller does with the first result: holding that
    # result back until the later call ends would never end.
    io = IoThread("test")
    answered = threading.Event()
    first_call = asyncio.ensure_future(io.run(lambda: "first"))
    later = asyncio.ensure_future(io.run(answered.wait, 10))
    first = await asyncio.wait_for(first_call, 5)
    assert not later.done()
    answered.set()
    assert first == "first"
    assert await later is True
    io.close()


async def test_a_call_raising_stop_iteration_fails_alone() -> None:
    io = IoThread("test")

    def stop() -> None:
        raise StopIteration

    failing = asyncio.ensure_future(io.run(stop))
    after = asyncio.ensure_future(io.run(lambda: "after"))
    with pytest.raises(RuntimeError, match="StopIteration"):
        await asyncio.wait_for(failing, 5)
    assert await asyncio.wait_for(after, 5) == "after"
    io.close()


async def test_a_thread_that_cannot_start_fails_its_call_and_the_next_call_tries_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    io = IoThread("test")
    start = threading.Thread.start

    def refuse(self: threading.Thread) -> None:
        monkeypatch.setattr(threading.Thread, "start", start)
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        await io.run(lambda: 1)
    assert await asyncio.wait_for(io.run(lambda: 2), 5) == 2
    io.close()


async def test_without_a_flusher_thread_held_results_are_handed_over_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The flusher hands over results held while a call runs long; if its thread can't
    # start, the worker hands them over itself before that call instead of holding them.
    monkeypatch.setattr(_io_thread, "_FLUSHER", _io_thread._Flusher())
    start = threading.Thread.start

    def refuse_the_flusher(self: threading.Thread) -> None:
        if self.name == "aiservices-io-flusher":
            raise RuntimeError("can't start new thread")
        start(self)

    monkeypatch.setattr(threading.Thread, "start", refuse_the_flusher)
    io = IoThread("test")
    answered = threading.Event()
    first_call = asyncio.ensure_future(io.run(lambda: "first"))
    later = asyncio.ensure_future(io.run(answered.wait, 10))
    assert await asyncio.wait_for(first_call, 5) == "first"
    answered.set()
    assert await asyncio.wait_for(later, 5) is True
    monkeypatch.setattr(threading.Thread, "start", start)
    # The next call that holds results back starts the flusher after all.
    answered.clear()
    first_call = asyncio.ensure_future(io.run(lambda: "again"))
    later = asyncio.ensure_future(io.run(answered.wait, 10))
    assert await asyncio.wait_for(first_call, 5) == "again"
    answered.set()
    assert await later is True
    io.close()


# -- through the SQLite store ----------------------------------------------------------


async def test_closing_a_sqlite_store_runs_the_async_calls_already_queued(
    tmp_path: Path,
) -> None:
    store = SqliteChatMemoryStore(tmp_path / "chat.db")
    release = threading.Event()
    holding = asyncio.ensure_future(store._io_thread.run(release.wait, 10))
    await asyncio.sleep(0.01)
    write = asyncio.ensure_future(
        store.aapply_changes("a", appended=[UserMessage("hi", message_id="m1")], removed=[])
    )
    await asyncio.sleep(0.01)
    closing = asyncio.ensure_future(store.aclose())
    await asyncio.sleep(0.01)
    release.set()
    await asyncio.wait_for(asyncio.gather(holding, write, closing), 10)
    with SqliteChatMemoryStore(tmp_path / "chat.db") as again:
        assert again.get_messages("a") == [UserMessage("hi")]


async def test_a_closed_sqlite_store_refuses_async_calls(tmp_path: Path) -> None:
    store = SqliteChatMemoryStore(tmp_path / "chat.db")
    await store.aapply_changes("a", appended=[UserMessage("hi", message_id="m1")], removed=[])
    assert await store.aget_messages("a") == [UserMessage("hi")]
    store.close()
    with pytest.raises(Exception, match="closed"):
        await store.aget_messages("a")


def test_a_forked_child_gets_a_thread_of_its_own(tmp_path: Path) -> None:
    path = str(tmp_path / "chat.db")
    store = SqliteChatMemoryStore(path)
    asyncio.run(
        store.aapply_changes("a", appended=[UserMessage("hi", message_id="m1")], removed=[])
    )
    context = multiprocessing.get_context("fork")
    queue: multiprocessing.Queue[object] = context.Queue()
    # The parent's store object, used in the child after fork.
    child = context.Process(target=_fork_uses, args=(store, queue))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    assert queue.get(timeout=5) == ["hi", "from the child"]
    assert [m.text for m in store.get_messages("a")] == ["hi", "from the child"]
    store.close()


def _fork_uses(store: SqliteChatMemoryStore, queue: multiprocessing.Queue[object]) -> None:
    async def main() -> list[str]:
        await store.aapply_changes(
            "a", appended=[AiMessage("from the child", message_id="m2")], removed=[]
        )
        return [m.text or "" for m in await store.aget_messages("a")]

    queue.put(asyncio.run(main()))

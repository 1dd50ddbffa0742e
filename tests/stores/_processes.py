"""Run one function in several processes at once, as worker processes of an app would."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any


def in_processes(
    count: int,
    target: Callable[..., None],
    opener: Callable[..., Any],
    memory_id: str,
    *more: Any,
    timeout: float = 300,
) -> None:
    """Run ``target(opener, start, memory_id, worker, *more)`` in ``count`` new processes
    (``worker`` numbers them; ``start`` is a barrier they all pass at once) and wait for each
    to end without an error."""
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(count)
    workers = [
        context.Process(target=target, args=(opener, start, memory_id, worker, *more))
        for worker in range(count)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=timeout)
    assert [w.exitcode for w in workers] == [0] * count

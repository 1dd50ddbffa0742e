"""Servers the tests start as processes of their own, on a free port of 127.0.0.1."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def serving(command: Callable[[int], Sequence[str]], *, timeout: float = 30) -> Iterator[int]:
    """Run ``command(port)`` until it listens on the port; yield the port; stop it."""
    port = free_port()
    process = subprocess.Popen(
        list(command(port)), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + timeout
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert process.poll() is None, f"{command(port)[0]} exited"
            assert time.monotonic() < deadline, f"{command(port)[0]} did not start"
            time.sleep(0.05)
        yield port
    finally:
        process.terminate()
        process.wait(10)

"""A scripted HTTP server on 127.0.0.1 for provider wire tests.

Each test queues the replies the server gives, in order, and reads back the requests it got
(method, path, headers, parsed JSON body). Streams go out as chunked ``text/event-stream``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import socket
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# Fake keys: long and distinctive, so a leak into a repr or a message is easy to spot.
OPENAI_KEY = "sk-test-OPENAI-0123456789abcdefSECRET"
ANTHROPIC_KEY = "sk-ant-test-ANTHROPIC-0123456789SECRET"


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    headers: Mapping[str, str]
    body: Any


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: Any = None
    # Each item is one SSE event: (event name or None, JSON-able data or a raw string).
    events: tuple[tuple[str | None, Any], ...] | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    delay: float = 0.0  # seconds to wait before answering
    # Drop the connection after this many SSE events, as a server or proxy failing midway.
    abort_after: int | None = None
    # Send nothing more after this many SSE events, until the server stops: a stalled stream.
    stall_after: int | None = None


class LoopbackServer:
    """Serves queued replies; an unexpected request gets a 599 that names it."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self.violations: list[str] = []  # requests the real API would have refused
        self._replies: deque[Reply] = deque()
        self._lock = threading.Lock()
        self._stopping = threading.Event()  # ends the stalls of stalled streams
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._httpd.daemon_threads = True
        # A short poll keeps shutdown() quick: it waits for the serving loop's next poll.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LoopbackServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> LoopbackServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def break_last_stream(self, after_events: int) -> None:
        """Make the last queued stream drop its connection after ``after_events`` events."""
        with self._lock:
            self._replies[-1] = dataclasses.replace(self._replies[-1], abort_after=after_events)

    def stall_last_stream(self, after_events: int) -> None:
        """Make the last queued stream send nothing more after ``after_events`` events."""
        with self._lock:
            self._replies[-1] = dataclasses.replace(self._replies[-1], stall_after=after_events)

    def queue(self, *replies: Reply) -> None:
        with self._lock:
            self._replies.extend(replies)

    @property
    def pending(self) -> int:
        return len(self._replies)

    @property
    def bodies(self) -> list[Any]:
        return [r.body for r in self.requests]

    @property
    def last(self) -> Recorded:
        return self.requests[-1]

    def check(self, recorded: Recorded) -> str | None:
        """What is wrong with a request, as the real API would refuse it; ``None``: nothing."""
        return None

    def _next(self, recorded: Recorded) -> Reply:
        problem = self.check(recorded)
        if problem is not None:
            self.violations.append(problem)
            return Reply(400, {"error": {"message": problem, "type": "invalid_request_error"}})
        with self._lock:
            self.requests.append(recorded)
            if self._replies:
                return self._replies.popleft()
        return Reply(599, {"error": f"no reply queued for {recorded.method} {recorded.path}"})


def _handler_for(server: LoopbackServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 10

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            recorded = Recorded(
                "POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body
            )
            # The client may give up first (a timeout test, a stream left early).
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self._send(server._next(recorded))

        def _send(self, reply: Reply) -> None:
            if reply.delay:
                time.sleep(reply.delay)
            if reply.events is None:
                payload = json.dumps(reply.body).encode()
                self.send_response(reply.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)
                return
            self.send_response(reply.status)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.send_header("cache-control", "no-cache")
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.end_headers()
            for sent, (event, data) in enumerate(reply.events):
                if sent == reply.abort_after:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if sent == reply.stall_after:
                    self.close_connection = True
                    server._stopping.wait(60)
                    return
                self._chunk(_sse(event, data))
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep test output clean

    return Handler


def _sse(event: str | None, data: Any) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n".encode()

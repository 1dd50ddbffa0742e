"""FastAPI dependencies that scope a conversation to a request, a session or a WebSocket.

```python
from fastapi import FastAPI
from aiservices.fastapi import RequestScope, SessionScope, WebSocketScope

@app.post("/ask")                    # one conversation per request, forgotten after it
async def ask(question: str, scope: RequestScope) -> str:
    return await bot.chat(question)

@app.post("/chat")                   # one per browser session (a cookie), kept
async def chat(message: str, scope: SessionScope) -> str:
    return await bot.chat(message)

@app.post("/chat/stream")            # a Response you return carries the cookie only if
async def stream(message: str, request: Request, scope: SessionScope) -> StreamingResponse:
    return set_session_cookie(StreamingResponse(bot.stream(message)), request)

@app.websocket("/ws")                # one per connection, forgotten when it closes
async def ws(socket: WebSocket, scope: WebSocketScope) -> None: ...
```

Inside the endpoint, calls of methods without a ``MemoryId`` parameter use the scope's
conversation (see ``aiservices.scopes``). Needs the ``fastapi`` extra.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Final, TypeVar

try:
    from fastapi import Depends, Request, Response, WebSocket
    from fastapi.requests import HTTPConnection
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        'aiservices.fastapi needs FastAPI: pip install "aiservices[fastapi]"'
    ) from exc

from .scopes import MemoryScope, memory_scope

__all__ = [
    "SESSION_COOKIE",
    "RequestScope",
    "SessionScope",
    "WebSocketScope",
    "request_scope",
    "session_scope",
    "set_session_cookie",
    "websocket_scope",
]

SESSION_COOKIE: Final = "aiservices_session"
"""The cookie that carries a session scope's conversation id."""


async def request_scope() -> AsyncIterator[MemoryScope]:
    """A conversation for one request, forgotten (memory, store, history) after it."""
    async with memory_scope(on_exit="forget") as scope:
        yield scope


async def session_scope(
    connection: HTTPConnection, response: Response
) -> AsyncIterator[MemoryScope]:
    """A conversation for a browser session, kept; its id travels in a cookie.

    A request without the cookie (or with one that is not an id this dependency made)
    starts a new session and sets the cookie on the response: ``HttpOnly``,
    ``SameSite=Lax``, and ``Secure`` over HTTPS. FastAPI sends it with what the endpoint
    returns, except a ``Response`` object (``StreamingResponse``, ``JSONResponse``...):
    pass that through `set_session_cookie`. A WebSocket whose handshake carries the cookie
    continues the session's conversation; one without it can't be given a cookie, and gets
    a conversation of its own, forgotten when the endpoint ends (as `WebSocketScope`).
    """
    session_id = _session_id(connection.cookies.get(SESSION_COOKIE))
    if session_id is None and connection.scope["type"] == "websocket":
        # No later connection could name the conversation: keeping it would only leak it.
        async with memory_scope(on_exit="forget") as scope:
            yield scope
        return
    if session_id is None:
        session_id = str(uuid.uuid4())
        _set_cookie(response, connection, session_id)
        connection.state.aiservices_new_session = session_id
    async with memory_scope(session_id, on_exit="keep") as scope:
        yield scope


_ResponseT = TypeVar("_ResponseT", bound=Response)


def set_session_cookie(response: _ResponseT, request: Request) -> _ResponseT:
    """``response`` with the cookie of a session `SessionScope` started in this request.

    For an endpoint that returns a ``Response`` object, whose headers FastAPI does not merge
    with those a dependency set; without a new session it is returned as it is.
    """
    session_id = getattr(request.state, "aiservices_new_session", None)
    if session_id is not None:
        _set_cookie(response, request, session_id)
    return response


def _set_cookie(response: Response, connection: HTTPConnection, session_id: str) -> None:
    response.set_cookie(
        SESSION_COOKIE,
        session_id,
        httponly=True,
        samesite="lax",
        secure=connection.url.scheme == "https",
    )


async def websocket_scope(websocket: WebSocket) -> AsyncIterator[MemoryScope]:
    """A conversation for one WebSocket connection, forgotten when the endpoint ends."""
    async with memory_scope(on_exit="forget") as scope:
        yield scope


def _session_id(cookie: str | None) -> str | None:
    # Only ids of the form this dependency makes: a client cannot name a conversation.
    if cookie is None or len(cookie) != 36:
        return None
    try:
        parsed = uuid.UUID(cookie)
    except ValueError:
        return None
    # `UUID(..., version=4)` would set the version bits instead of checking them.
    return cookie if parsed.version == 4 and str(parsed) == cookie else None


RequestScope = Annotated[MemoryScope, Depends(request_scope)]
"""An endpoint parameter: the request's scope."""

SessionScope = Annotated[MemoryScope, Depends(session_scope)]
"""An endpoint parameter: the session's scope, its cookie set when new."""

WebSocketScope = Annotated[MemoryScope, Depends(websocket_scope)]
"""A WebSocket endpoint parameter: the connection's scope."""

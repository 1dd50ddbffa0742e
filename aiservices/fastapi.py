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

@app.websocket("/ws")                # one per connection, forgotten when it closes
async def ws(socket: WebSocket, scope: WebSocketScope) -> None: ...
```

Inside the endpoint, calls of methods without a ``MemoryId`` parameter use the scope's
conversation (see ``aiservices.scopes``). Needs the ``fastapi`` extra.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Final

from fastapi import Depends, Request, Response, WebSocket

from .scopes import MemoryScope, memory_scope

__all__ = [
    "SESSION_COOKIE",
    "RequestScope",
    "SessionScope",
    "WebSocketScope",
    "request_scope",
    "session_scope",
    "websocket_scope",
]

SESSION_COOKIE: Final = "aiservices_session"
"""The cookie that carries a session scope's conversation id."""


async def request_scope() -> AsyncIterator[MemoryScope]:
    """A conversation for one request, forgotten (memory, store, history) after it."""
    async with memory_scope(on_exit="forget") as scope:
        yield scope


async def session_scope(request: Request, response: Response) -> AsyncIterator[MemoryScope]:
    """A conversation for a browser session, kept; its id travels in a cookie.

    A request without the cookie (or with one that is not an id this dependency made)
    starts a new session and sets the cookie on the response: ``HttpOnly``,
    ``SameSite=Lax``, and ``Secure`` over HTTPS.
    """
    session_id = _session_id(request.cookies.get(SESSION_COOKIE))
    if session_id is None:
        session_id = str(uuid.uuid4())
        response.set_cookie(
            SESSION_COOKIE,
            session_id,
            httponly=True,
            samesite="lax",
            secure=request.url.scheme == "https",
        )
    async with memory_scope(session_id, on_exit="keep") as scope:
        yield scope


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

"""A chat web service: FastAPI endpoints, one conversation per session, streaming included.

Endpoints:

- ``POST /chat`` ``{"message": ..., "session_id": null}``: answers; a request without a
  session starts one (the service makes the id) and the reply says which.
- ``POST /chat/stream``: the same, the answer streamed as plain text; the session id is
  in the ``X-Session-Id`` response header.
- ``GET /sessions/{session_id}/messages``: the session's memory, oldest first.
- ``DELETE /sessions/{session_id}``: forget the session, in the store too.

The same, with the conversation chosen by a scope instead of an id in the body
(``aiservices.fastapi``):

- ``POST /session/chat`` ``{"message": ...}``: a browser session's conversation, its id in
  a cookie the first answer sets; kept.
- ``POST /ask`` ``{"message": ...}``: a conversation for this request only, forgotten
  after the answer.
- ``WebSocket /ws``: one conversation per connection, forgotten when it closes.

Where conversations live, chosen by environment variables: ``CHAT_REDIS_URL``
(``redis://...``) for Redis, ``CHAT_POSTGRES_DSN`` (``postgresql://...``) for PostgreSQL
(both shared by every replica of the service), ``CHAT_SQLITE_PATH`` for a SQLite file (one
machine), and otherwise in this process's memory.

Runs offline on a scripted model by default; set OPENAI_API_KEY (or ANTHROPIC_API_KEY) for
a real provider. Needs FastAPI, and httpx for its test client: ``pip install -e
".[fastapi]" httpx`` (the ``dev`` extra has both). ``python examples/fastapi_chat.py`` sends
a few requests through FastAPI's test client and prints them; ``uvicorn fastapi_chat:app
--app-dir examples`` serves it (``pip install uvicorn``).
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from typing import Annotated, Any, Protocol

from pydantic import BaseModel

from aiservices import (
    AsyncTextStream,
    ChatMemoryAccess,
    ChatMemoryStore,
    ChatModel,
    ChatRequest,
    InMemoryChatMemoryStore,
    MemoryId,
    MessageWindowChatMemory,
    Result,
    SqliteChatMemoryStore,
    UserMessage,
    ai_service,
    system_message,
)
from aiservices.testing import ScriptedChatModel

_NEEDS = 'this example needs FastAPI and httpx: pip install -e ".[fastapi]" httpx'
try:
    from fastapi import FastAPI, Request, WebSocket, WebSocketDisconnect
    from fastapi.responses import StreamingResponse

    from aiservices.fastapi import RequestScope, SessionScope, WebSocketScope
except ModuleNotFoundError as missing:
    sys.exit(f"{_NEEDS} ({missing})")


@system_message("You are the help desk of a bicycle shop. Answer in one or two sentences.")
class HelpDesk(ChatMemoryAccess, Protocol):
    # `str | None`: a call with None starts a new conversation with a fresh uuid4 id,
    # reported in Result.memory_id.
    async def chat(self, session: Annotated[str | None, MemoryId], message: str) -> Result[str]: ...

    # A plain def returning AsyncTextStream: iterated with `async for`, nothing to await.
    def stream(self, session: Annotated[str, MemoryId], message: str) -> AsyncTextStream: ...

    # No MemoryId: inside a scope (a request, a session, a socket) the scope's conversation.
    async def ask(self, message: str) -> str: ...


def offline_reply(request: ChatRequest) -> str:
    """The offline stand-in: it shows that each session has its own memory."""
    said = [m.text for m in request.messages if isinstance(m, UserMessage)]
    if len(said) == 1:
        return f"(offline model) Welcome! You said: {said[0]!r}."
    return f"(offline model) Message {len(said)} of this session; the first was {said[0]!r}."


def pick_model() -> ChatModel | str:
    if os.environ.get("OPENAI_API_KEY"):
        return "openai:gpt-4o-mini"
    if os.environ.get("ANTHROPIC_API_KEY"):
        return "anthropic:claude-haiku-4-5"
    return ScriptedChatModel(default=offline_reply, chunk_size=8)


def make_store() -> tuple[ChatMemoryStore, str]:
    if url := os.environ.get("CHAT_REDIS_URL"):
        from aiservices import RedisChatMemoryStore

        return RedisChatMemoryStore(url), "Redis"
    if dsn := os.environ.get("CHAT_POSTGRES_DSN"):
        from aiservices import PostgresChatMemoryStore

        return PostgresChatMemoryStore(dsn), "PostgreSQL"
    if path := os.environ.get("CHAT_SQLITE_PATH"):
        return SqliteChatMemoryStore(path), f"SQLite ({path})"
    return InMemoryChatMemoryStore(), "this process's memory"


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncGenerator[None, None]:
    store, where = make_store()
    app.state.where = where
    app.state.desk = ai_service(
        HelpDesk,
        model=pick_model(),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=30, store=store),
    )
    try:
        yield
    finally:
        if aclose := getattr(store, "aclose", None):
            await aclose()
        elif close := getattr(store, "close", None):
            close()


app = FastAPI(title="Help desk", lifespan=lifespan)


def desk(request: Request) -> HelpDesk:
    service: HelpDesk = request.app.state.desk
    return service


class Question(BaseModel):
    message: str
    session_id: str | None = None


class Answer(BaseModel):
    session_id: str
    answer: str
    total_tokens: int | None = None


@app.post("/chat")
async def chat(question: Question, request: Request) -> Answer:
    result = await desk(request).chat(question.session_id, question.message)
    usage = result.token_usage
    return Answer(
        session_id=str(result.memory_id),
        answer=result.content,
        total_tokens=usage.total_tokens if usage else None,
    )


@app.post("/chat/stream")
async def chat_stream(question: Question, request: Request) -> StreamingResponse:
    session_id = question.session_id or str(uuid.uuid4())
    # The turn is recorded when the stream ends; a client that disconnects midway
    # leaves the session's memory as it was.
    stream = desk(request).stream(session_id, question.message)
    return StreamingResponse(
        stream, media_type="text/plain; charset=utf-8", headers={"X-Session-Id": session_id}
    )


# Plain `def` endpoints run in FastAPI's thread pool: reading or erasing a memory does
# blocking store I/O.
@app.get("/sessions/{session_id}/messages")
def messages(session_id: str, request: Request) -> list[dict[str, Any]]:
    memory = desk(request).get_chat_memory(session_id)
    return [{"type": m.type, "text": m.text} for m in memory.messages()]


@app.delete("/sessions/{session_id}", status_code=204)
def forget(session_id: str, request: Request) -> None:
    desk(request).forget(session_id)


class Message(BaseModel):
    message: str


@app.post("/session/chat")
async def session_chat(body: Message, request: Request, scope: SessionScope) -> Answer:
    return Answer(session_id=str(scope.memory_id), answer=await desk(request).ask(body.message))


@app.post("/ask")
async def ask_once(body: Message, request: Request, scope: RequestScope) -> Answer:
    return Answer(session_id=str(scope.memory_id), answer=await desk(request).ask(body.message))


@app.websocket("/ws")
async def chat_socket(websocket: WebSocket, scope: WebSocketScope) -> None:
    service: HelpDesk = websocket.app.state.desk
    await websocket.accept()
    try:
        while True:
            await websocket.send_text(await service.ask(await websocket.receive_text()))
    except WebSocketDisconnect:
        pass


def main() -> None:
    """A few requests through FastAPI's test client, printed."""
    try:
        from fastapi.testclient import TestClient
    except ModuleNotFoundError as missing:  # the test client runs on httpx
        sys.exit(f"{_NEEDS} ({missing})")

    def show(method: str, path: str, body: object, status: int, reply: object) -> None:
        sent = f" {json.dumps(body)}" if body is not None else ""
        print(f"{method} {path}{sent}\n  -> {status} {json.dumps(reply)}")

    def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = client.post(path, json=body)
        show("POST", path, body, response.status_code, response.json())
        response.raise_for_status()
        reply: dict[str, Any] = response.json()
        return reply

    with TestClient(app) as client:
        print(f"conversations are kept in {app.state.where}")
        alice = post("/chat", {"message": "Hi, I am Alice. My bike has a flat tyre."})
        bob = post("/chat", {"message": "Hello, Bob here. Do you sell helmets?"})
        post("/chat", {"session_id": alice["session_id"], "message": "Can you fix it today?"})

        body = {"session_id": bob["session_id"], "message": "Which size do I need?"}
        with client.stream("POST", "/chat/stream", json=body) as response:
            chunks = list(response.iter_text())
        show("POST", "/chat/stream", body, response.status_code, "".join(chunks))

        path = f"/sessions/{alice['session_id']}/messages"
        response = client.get(path)
        show("GET", path, None, response.status_code, response.json())

        path = f"/sessions/{bob['session_id']}"
        response = client.delete(path)
        print(f"DELETE {path}\n  -> {response.status_code}")
        response = client.get(f"{path}/messages")
        show("GET", f"{path}/messages", None, response.status_code, response.json())

        # Scoped: the session's id travels in a cookie the first answer set.
        post("/session/chat", {"message": "Hi, I am Carol."})
        post("/session/chat", {"message": "Do you rent bikes?"})
        once = post("/ask", {"message": "What are your opening hours?"})
        path = f"/sessions/{once['session_id']}/messages"
        response = client.get(path)  # forgotten after its request
        show("GET", path, None, response.status_code, response.json())
        with client.websocket_connect("/ws") as socket:
            socket.send_text("Hello over a socket")
            print(f"WS /ws 'Hello over a socket'\n  -> {socket.receive_text()!r}")


if __name__ == "__main__":
    main()

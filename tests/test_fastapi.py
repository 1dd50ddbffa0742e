"""FastAPI scopes: a conversation per request, per session (a cookie) and per WebSocket,
through FastAPI's TestClient and through a real uvicorn server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Protocol

import httpx
import pytest
import uvicorn
import websockets.sync.client
from _servers import free_port
from fastapi import FastAPI, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.testclient import TestClient

from aiservices import (
    AiMessage,
    ChatMemoryAccess,
    InMemoryChatMemoryStore,
    MemoryScope,
    MessageWindowChatMemory,
    Result,
    SqliteChatMemoryStore,
    UserMessage,
    ai_service,
    current_memory_scope,
    tool,
)
from aiservices.fastapi import (
    SESSION_COOKIE,
    RequestScope,
    SessionScope,
    WebSocketScope,
    set_session_cookie,
)
from aiservices.models import ChatRequest, ChatResponse
from aiservices.testing import ScriptedChatModel, tool_calls


class Echo:
    """Answers with every user message of the request: what the conversation holds."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay

    def chat(self, request: ChatRequest) -> ChatResponse:
        said = [m.text for m in request.messages if isinstance(m, UserMessage)]
        return ChatResponse(AiMessage(" | ".join(str(t) for t in said)))

    async def achat(self, request: ChatRequest) -> ChatResponse:
        await asyncio.sleep(self.delay)
        return self.chat(request)


class Bot(ChatMemoryAccess, Protocol):
    async def chat(self, text: str) -> str: ...


def _app(path: Path, delay: float = 0.0) -> tuple[FastAPI, SqliteChatMemoryStore]:
    store = SqliteChatMemoryStore(path, keep_history=True)
    bot = ai_service(
        Bot,
        model=Echo(delay),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=50, store=store),
    )
    app = FastAPI()

    @app.post("/ask")
    async def ask(text: str, scope: RequestScope) -> dict[str, Any]:
        first = await bot.chat(text)
        second = await bot.chat("and again")
        return {"scope": scope.memory_id, "answers": [first, second]}

    @app.post("/chat")
    async def chat(text: str, scope: SessionScope) -> dict[str, Any]:
        return {"scope": scope.memory_id, "answer": await bot.chat(text)}

    async def converse(websocket: WebSocket, scope: MemoryScope) -> None:
        await websocket.accept()
        await websocket.send_text(str(scope.memory_id))
        try:
            while True:
                await websocket.send_text(await bot.chat(await websocket.receive_text()))
        except WebSocketDisconnect:
            pass

    @app.websocket("/ws")
    async def ws(websocket: WebSocket, scope: WebSocketScope) -> None:
        await converse(websocket, scope)

    @app.websocket("/session-ws")
    async def session_ws(websocket: WebSocket, scope: SessionScope) -> None:
        await converse(websocket, scope)

    @app.get("/scope")
    async def no_scope() -> dict[str, Any]:
        return {"scope": current_memory_scope()}

    return app, store


def _rows(path: Path) -> int:
    with sqlite3.connect(path) as raw:
        messages = raw.execute("SELECT count(*) FROM chat_messages").fetchone()[0]
        history = raw.execute("SELECT count(*) FROM chat_messages_history").fetchone()[0]
    return int(messages) + int(history)


def test_concurrent_requests_in_request_scope_are_isolated_and_leave_nothing(
    tmp_path: Path,
) -> None:
    app, store = _app(tmp_path / "chat.db", delay=0.05)
    results: dict[int, Any] = {}
    with TestClient(app) as client:
        start = threading.Barrier(2)

        def call(i: int) -> None:
            start.wait()
            results[i] = client.post("/ask", params={"text": f"I am {i}"}).json()

        threads = [threading.Thread(target=call, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert client.get("/scope").json() == {"scope": None}
    for i in range(2):
        # Each request saw only its own messages.
        assert results[i]["answers"] == [f"I am {i}", f"I am {i} | and again"]
    assert results[0]["scope"] != results[1]["scope"]
    assert _rows(tmp_path / "chat.db") == 0  # nothing left, history included
    store.close()


def test_a_session_scope_keeps_the_conversation_across_requests_with_its_cookie(
    tmp_path: Path,
) -> None:
    app, store = _app(tmp_path / "chat.db")
    with TestClient(app) as ada, TestClient(app) as bob:
        first = ada.post("/chat", params={"text": "I am Ada"})
        session = first.cookies[SESSION_COOKIE]
        assert "httponly" in first.headers["set-cookie"].lower()
        second = ada.post("/chat", params={"text": "who am I?"})
        assert SESSION_COOKIE not in second.cookies  # set once, when new
        assert second.json() == {"scope": session, "answer": "I am Ada | who am I?"}
        other = bob.post("/chat", params={"text": "and me?"}).json()
        assert other["scope"] != session
        assert other["answer"] == "and me?"
    assert [m.text for m in store.get_messages(session)][-1] == "I am Ada | who am I?"
    store.close()


def test_an_endpoint_returning_a_response_object_keeps_its_session(tmp_path: Path) -> None:
    # FastAPI does not merge a dependency's headers into a Response the endpoint returns:
    # without set_session_cookie every request started a session of its own.
    class Streams(Protocol):
        def stream(self, text: str) -> AsyncIterator[str]: ...

    store = InMemoryChatMemoryStore()
    bot = ai_service(
        Streams,
        model=Echo(),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=50, store=store),
    )
    app = FastAPI()

    @app.post("/stream")
    async def stream(text: str, request: Request, scope: SessionScope) -> StreamingResponse:
        return set_session_cookie(StreamingResponse(bot.stream(text)), request)

    @app.post("/json")
    async def json(text: str, request: Request, scope: SessionScope) -> JSONResponse:
        return set_session_cookie(JSONResponse({"scope": scope.memory_id}), request)

    with TestClient(app) as browser:
        first = browser.post("/stream", params={"text": "I am Ada"})
        assert SESSION_COOKIE in first.cookies
        assert browser.post("/stream", params={"text": "who am I?"}).text == (
            "I am Ada | who am I?"
        )
        again = browser.post("/json", params={"text": "x"})
        assert SESSION_COOKIE not in again.cookies  # an existing session: left as it is
        assert again.json() == {"scope": first.cookies[SESSION_COOKIE]}
    assert list(store.memory_ids()) == [first.cookies[SESSION_COOKIE]]


def test_a_session_cookie_that_is_not_ours_starts_a_new_session(tmp_path: Path) -> None:
    app, store = _app(tmp_path / "chat.db")
    with TestClient(app) as client:
        client.cookies.set(SESSION_COOKIE, "someone-elses-conversation")
        reply = client.post("/chat", params={"text": "hi"})
        assert reply.json()["scope"] != "someone-elses-conversation"
        assert reply.cookies[SESSION_COOKIE] == reply.json()["scope"]
    store.close()


def test_a_websocket_conversation_is_forgotten_when_the_socket_closes(tmp_path: Path) -> None:
    app, store = _app(tmp_path / "chat.db")
    with TestClient(app) as client, client.websocket_connect("/ws") as socket_:
        memory_id = socket_.receive_text()
        socket_.send_text("I am Ada")
        assert socket_.receive_text() == "I am Ada"
        socket_.send_text("who am I?")
        assert socket_.receive_text() == "I am Ada | who am I?"
        assert len(store.get_messages(memory_id)) == 4
    _wait_for(lambda: _rows(tmp_path / "chat.db") == 0)
    store.close()


def test_a_websocket_with_the_session_cookie_continues_the_sessions_conversation(
    tmp_path: Path,
) -> None:
    app, store = _app(tmp_path / "chat.db")
    with TestClient(app) as browser:
        session = browser.post("/chat", params={"text": "I am Ada"}).cookies[SESSION_COOKIE]
        with browser.websocket_connect("/session-ws") as socket_:
            assert socket_.receive_text() == session
            socket_.send_text("who am I?")
            assert socket_.receive_text() == "I am Ada | who am I?"
        # Kept after the socket closes: the next request goes on with it.
        answer = browser.post("/chat", params={"text": "and now?"}).json()
        assert answer == {"scope": session, "answer": "I am Ada | who am I? | and now?"}

        # Without the cookie no response could carry one: a conversation of its own,
        # forgotten when the socket closes.
        browser.cookies.clear()
        with browser.websocket_connect("/session-ws") as socket_:
            memory_id = socket_.receive_text()
            assert memory_id != session
            socket_.send_text("hi")
            assert socket_.receive_text() == "hi"
        _wait_for(lambda: store.get_messages(memory_id) == [])
    assert len(store.get_messages(session)) == 6
    store.close()


def _wait_for(condition: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


# -- a real server ----------------------------------------------------------------------


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    app, store = _app(tmp_path / "chat.db", delay=0.05)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    _wait_for(lambda: server.started)
    try:
        yield f"127.0.0.1:{port}", tmp_path / "chat.db"
    finally:
        server.should_exit = True
        thread.join(10)
        store.close()


def test_a_real_server_isolates_requests_keeps_sessions_and_forgets_sockets(
    served: tuple[str, Path],
) -> None:
    address, path = served

    async def requests() -> list[Any]:
        async with httpx.AsyncClient(base_url=f"http://{address}") as client:
            replies = await asyncio.gather(
                *(client.post("/ask", params={"text": f"I am {i}"}) for i in range(8))
            )
        return [reply.json() for reply in replies]

    for i, reply in enumerate(asyncio.run(requests())):
        assert reply["answers"] == [f"I am {i}", f"I am {i} | and again"]
    # Forgotten after each response was sent: soon, not necessarily before the client reads.
    _wait_for(lambda: _rows(path) == 0)

    with httpx.Client(base_url=f"http://{address}") as ada:
        ada.post("/chat", params={"text": "I am Ada"})
        reply = ada.post("/chat", params={"text": "who am I?"}).json()
    assert reply["answer"] == "I am Ada | who am I?"

    with websockets.sync.client.connect(f"ws://{address}/ws") as connection:
        memory_id = connection.recv()
        connection.send("hello")
        assert connection.recv() == "hello"
        assert _rows(path) > 0
    # The session's conversation stays; the socket's goes when it closes.
    _wait_for(lambda: _count(path, memory_id) == 0)
    assert _rows(path) == 4


def _count(path: Path, memory_id: Any) -> int:
    # Window and history: forgetting empties the window first, then the history.
    with sqlite3.connect(path) as raw:
        found = sum(
            raw.execute(
                f"SELECT count(*) FROM {table} WHERE memory_key = ?", (str(memory_id),)
            ).fetchone()[0]
            for table in ("chat_messages", "chat_messages_history")
        )
    return int(found)


def test_only_session_ids_of_the_form_the_dependency_makes_are_accepted() -> None:
    from aiservices.fastapi import _session_id

    made = "3f1e2d4c-5b6a-4789-8abc-0123456789ab"
    assert _session_id(made) == made
    assert _session_id("00000000-0000-0000-0000-000000000000") is None  # not version 4
    assert _session_id(made.upper()) is None  # not as made
    assert _session_id("3f1e2d4c5b6a47898abc0123456789ab") is None
    assert _session_id(None) is None


class Place:
    """A value with no JSON form, as a tool may return."""

    def __str__(self) -> str:
        return "Lisbon, Portugal"


class Answers(Protocol):
    async def ask(self, question: str) -> Result[int]: ...


def test_an_endpoint_may_return_a_result_with_its_tool_executions() -> None:
    @tool
    def locate(city: str) -> Place:
        """Where a city is."""
        return Place()

    @tool
    def fail(why: str) -> str:
        """Always fails."""
        raise RuntimeError(why)

    model = ScriptedChatModel(
        tool_calls(("locate", {"city": "Lisbon"}), ("fail", {"why": "no reason"})), "42"
    )
    bot = ai_service(Answers, model=model, tools=[locate, fail])
    app = FastAPI()

    @app.get("/ask")
    async def ask(question: str) -> Result[int]:
        return await bot.ask(question)

    with TestClient(app) as client:
        body = client.get("/ask", params={"question": "how many?"}).json()
        schema = client.get("/openapi.json").json()
    assert body["content"] == 42
    located, failed = body["tool_executions"]
    assert located["request"]["name"] == "locate"
    assert located["value"] == "Lisbon, Portugal"
    assert located["error"] is None
    assert failed["value"] is None
    assert "no reason" in failed["error"]
    assert failed["error"] == failed["result"]  # the text the model was shown
    assert body["ai_message"]["text"] == "42"
    properties = next(
        component["properties"]
        for name, component in schema["components"]["schemas"].items()
        if name.startswith("Result")
    )
    assert properties["content"]["type"] == "integer"
    assert {"tool_executions", "token_usage", "memory_id", "sources"} <= set(properties)

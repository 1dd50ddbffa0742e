"""History beside memory, through a service, on every persistent store; forgetting; retention.

Memory is what the model is shown, history what was said: a store with ``keep_history=True``
marks evicted messages instead of deleting them, and ``get_history`` returns them all.
"""

from __future__ import annotations

import logging
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Protocol

import pytest
from stores.conftest import BACKENDS, OpenedBackend, _opened

from aiservices import (
    ChatMemoryAccess,
    MemoryId,
    MessageWindowChatMemory,
    TokenWindowChatMemory,
    ai_service,
    system_message,
    tool,
)
from aiservices.memory import ChatMemoryProvider, SummarizingChatMemory, sent_on_turn
from aiservices.memory.summarizing import is_summary
from aiservices.messages import (
    AiMessage,
    ChatMessage,
    SystemMessage,
    ToolExecutionResultMessage,
    UserMessage,
)
from aiservices.models import ChatRequest
from aiservices.stores import HistoryEntry, InMemoryChatMemoryStore, SqliteChatMemoryStore
from aiservices.stores import in_memory as in_memory_module
from aiservices.stores._base import store_key
from aiservices.testing import ScriptedChatModel, tool_call

PERSISTENT = [name for name, spec in BACKENDS.items() if spec.persistent and spec.history]


@pytest.fixture(params=PERSISTENT)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OpenedBackend]:
    with _opened(request.param, tmp_path) as opened:
        yield opened


class Chat(ChatMemoryAccess, Protocol):
    def chat(self, user: Annotated[str, MemoryId], message: str) -> str: ...


def echo(request: ChatRequest) -> str:
    return "a" + request.messages[-1].text[1:]  # type: ignore[union-attr]


def texts(messages: list[ChatMessage]) -> list[str | None]:
    return [getattr(m, "text", None) for m in messages]


# -- 50 turns through a window of 10 ---------------------------------------------------------


def test_fifty_turns_keep_ten_in_memory_and_a_hundred_in_history(backend: OpenedBackend) -> None:
    store = backend.open(keep_history=True)
    model = ScriptedChatModel(default=echo)
    bot = ai_service(
        Chat, model=model, chat_memory_provider=MessageWindowChatMemory.provider(10, store=store)
    )
    for i in range(50):
        assert bot.chat("ann", f"q{i}") == f"a{i}"

    said = [t for i in range(50) for t in (f"q{i}", f"a{i}")]
    assert texts(bot.get_chat_memory("ann").messages()) == said[-10:]

    history = store.get_history("ann")
    assert texts([e.message for e in history]) == said
    assert [e.evicted for e in history] == [True] * 90 + [False] * 10
    # Another store object on the same data reads the same history.
    assert backend.open().get_history("ann") == history

    # Every recorded message keeps its message id, turn id and timestamp: the very ones
    # the model was sent.
    sent = {m.message_id: m for r in model.requests for m in r.messages}
    for entry in history[:-1]:
        original = sent[entry.message.message_id]
        assert entry.message.model_dump() == original.model_dump()
    turns = [history[i : i + 2] for i in range(0, 100, 2)]
    assert len({e.message.message_id for e in history}) == 100
    assert len({q.message.turn_id for q, _ in turns}) == 50
    for q, a in turns:
        assert q.message.turn_id == a.message.turn_id is not None
        assert q.message.created_at is not None
        assert a.message.created_at is not None
        assert q.message.created_at <= a.message.created_at
    # Correct eviction marks: turn k left the window at turn k + 5's write, after that
    # turn's answer and before the next turn began.
    for k in range(45):
        for entry in turns[k]:
            assert entry.evicted_at is not None
            assert turns[k + 5][1].message.created_at <= entry.evicted_at  # type: ignore[operator]
            if k + 6 < 50:
                assert entry.evicted_at <= turns[k + 6][0].message.created_at  # type: ignore[operator]


def test_whole_turns_leave_the_window_together(backend: OpenedBackend) -> None:
    @tool
    def lookup(order: str) -> str:
        """Where an order is."""
        return f"{order} shipped"

    def reply(request: ChatRequest) -> str | AiMessage:
        last = request.messages[-1]
        if isinstance(last, ToolExecutionResultMessage):
            return last.text
        return tool_call("lookup", order=last.text)  # type: ignore[union-attr]

    store = backend.open(keep_history=True)
    bot = ai_service(
        Chat,
        model=ScriptedChatModel(default=reply),
        tools=[lookup],
        chat_memory_provider=MessageWindowChatMemory.provider(
            5, store=store, evict_whole_turns=True
        ),
    )
    for i in range(8):
        bot.chat("t", f"o{i}")
        assert isinstance(bot.get_chat_memory("t").messages()[0], UserMessage)
    history = store.get_history("t")
    assert len(history) == 32
    turns = [history[i : i + 4] for i in range(0, 32, 4)]
    assert all(len({e.message.turn_id for e in t}) == 1 for t in turns)
    # Each turn left whole, at the next turn's write (a window of 5 holds one 4-message
    # turn): after that turn's answer, before the turn after it began.
    assert [[e.evicted for e in t] for t in turns] == [[True] * 4] * 7 + [[False] * 4]
    for k in range(6):
        for entry in turns[k]:
            assert turns[k + 1][-1].message.created_at <= entry.evicted_at  # type: ignore[operator]
            assert entry.evicted_at <= turns[k + 2][0].message.created_at  # type: ignore[operator]


# -- what the model was sent on turn N ---------------------------------------------------------


class Agent(ChatMemoryAccess, Protocol):
    @system_message("You are {{tone}}.")
    def chat(self, user: Annotated[str, MemoryId], message: str, tone: str) -> str: ...


@tool
def weather(city: str) -> str:
    """Today's weather in a city."""
    return f"sunny in {city}"


def agent_reply(request: ChatRequest) -> str | AiMessage:
    last = request.messages[-1]
    if isinstance(last, ToolExecutionResultMessage):
        return f"it is {last.text}"
    text = last.text  # type: ignore[union-attr]
    if "weather" in text:
        return tool_call("weather", city=text.split()[-1])
    return "a" + text[1:]


def summarizer_reply(request: ChatRequest) -> str:
    return f"summary of {len(request.messages[-1].text)} characters"  # type: ignore[union-attr]


Memories = Callable[[Any], ChatMemoryProvider]

MEMORIES: dict[str, Memories] = {
    "message window": lambda store: MessageWindowChatMemory.provider(6, store=store),
    "system first": lambda store: MessageWindowChatMemory.provider(
        7, store=store, always_keep_system_message_first=True
    ),
    "token window, whole turns": lambda store: TokenWindowChatMemory.provider(
        40, Words(), store=store, evict_whole_turns=True
    ),
    "summarising": lambda store: SummarizingChatMemory.provider(
        max_messages=8, summarizer=ScriptedChatModel(default=summarizer_reply), store=store
    ),
}


class Words:
    def estimate_token_count_in_text(self, text: str) -> int:
        return len(text.split())

    def estimate_token_count_in_message(self, message: ChatMessage) -> int:
        text = getattr(message, "text", None) or ""
        return len(text.split()) + 1


@pytest.mark.parametrize("kind", list(MEMORIES))
def test_what_the_model_was_sent_on_each_turn_is_rebuilt_from_history(
    backend: OpenedBackend, kind: str
) -> None:
    memories = MEMORIES[kind]
    store = backend.open(keep_history=True)
    model = ScriptedChatModel(default=agent_reply)
    bot = ai_service(Agent, model=model, tools=[weather], chat_memory_provider=memories(store))
    for i in range(16):
        tone = "terse" if i < 9 else "kind"  # the system message changes at turn 9
        message = f"q{i} weather in Paris" if i % 4 == 1 else f"q{i}"
        bot.chat("w", message, tone=tone)
    if kind == "summarising":
        assert any(is_summary(m) for m in bot.get_chat_memory("w").messages())

    history = store.get_history("w")
    last_request: dict[str, ChatRequest] = {}
    for request in model.requests:
        users = [m for m in request.messages if isinstance(m, UserMessage) and m.turn_id]
        last_request[users[-1].turn_id] = request  # type: ignore[index]
    assert len(last_request) == 16
    for turn_id, request in last_request.items():
        rebuilt = sent_on_turn(history, turn_id)
        assert [m.message_id for m in rebuilt] == [m.message_id for m in request.messages], (
            kind,
            turn_id,
        )


def test_sent_on_turn_explains_what_it_cannot_answer() -> None:
    entry = HistoryEntry(UserMessage("hi", turn_id="t1"))
    with pytest.raises(LookupError, match="no message of turn 't2'"):
        sent_on_turn([entry], "t2")
    with pytest.raises(ValueError, match="carry no created_at"):
        sent_on_turn([entry], "t1")


def test_sent_on_turn_tells_an_early_eviction_from_a_late_one_by_the_turns_middle() -> None:
    t0 = datetime(2025, 1, 1, tzinfo=UTC)
    old = UserMessage("old", turn_id="t0", created_at=t0)
    before = UserMessage("before", turn_id="t0", created_at=t0)
    ask = UserMessage("ask", turn_id="t1", created_at=t0 + timedelta(seconds=10))
    answer = AiMessage("answer", turn_id="t1", created_at=t0 + timedelta(seconds=12))
    history = [
        # Left at the previous turn's write, by a store clock 0.9 s ahead of ours.
        HistoryEntry(old, t0 + timedelta(seconds=10.9)),
        # Left at this turn's write, by a store clock 0.9 s behind ours.
        HistoryEntry(before, t0 + timedelta(seconds=11.1)),
        HistoryEntry(ask),
        HistoryEntry(answer),
    ]
    assert sent_on_turn(history, "t1") == [before, ask]


# -- forget --------------------------------------------------------------------------------


def raw_contents(backend: OpenedBackend, store: Any) -> str:
    """Everything the backend holds for this test, as text, read with its own client."""
    if backend.name == "sqlite":
        conn = sqlite3.connect(store.path)
        try:
            tables = [
                name
                for (name,) in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'table'")
            ]
            rows = [repr(row) for t in tables for row in conn.execute(f"SELECT * FROM {t}")]
        finally:
            conn.close()
        return "\n".join(rows)
    if backend.name == "redis":
        import redis
        from stores._server_backends import REDIS_URL

        client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
        try:
            parts: list[str] = []
            for key in client.scan_iter(match=f"{store.key_prefix}*", count=1000):
                kind = client.type(key)
                value: object
                if kind == "stream":
                    value = client.xrange(key)
                elif kind == "hash":
                    value = client.hgetall(key)
                elif kind == "string":
                    value = client.get(key)
                elif kind == "list":
                    value = client.lrange(key, 0, -1)
                elif kind == "set":
                    value = client.smembers(key)
                else:
                    value = client.zrange(key, 0, -1, withscores=True)
                parts.append(f"{key} {kind} {value!r}")
        finally:
            client.close()
        return "\n".join(parts)
    if backend.name == "postgres":
        import psycopg
        from psycopg import sql
        from stores._server_backends import POSTGRES_DSN

        with psycopg.connect(POSTGRES_DSN) as conn:
            tables = [
                name
                for (name,) in conn.execute(
                    "SELECT table_name FROM information_schema.tables "
                    "WHERE table_schema = current_schema() AND table_name LIKE %s",
                    (f"{store.table}%",),
                )
            ]
            rows = [
                text
                for t in tables
                for (text,) in conn.execute(
                    sql.SQL("SELECT t::text FROM {} AS t").format(sql.Identifier(t))
                )
            ]
        return "\n".join(rows)
    pytest.fail(f"no raw inspection for the {backend.name!r} store: add one to raw_contents")


def test_forget_leaves_nothing_behind(backend: OpenedBackend) -> None:
    store = backend.open(keep_history=True)
    bot = ai_service(
        Chat,
        model=ScriptedChatModel(default=lambda r: f"noted {r.messages[-1].text}"),  # type: ignore[union-attr]
        chat_memory_provider=SummarizingChatMemory.provider(
            max_messages=4, summarizer=ScriptedChatModel(default="a summary"), store=store
        ),
    )
    gone, kept = f"gone-{uuid.uuid4().hex}", f"kept-{uuid.uuid4().hex}"
    for i in range(5):
        bot.chat(gone, f"{gone} says {i}")
        bot.chat(kept, f"{kept} says {i}")
    before = raw_contents(backend, store)
    assert gone in before
    assert kept in before
    assert any(e.evicted for e in store.get_history(gone))

    bot.forget(gone)

    after = raw_contents(backend, store)
    assert gone not in after
    assert store_key(gone) not in after
    assert kept in after  # the other conversation is untouched
    assert store.get_history(gone) == []
    assert store.get_messages(gone) == []
    kept_history = [e.message for e in store.get_history(kept)]
    assert len([m for m in kept_history if not is_summary(m)]) == 10
    assert any(is_summary(m) for m in kept_history)
    # The service forgot its cached memory too: the conversation starts afresh.
    bot.chat(gone, "hello again")
    assert texts(bot.get_chat_memory(gone).messages()) == ["hello again", "noted hello again"]


# -- retention --------------------------------------------------------------------------------


def age(path: Path, memory_id: str, by: timedelta) -> None:
    """Make a conversation's rows in a SQLite store look ``by`` older."""
    with sqlite3.connect(path) as conn:
        conn.execute(
            "UPDATE chat_messages SET stored_at = stored_at - ? WHERE memory_key = ?",
            (by.total_seconds(), memory_id),
        )
        for seq, evicted_at in conn.execute(
            "SELECT seq, evicted_at FROM chat_messages_history WHERE memory_key = ?", (memory_id,)
        ).fetchall():
            older = datetime.fromisoformat(evicted_at) - by
            conn.execute(
                "UPDATE chat_messages_history SET evicted_at = ? WHERE memory_key = ? AND seq = ?",
                (older.isoformat(timespec="microseconds"), memory_id, seq),
            )


def keys_in(path: Path) -> set[str]:
    with sqlite3.connect(path) as conn:
        return {
            key
            for (key,) in conn.execute(
                "SELECT memory_key FROM chat_messages UNION SELECT memory_key "
                "FROM chat_messages_history"
            )
        }


def fill(store: Any, memory_id: str, turns: int = 3) -> None:
    memory = MessageWindowChatMemory(2, id=memory_id, store=store)
    for i in range(turns):
        memory.add(UserMessage(f"{memory_id} q{i}"), AiMessage(f"{memory_id} a{i}"))


def test_sqlite_purge_idle_deletes_conversations_idle_for_longer(tmp_path: Path) -> None:
    path = tmp_path / "chat.db"
    with SqliteChatMemoryStore(path, keep_history=True) as store:
        for name in ("idle", "active", "evicted-lately", "history-only"):
            fill(store, name)
        store.delete_messages("history-only")  # its window goes to history
        day = timedelta(days=1)
        age(path, "idle", day)
        age(path, "history-only", day)
        # Its window rows are old, but a message left the window a moment ago.
        with sqlite3.connect(path) as conn:
            conn.execute(
                "UPDATE chat_messages SET stored_at = stored_at - 86400 "
                "WHERE memory_key = 'evicted-lately'"
            )
        assert store.purge_idle(timedelta(hours=1)) == 2
        assert keys_in(path) == {"active", "evicted-lately"}
        assert store.get_history("idle") == []
        assert len(store.get_history("evicted-lately")) == 6
        assert store.purge_idle(timedelta(hours=1)) == 0
        assert store.purge_idle(timedelta(0)) == 2
        assert keys_in(path) == set()


def test_sqlite_retention_purges_at_open_and_from_writes(tmp_path: Path) -> None:
    path = tmp_path / "chat.db"
    with SqliteChatMemoryStore(path, keep_history=True) as plain:
        fill(plain, "old")
        fill(plain, "older")
    age(path, "old", timedelta(hours=2))
    with SqliteChatMemoryStore(path, retention=timedelta(hours=1)) as store:
        assert keys_in(path) == {"older"}  # purged when the store opened
        assert "retention=datetime.timedelta(seconds=3600)" in repr(store)
    with SqliteChatMemoryStore(path, retention=timedelta(seconds=1)) as store:
        fill(store, "fresh", turns=1)
        age(path, "older", timedelta(hours=2))
        fill(store, "fresh", turns=1)  # within a tenth of the period: no purge yet
        assert "older" in keys_in(path)
        time.sleep(0.15)
        fill(store, "fresh", turns=1)
        assert keys_in(path) == {"fresh"}


def test_a_failed_purge_leaves_the_write_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with SqliteChatMemoryStore(tmp_path / "chat.db", retention=timedelta(seconds=1)) as store:

        def locked(older_than: timedelta) -> int:
            raise sqlite3.OperationalError("database is locked")

        monkeypatch.setattr(store, "purge_idle", locked)
        time.sleep(0.15)
        with caplog.at_level(logging.WARNING, logger="aiservices.stores"):
            store.update_messages("x", [UserMessage("kept")])
        assert texts(store.get_messages("x")) == ["kept"]
        assert "purging idle conversations failed: database is locked" in caplog.text


def test_in_memory_purge_idle_and_retention(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(in_memory_module, "_monotonic", lambda: now[0])
    store = InMemoryChatMemoryStore(retention=timedelta(minutes=10))
    assert repr(store) == "InMemoryChatMemoryStore(retention=datetime.timedelta(seconds=600))"
    fill(store, "a")
    now[0] += 300
    fill(store, "b")
    assert store.purge_idle(timedelta(minutes=4)) == 1
    assert store.get_messages("a") == []
    assert store.get_messages("b") != []
    # Retention: b idles past 10 minutes. Writes to a conversation already there do not
    # grow the store and purge nothing; the next one to start a conversation purges.
    fill(store, "c")
    now[0] += 601
    fill(store, "c")
    assert store.get_messages("b") != []
    fill(store, "d")
    assert store.get_messages("b") == []
    assert store.get_messages("c") != []
    assert InMemoryChatMemoryStore().purge_idle(timedelta(0)) == 0


@pytest.mark.parametrize(
    ("retention", "error"),
    [(timedelta(0), ValueError), (timedelta(seconds=-1), ValueError), (3600, TypeError)],
)
def test_retention_must_be_a_positive_timedelta(
    tmp_path: Path, retention: Any, error: type[Exception]
) -> None:
    with pytest.raises(error, match="retention"):
        InMemoryChatMemoryStore(retention=retention)
    with pytest.raises(error, match="retention"):
        SqliteChatMemoryStore(tmp_path / "chat.db", retention=retention)


@pytest.mark.parametrize("older_than", [timedelta(seconds=-1), 60])
def test_purge_idle_takes_a_period(tmp_path: Path, older_than: Any) -> None:
    error = TypeError if isinstance(older_than, int) else ValueError
    with pytest.raises(error, match="older_than"):
        InMemoryChatMemoryStore().purge_idle(older_than)
    with SqliteChatMemoryStore(tmp_path / "chat.db") as store, pytest.raises(error):
        store.purge_idle(older_than)


def test_a_recorded_system_message_is_part_of_the_turn_that_brought_it() -> None:
    store = InMemoryChatMemoryStore()
    bot = ai_service(
        Agent,
        model=ScriptedChatModel(default=agent_reply),
        chat_memory_provider=MessageWindowChatMemory.provider(10, store=store),
    )
    bot.chat("s", "q0", tone="terse")
    system, user, ai = store.get_messages("s")
    assert isinstance(system, SystemMessage)
    assert system.turn_id == user.turn_id == ai.turn_id
    assert isinstance(ai, AiMessage)

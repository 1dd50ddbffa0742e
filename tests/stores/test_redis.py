"""RedisChatMemoryStore beyond the contract: keys, what a write sends, TTL, async, clients."""

from __future__ import annotations

import asyncio
import base64
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Annotated, Any, Protocol

import pytest
import redis
import redis.asyncio

from aiservices import ChatMemoryAccess, MemoryId, MessageWindowChatMemory, ai_service
from aiservices.messages import AiMessage, ChatMessage, new_message_id
from aiservices.models import ChatRequest
from aiservices.stores import (
    AsyncChatMemoryStore,
    ChatHistoryStore,
    CorruptMessageError,
    IncrementalChatMemoryStore,
    store_key,
)
from aiservices.stores.redis import RedisChatMemoryStore
from aiservices.testing import ScriptedChatModel

from ._messages import texts, user
from ._server_backends import drop_redis_keys, require_redis


@pytest.fixture
def url() -> str:
    return require_redis()


@pytest.fixture
def prefix(url: str) -> Iterator[str]:
    prefix = f"test:{uuid.uuid4().hex}:"
    yield prefix
    drop_redis_keys(url, prefix)


@pytest.fixture
def client(url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(url)
    yield client
    client.close()


@pytest.fixture
def store(url: str, prefix: str) -> Iterator[RedisChatMemoryStore]:
    with RedisChatMemoryStore(url, key_prefix=prefix) as store:
        yield store


def test_it_is_an_incremental_async_history_store(store: RedisChatMemoryStore) -> None:
    assert isinstance(store, IncrementalChatMemoryStore)
    assert isinstance(store, ChatHistoryStore)
    assert isinstance(store, AsyncChatMemoryStore)
    # Its sync methods do network I/O: async calls must not run them on the event loop.
    assert getattr(store, "is_blocking", True) is not False


def test_repr_hides_the_password(prefix: str) -> None:
    with RedisChatMemoryStore("redis://app:s3cret@127.0.0.1:6379/0", key_prefix=prefix) as s:
        assert "s3cret" not in repr(s)
        assert "127.0.0.1:6379/0" in repr(s)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"url_or_client": 42}, TypeError, "redis:// URL or a redis.Redis client"),
        ({"key_prefix": b"x"}, TypeError, "key_prefix must be a str"),
        ({"ttl": 0}, ValueError, "ttl must be at least 1 ms"),
        ({"ttl": timedelta(0)}, ValueError, "ttl must be at least 1 ms"),
        ({"ttl": "60"}, TypeError, "ttl must be seconds or a timedelta"),
        ({"ttl": float("nan")}, ValueError, "ttl must be a finite number of seconds, got nan"),
        ({"ttl": float("inf")}, ValueError, "ttl must be a finite number of seconds, got inf"),
    ],
)
def test_bad_arguments_are_clear_errors(
    url: str, kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    options: dict[str, Any] = {"url_or_client": url, **kwargs}
    with pytest.raises(error, match=message):
        RedisChatMemoryStore(**options)


def test_an_async_client_alone_is_refused(url: str) -> None:
    async_client = redis.asyncio.Redis.from_url(url)
    with pytest.raises(TypeError, match="as async_client="):
        RedisChatMemoryStore(async_client)  # type: ignore[arg-type]


# -- keys ---------------------------------------------------------------------------------------

TRICKY_IDS: list[Any] = ["a", "a*", "*", "?", "[ab]", "{x}", "}", "a:b", "a b", "", "ключ", 1]


def test_keys_encode_the_memory_id_under_one_hash_tag(store: RedisChatMemoryStore) -> None:
    for memory_id in TRICKY_IDS:
        tag = base64.urlsafe_b64encode(store_key(memory_id).encode()).rstrip(b"=").decode()
        keys = store.keys(memory_id)
        assert keys == tuple(f"{store.key_prefix}{{{tag or '='}}}:{k}" for k in "wsxnht")


def test_a_pattern_for_one_conversation_matches_no_other(
    store: RedisChatMemoryStore, client: redis.Redis
) -> None:
    for n, memory_id in enumerate(TRICKY_IDS):
        store.update_messages(memory_id, [user(f"m{n}")])
        store.apply_changes(memory_id, appended=[user(f"n{n}")], removed=[])
    for n, memory_id in enumerate(TRICKY_IDS):
        w, s, x, n_key, *_ = store.keys(memory_id)
        pattern = w[:-1] + "*"  # everything of this conversation
        found = {k.decode() for k in client.scan_iter(match=pattern, count=1000)}
        assert found == {w, s, x, n_key}, memory_id
        assert texts(store.get_messages(memory_id)) == [f"m{n}", f"n{n}"]


def test_stores_with_different_prefixes_are_independent(url: str, prefix: str) -> None:
    with (
        RedisChatMemoryStore(url, key_prefix=prefix + "one:") as one,
        RedisChatMemoryStore(url, key_prefix=prefix + "two:") as two,
    ):
        one.update_messages("a", [user("in one")])
        two.update_messages("a", [user("in two")])
        assert texts(one.get_messages("a")) == ["in one"]
        assert texts(two.get_messages("a")) == ["in two"]


# -- what a write sends ---------------------------------------------------------------------------


class Monitor:
    """The commands the server runs on keys under a prefix, scripts' own commands included."""

    def __init__(self, url: str, prefix: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.prefix = prefix
        self.commands: list[list[str]] = []
        self._ready = threading.Event()
        self._stop = f"stop-{uuid.uuid4().hex}"
        self._thread = threading.Thread(target=self._listen)

    def _listen(self) -> None:
        with self.client.monitor() as monitor:
            self._ready.set()
            for event in monitor.listen():
                command = event["command"]
                if self._stop in command:
                    return
                if self.prefix in command and event.get("client_type") == "lua":
                    self.commands.append(command.split())

    def __enter__(self) -> Monitor:
        self._thread.start()
        self._ready.wait(5)
        time.sleep(0.05)  # MONITOR is on once the server has answered it
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.client.echo(self._stop)
        self._thread.join(5)
        self.client.close()

    def names(self) -> list[str]:
        return [c[0].upper() for c in self.commands]


def test_a_turn_appends_and_trims_the_front_whatever_the_window(
    url: str, store: RedisChatMemoryStore
) -> None:
    window = [user(str(i)) for i in range(1000)]
    store.update_messages("c", window)
    new = [user("q"), AiMessage("a", message_id=new_message_id())]
    with Monitor(url, store.key_prefix) as monitor:
        store.apply_changes("c", appended=new, removed=[window[0].message_id, window[1].message_id])
    names = monitor.names()
    assert names.count("RPUSH") == 4  # two messages, two sequence numbers
    assert names.count("LPOP") == 4  # the two oldest, from both lists
    assert not {"LRANGE", "DEL", "LREM", "LSET"} & set(names)  # nothing read or rewritten
    assert texts(store.get_messages("c")) == [*texts(window[2:]), "q", "a"]


def test_update_messages_writes_the_difference(url: str, store: RedisChatMemoryStore) -> None:
    window: list[ChatMessage] = [user(str(i)) for i in range(500)]
    store.update_messages("c", window)
    window = [*window[3:], user("new 1"), user("new 2")]
    with Monitor(url, store.key_prefix) as monitor:
        store.update_messages("c", window)
    names = monitor.names()
    assert names.count("LPOP") == 6
    assert names.count("RPUSH") == 4
    assert "DEL" not in names
    assert texts(store.get_messages("c")) == texts(window)


def test_a_message_is_removed_from_anywhere(store: RedisChatMemoryStore) -> None:
    window = [user(str(i)) for i in range(6)]
    store.update_messages("c", window)
    store.apply_changes("c", appended=[], removed=[window[3].message_id, window[5].message_id])
    assert texts(store.get_messages("c")) == ["0", "1", "2", "4"]
    store.apply_changes("c", appended=[user("6")], removed=[window[0].message_id])
    assert texts(store.get_messages("c")) == ["1", "2", "4", "6"]


def test_an_emptied_conversation_leaves_no_key(
    store: RedisChatMemoryStore, client: redis.Redis
) -> None:
    a, b = user("a"), user("b")
    store.apply_changes("c", appended=[a, b], removed=[])
    store.apply_changes("c", appended=[], removed=[a.message_id, b.message_id])
    assert client.exists(*store.keys("c")) == 0
    store.update_messages("d", [a])
    store.delete_messages("d")
    assert client.exists(*store.keys("d")) == 0


# -- TTL ----------------------------------------------------------------------------------------


def test_ttl_is_set_and_refreshed_on_every_write(
    url: str, prefix: str, client: redis.Redis
) -> None:
    with RedisChatMemoryStore(url, key_prefix=prefix, ttl=timedelta(seconds=2)) as store:
        assert store.ttl == 2.0
        first = user("a")
        store.apply_changes("c", appended=[first], removed=[])
        w, s, x, n, *_ = store.keys("c")
        assert all(0 < client.pttl(k) <= 2000 for k in (w, s, x, n))
        time.sleep(0.6)
        assert client.pttl(w) <= 1500
        store.apply_changes("c", appended=[user("b")], removed=[first.message_id])
        assert all(client.pttl(k) > 1500 for k in (w, s, x, n))


def test_a_conversation_expires_ttl_after_its_last_write(url: str, prefix: str) -> None:
    with RedisChatMemoryStore(url, key_prefix=prefix, ttl=0.3, keep_history=True) as store:
        store.update_messages("c", [user("a"), user("b")])
        store.delete_messages("c")  # into history, which expires too
        store.apply_changes("c", appended=[user("c")], removed=[])
        assert len(store.get_history("c")) == 3
        time.sleep(0.6)
        assert store.get_messages("c") == []
        assert store.get_history("c") == []


def test_without_ttl_nothing_expires(store: RedisChatMemoryStore, client: redis.Redis) -> None:
    store.update_messages("c", [user("a")])
    assert store.ttl is None
    assert client.pttl(store.keys("c")[0]) == -1


# -- a server that goes back in time ----------------------------------------------------------


def _snapshot(client: redis.Redis, keys: Any) -> dict[str, bytes | None]:
    return {key: client.dump(key) for key in keys}  # type: ignore[misc]


def _restore(client: redis.Redis, snapshot: dict[str, bytes | None]) -> None:
    for key, dumped in snapshot.items():
        client.delete(key)
        if dumped is not None:
            client.restore(key, 0, dumped)


@pytest.mark.parametrize("later", [1, 3], ids=["fewer-than-lost", "more-than-lost"])
def test_a_reader_sees_a_conversation_restored_from_an_older_snapshot(
    store: RedisChatMemoryStore, client: redis.Redis, later: int
) -> None:
    # A failover to a replica behind, or a restart from an older snapshot, loses the last
    # writes, and the server numbers new messages again from where the snapshot was. A reader
    # that held the lost ones under those numbers must not keep showing them.
    store.apply_changes("c", appended=[user("a"), user("b")], removed=[])
    snapshot = _snapshot(client, store.keys("c"))
    store.apply_changes("c", appended=[user("lost 1"), user("lost 2")], removed=[])
    held, since = store.get_messages_since("c")
    assert texts(held) == ["a", "b", "lost 1", "lost 2"]
    _restore(client, snapshot)
    new = [user(f"new {i}") for i in range(later)]
    store.apply_changes("c", appended=new, removed=[])
    read, since = store.get_messages_since("c", since)
    assert texts(read) == texts(store.get_messages("c")) == ["a", "b", *texts(new)]
    assert [m.message_id for m in read[2:]] == [m.message_id for m in new]
    store.apply_changes("c", appended=[user("next")], removed=[])
    read, _ = store.get_messages_since("c", since)
    assert texts(read) == ["a", "b", *texts(new), "next"]


async def test_an_async_reader_sees_a_conversation_restored_from_an_older_snapshot(
    url: str, prefix: str, client: redis.Redis
) -> None:
    async with RedisChatMemoryStore(url, key_prefix=prefix) as store:
        await store.aapply_changes("c", appended=[user("a")], removed=[])
        snapshot = _snapshot(client, store.keys("c"))
        await store.aapply_changes("c", appended=[user("lost")], removed=[])
        _, since = await store.aget_messages_since("c")
        _restore(client, snapshot)
        await store.aapply_changes("c", appended=[user("new")], removed=[])
        read, _ = await store.aget_messages_since("c", since)
        assert texts(read) == ["a", "new"]


# -- corrupt data ---------------------------------------------------------------------------------


def test_a_corrupt_message_is_reported_with_the_memory_id_and_position(
    store: RedisChatMemoryStore, client: redis.Redis
) -> None:
    store.update_messages("alice", [user("a"), user("b"), user("c")])
    w = store.keys("alice")[0]
    client.lset(w, 1, '{"type": "user", "text": 5}')
    with pytest.raises(CorruptMessageError) as caught:
        store.get_messages("alice")
    assert caught.value.memory_id == "alice"
    assert caught.value.row == 1
    assert w in str(caught.value)
    assert "LSET" in str(caught.value)
    store.update_messages("bob", [user("fine")])
    assert texts(store.get_messages("bob")) == ["fine"]
    store.forget("alice")
    assert store.get_messages("alice") == []


def test_corrupt_history_is_reported(url: str, prefix: str, client: redis.Redis) -> None:
    with RedisChatMemoryStore(url, key_prefix=prefix, keep_history=True) as store:
        store.update_messages("c", [user("a"), user("b")])
        store.delete_messages("c")
        client.lset(store.keys("c")[4], 0, "garbage")
        with pytest.raises(CorruptMessageError, match=r"row 0 .* not '<number> <time>"):
            store.get_history("c")


# -- clients --------------------------------------------------------------------------------------


def test_a_client_passed_in_is_used_and_left_open(url: str, prefix: str) -> None:
    client = redis.Redis.from_url(url, decode_responses=True)
    with RedisChatMemoryStore(client, key_prefix=prefix, keep_history=True) as store:
        first = user("é 🙂")
        store.apply_changes("c", appended=[first, user("b")], removed=[])
        store.apply_changes("c", appended=[], removed=[first.message_id])
        assert texts(store.get_messages("c")) == ["b"]
        assert [e.evicted for e in store.get_history("c")] == [True, False]
    assert client.ping()  # still open
    client.close()


def test_async_methods_use_a_client_per_event_loop(url: str, prefix: str) -> None:
    store = RedisChatMemoryStore(url, key_prefix=prefix, keep_history=True)

    async def turn(text: str) -> list[str | None]:
        await store.aapply_changes("c", appended=[user(text)], removed=[])
        got = texts(await store.aget_messages("c"))
        await store.aclose()  # this loop's client; the sync one goes too
        return got

    # Two event loops one after the other, as two asyncio.run() calls make them.
    assert asyncio.run(turn("a")) == ["a"]
    store = RedisChatMemoryStore(url, key_prefix=prefix, keep_history=True)
    assert asyncio.run(turn("b")) == ["a", "b"]


async def test_async_twins_match_the_sync_methods(url: str, prefix: str) -> None:
    async with RedisChatMemoryStore(url, key_prefix=prefix, keep_history=True) as store:
        a, b = user("a"), user("b")
        await store.aupdate_messages("c", [a, b])
        await store.aapply_changes("c", appended=[user("c")], removed=[a.message_id])
        assert texts(await store.aget_messages("c")) == ["b", "c"]
        with pytest.raises(ValueError, match="appears twice"):
            await store.aapply_changes("c", appended=[b], removed=[])
        await store.adelete_messages("c")
        assert await store.aget_messages("c") == []
        history = await store.aget_history("c")
        assert [(m.message.text, m.evicted) for m in history] == [
            ("a", True),
            ("b", True),
            ("c", True),
        ]
        await store.aforget("c")
        assert await store.aget_history("c") == []


async def test_a_given_client_without_an_async_one_works_from_a_thread(
    url: str, prefix: str
) -> None:
    client = redis.Redis.from_url(url)
    store = RedisChatMemoryStore(client, key_prefix=prefix)
    await store.aapply_changes("c", appended=[user("a")], removed=[])
    assert texts(await store.aget_messages("c")) == ["a"]
    client.close()


async def test_a_given_async_client_is_used(url: str, prefix: str) -> None:
    name = f"given-{uuid.uuid4().hex}"
    client = redis.Redis.from_url(url)
    async_client = redis.asyncio.Redis.from_url(url, client_name=name)
    try:
        store = RedisChatMemoryStore(client, key_prefix=prefix, async_client=async_client)
        await store.aapply_changes("c", appended=[user("a")], removed=[])
        (mine,) = [c for c in client.client_list() if c["name"] == name]
        assert mine["cmd"] == "evalsha"  # the write went through it
        assert texts(await store.aget_messages("c")) == ["a"]
        await store.aclose()
        assert await async_client.ping()  # left open
    finally:
        await async_client.aclose()
        client.close()


# -- through a service ---------------------------------------------------------------------------


class Bot(ChatMemoryAccess, Protocol):
    async def chat(self, user: Annotated[str, MemoryId], text: str) -> str: ...


class CountingStore(RedisChatMemoryStore):
    """The store, counting which of its methods the memory calls."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[str] = []

    async def aget_messages(self, memory_id: Any) -> list[ChatMessage]:
        self.calls.append("aget_messages")
        return await super().aget_messages(memory_id)

    async def aapply_changes(self, memory_id: Any, **changes: Any) -> None:
        self.calls.append("aapply_changes")
        await super().aapply_changes(memory_id, **changes)


async def test_an_async_service_uses_the_async_client(url: str, prefix: str) -> None:
    store = CountingStore(url, key_prefix=prefix)

    def answer(request: ChatRequest) -> str:
        return f"echo:{request.messages[-1].text}"

    bot = ai_service(
        Bot,
        model=ScriptedChatModel(default=answer),
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=4, store=store),
    )
    for i in range(3):
        assert await bot.chat("alice", f"q{i}") == f"echo:q{i}"
    assert set(store.calls) == {"aget_messages", "aapply_changes"}
    assert texts(store.get_messages("alice")) == ["q1", "echo:q1", "q2", "echo:q2"]
    await store.aclose()


def test_a_closed_store_refuses_calls_and_makes_no_client(url: str, prefix: str) -> None:
    store = RedisChatMemoryStore(url, key_prefix=prefix)
    store.apply_changes("c", appended=[user("hi")], removed=[])
    store.close()
    with pytest.raises(redis.exceptions.ConnectionError, match="was closed: make a new"):
        store.apply_changes("c", appended=[user("after")], removed=[])

    async def call() -> None:
        await store.aget_messages("c")

    with pytest.raises(redis.exceptions.ConnectionError, match="was closed: make a new"):
        asyncio.run(call())
    with RedisChatMemoryStore(url, key_prefix=prefix) as fresh:
        assert texts(fresh.get_messages("c")) == ["hi"]


def test_a_read_since_a_mark_is_one_script_whatever_the_newest_message_holds(
    store: RedisChatMemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The script checks the newest held message's id; JSON its Lua reader refuses (an escaped
    # lone surrogate) is checked by the client, not by reading the whole window again.
    calls: list[object] = []
    call = store._call

    def counted(*args: Any) -> Any:
        calls.append(args[0])
        return call(*args)

    monkeypatch.setattr(store, "_call", counted)
    for text in ("plain", "lone \udc80 surrogate"):
        memory_id = f"c-{len(calls)}"
        store.apply_changes(memory_id, appended=[user("x"), user(text)], removed=[])
        _, since = store.get_messages_since(memory_id)
        calls.clear()
        for _ in range(3):
            again, since = store.get_messages_since(memory_id, since)
        assert len(calls) == 3
        assert texts(again) == ["x", text]

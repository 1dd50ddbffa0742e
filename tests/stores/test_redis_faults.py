"""RedisChatMemoryStore under faults: a frozen server, bytes that are not UTF-8, a cluster.

A frozen server (its process stopped with SIGSTOP, its socket still open) is one of this
test's own, on a free port, never the shared one; it is resumed and killed at teardown. A
call on it must fail within its timeout plus 2 s, raising redis-py's ``TimeoutError`` with
a message naming the server and the wait, leave the memory and the stored conversation as
they were, and not hold up later calls on the same conversation. The cluster is three nodes
of the test's own, made with ``redis-cli --cluster create``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
import redis.exceptions
from _servers import free_port, serving

from aiservices.messages import AiMessage, ChatMessage, new_message_id
from aiservices.stores import CorruptMessageError
from aiservices.stores.redis import RedisChatMemoryStore

from ._messages import texts, user
from ._server_backends import drop_redis_keys, require_redis, unavailable
from .test_store_failures import (
    BEFORE,
    ABot,
    Model,
    RedisServer,
    acheck_recovered,
    check_recovered,
    service,
    two_turns,
    wait_until,
)

DEFAULT_TIMEOUT = 5.0  # the documented default of socket_timeout and socket_connect_timeout
SLACK = 2.0  # what a failing call may take beyond its timeout


# -- a server to freeze -----------------------------------------------------------------------


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis server of this test's own, resumed and killed at teardown whatever happened."""
    binary = shutil.which("redis-server")
    if binary is None:
        unavailable("redis-server is not installed", "needed to freeze a server")
    server = RedisServer(binary, tmp_path)
    server.start()
    try:
        yield server
    finally:
        if server.process is not None:
            os.kill(server.process.pid, signal.SIGCONT)
        server.crash()


def freeze(server: RedisServer) -> None:
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGSTOP)


def thaw(server: RedisServer) -> None:
    """Resume the server, and wait until it has run what frozen calls left in its sockets."""
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGCONT)
    admin = redis.Redis(port=server.port, socket_timeout=10)
    try:
        # Redis reads a closed connection's last commands before it sees the close: once
        # only this connection is left, whatever a frozen call sent has been run.
        wait_until(lambda: len(admin.client_list()) == 1, "the frozen calls' connections")
    finally:
        admin.close()


class Call:
    """A call run in a daemon thread, so that a test can bound how long it blocks."""

    def __init__(self, call: Callable[[], object]) -> None:
        self.outcome: list[BaseException | None] = []
        self.thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self.thread.start()

    def _run(self, call: Callable[[], object]) -> None:
        try:
            call()
        except BaseException as exc:
            self.outcome.append(exc)
        else:
            self.outcome.append(None)

    def error(self, within: float) -> BaseException | None:
        """What the call raised (``None`` if it returned), if it ends within ``within`` s."""
        # One still blocked fails the test, and stays blocked until the teardown resumes the
        # server.
        self.thread.join(within)
        if self.thread.is_alive():
            pytest.fail(f"the call was still blocked after {within} s", pytrace=False)
        return self.outcome[0]


def within(seconds: float, call: Callable[[], object]) -> BaseException | None:
    """What ``call`` raised (``None`` if it returned), if it ends within ``seconds``."""
    return Call(call).error(seconds)


def a_prefix() -> str:
    return f"{uuid.uuid4().hex}:"


# -- 1. a frozen server ---------------------------------------------------------------------


@pytest.mark.slow
def test_a_frozen_server_fails_a_turn_within_the_default_timeout(server: RedisServer) -> None:
    # Frozen during the model call: the turn has read its memory and blocks at its write.
    model = Model()
    with RedisChatMemoryStore(server.url, key_prefix=a_prefix()) as store:
        bot = service(store, model)
        two_turns(bot)
        model.sabotage["lost"] = lambda: freeze(server)
        error = within(DEFAULT_TIMEOUT + SLACK, lambda: bot.chat("alice", "lost"))
        assert isinstance(error, redis.exceptions.TimeoutError), repr(error)
        message = str(error)
        assert f"127.0.0.1:{server.port}/0" in message
        assert "within 5 s" in message
        assert "socket_timeout" in message
        assert isinstance(error.__cause__, redis.exceptions.TimeoutError)
        thaw(server)
        # The write reached the server's socket before it froze, and ran when it resumed:
        # too late, so it changed nothing.
        check_recovered(bot, model, store, BEFORE)


@pytest.mark.slow
def test_calls_queued_on_a_frozen_conversation_each_fail_within_the_timeout(
    server: RedisServer,
) -> None:
    # Frozen before the calls: they block at their read. The second waits for the first to
    # give the conversation up, then for its own read.
    model = Model()
    with RedisChatMemoryStore(server.url, key_prefix=a_prefix(), socket_timeout=1) as store:
        bot = service(store, model)
        two_turns(bot)
        asked = len(model.requests)
        freeze(server)
        first = Call(lambda: bot.chat("alice", "q3"))
        time.sleep(0.2)  # the first call holds the conversation
        second = Call(lambda: bot.chat("alice", "q4"))
        for call, bound in ((first, 1 + SLACK), (second, 1 + SLACK)):
            error = call.error(bound)
            assert isinstance(error, redis.exceptions.TimeoutError), repr(error)
            assert "within 1 s" in str(error)
        assert len(model.requests) == asked  # no model call without the memory
        thaw(server)
        check_recovered(bot, model, store, BEFORE)


@pytest.mark.slow
async def test_a_frozen_server_fails_an_async_turn_within_the_timeout(server: RedisServer) -> None:
    model = Model()
    async with RedisChatMemoryStore(server.url, key_prefix=a_prefix(), socket_timeout=1) as store:
        bot = service(store, model, ABot)
        for question in ("q1", "q2"):
            assert await bot.chat("alice", question) == f"answer to {question}"
        model.sabotage["lost"] = lambda: freeze(server)
        started = time.monotonic()
        with pytest.raises(redis.exceptions.TimeoutError, match="within 1 s"):
            await asyncio.wait_for(bot.chat("alice", "lost"), 1 + SLACK + 5)
        assert time.monotonic() - started < 1 + SLACK
        thaw(server)
        await acheck_recovered(bot, model, store, BEFORE)


@pytest.mark.slow
def test_a_server_that_accepts_no_connection_fails_within_the_connect_timeout() -> None:
    # A listener that never accepts, its queue (of one, with a backlog of 0) taken: the
    # kernel drops every further attempt to connect, as a host that has gone would.
    with (
        socket.create_server(("127.0.0.1", 0), backlog=0) as listener,
        socket.create_connection(listener.getsockname()),
    ):
        port = listener.getsockname()[1]
        url = f"redis://app:s3cret@127.0.0.1:{port}/0"
        with RedisChatMemoryStore(url, socket_connect_timeout=1, socket_timeout=30) as store:
            error = within(1 + SLACK, lambda: store.get_messages("alice"))
    assert isinstance(error, redis.exceptions.TimeoutError), repr(error)
    message = str(error)
    assert f"redis://***@127.0.0.1:{port}/0" in message
    assert "s3cret" not in message
    assert "within 1 s" in message
    assert "socket_connect_timeout" in message


def test_a_write_the_server_runs_after_its_deadline_is_not_applied() -> None:
    # As if the server had been frozen since the call began, a minute ago by its clock.
    url = require_redis()
    prefix = a_prefix()
    try:
        with RedisChatMemoryStore(url, key_prefix=prefix, socket_timeout=1) as store:
            first = [user("q"), AiMessage("a", message_id=new_message_id())]
            store.update_messages("alice", first)
            store.get_messages_since("alice")  # the store now knows the server's clock
            store._clock = {slot: (at - 60, mono) for slot, (at, mono) in store._clock.items()}
            with pytest.raises(redis.exceptions.TimeoutError, match="not applied"):
                store.apply_changes("alice", appended=[user("late")], removed=[])
            assert store.get_messages("alice") == first
    finally:
        drop_redis_keys(url, prefix)


def test_timeouts_are_options_of_the_clients_made_from_a_url() -> None:
    url = require_redis()

    def timeouts(client: Any) -> tuple[object, object]:
        kwargs = client.connection_pool.connection_kwargs
        return kwargs["socket_timeout"], kwargs["socket_connect_timeout"]

    with RedisChatMemoryStore(url) as store:
        assert (store.socket_timeout, store.socket_connect_timeout) == (5.0, 5.0)
        assert timeouts(store._client) == (5.0, 5.0)
    with RedisChatMemoryStore(url, socket_timeout=2.5, socket_connect_timeout=0.5) as store:
        assert timeouts(store._client) == (2.5, 0.5)

        async def async_client() -> Any:
            client = store._aclient()
            await store.aclose()
            return client

        assert timeouts(asyncio.run(async_client())) == (2.5, 0.5)
    # In the URL's query, as redis-py reads it, a timeout wins over the option.
    with RedisChatMemoryStore(f"{url}?socket_timeout=3", socket_timeout=2) as store:
        assert store.socket_timeout == 3.0
        assert timeouts(store._client)[0] == 3.0
    with RedisChatMemoryStore(url, socket_timeout=None, socket_connect_timeout=None) as store:
        assert timeouts(store._client) == (None, None)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"socket_timeout": 0}, ValueError, r"socket_timeout must be .* > 0, or None \(no limit\)"),
        ({"socket_timeout": -1}, ValueError, "socket_timeout must be a finite number of seconds"),
        ({"socket_timeout": float("nan")}, ValueError, "socket_timeout must be .*, got nan"),
        ({"socket_timeout": float("inf")}, ValueError, "socket_timeout must be .*, got inf"),
        ({"socket_connect_timeout": "5"}, TypeError, "socket_connect_timeout must be a finite"),
        ({"socket_timeout": True}, TypeError, "socket_timeout must be .*, not bool True"),
    ],
)
def test_bad_timeouts_are_refused(options: dict[str, Any], error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        RedisChatMemoryStore("redis://127.0.0.1:6379/0", **options)


def test_a_client_passed_in_keeps_its_own_timeouts() -> None:
    client = redis.Redis(socket_timeout=7)
    try:
        with pytest.raises(TypeError, match="set it on the client"):
            RedisChatMemoryStore(client, socket_timeout=1)
        with RedisChatMemoryStore(client) as store:
            assert store.socket_timeout is None
            assert client.connection_pool.connection_kwargs["socket_timeout"] == 7
    finally:
        client.close()


# -- 4. bytes that are not UTF-8 ----------------------------------------------------------------

NOT_UTF8 = b'{"type":"user","text":"caf\xe9"}'  # Latin-1: not UTF-8


@pytest.fixture
def url() -> str:
    return require_redis()


@pytest.fixture
def prefix(url: str) -> Iterator[str]:
    prefix = f"test:{uuid.uuid4().hex}:"
    yield prefix
    drop_redis_keys(url, prefix)


@pytest.fixture
def raw(url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(url)
    yield client
    client.close()


def three(store: RedisChatMemoryStore) -> list[ChatMessage]:
    messages: list[ChatMessage] = [user("a"), user("b"), user("c")]
    store.update_messages("alice", messages)
    return messages


def assert_names(error: CorruptMessageError, row: int, key: str) -> None:
    assert error.memory_id == "alice"
    assert error.row == row
    assert "UTF-8" in error.reason
    assert key in str(error)


def test_a_window_element_that_is_not_utf8_is_corrupt_on_every_read(
    url: str, prefix: str, raw: redis.Redis
) -> None:
    with RedisChatMemoryStore(url, key_prefix=prefix, keep_history=True) as writer:
        three(writer)
        w = writer.keys("alice")[0]
    raw.lset(w, 1, NOT_UTF8)
    reads: list[Callable[[RedisChatMemoryStore], object]] = [
        lambda store: store.get_messages("alice"),
        lambda store: store.get_messages_since("alice"),
        lambda store: store.get_history("alice"),
    ]
    for read in reads:
        with RedisChatMemoryStore(url, key_prefix=prefix, keep_history=True) as store:
            with pytest.raises(CorruptMessageError) as caught:
                read(store)
            assert_names(caught.value, 1, w)


async def test_a_window_element_that_is_not_utf8_is_corrupt_on_every_async_read(
    url: str, prefix: str, raw: redis.Redis
) -> None:
    with RedisChatMemoryStore(url, key_prefix=prefix, keep_history=True) as writer:
        three(writer)
        w = writer.keys("alice")[0]
    raw.lset(w, 2, NOT_UTF8)
    for name in ("aget_messages", "aget_messages_since", "aget_history"):
        async with RedisChatMemoryStore(url, key_prefix=prefix, keep_history=True) as store:
            with pytest.raises(CorruptMessageError) as caught:
                await getattr(store, name)("alice")
            assert_names(caught.value, 2, w)


@pytest.mark.parametrize("run", ["sync", "async"])
def test_a_newer_element_that_is_not_utf8_is_corrupt_when_read_since_a_mark(
    url: str, prefix: str, raw: redis.Redis, run: str
) -> None:
    async def go() -> None:
        async with RedisChatMemoryStore(url, key_prefix=prefix) as store:
            three(store)
            w = store.keys("alice")[0]
            if run == "sync":
                _, mark = store.get_messages_since("alice")
            else:
                _, mark = await store.aget_messages_since("alice")
            store.apply_changes("alice", appended=[user("d")], removed=[])
            raw.lset(w, 3, NOT_UTF8)

            async def read() -> object:
                if run == "sync":
                    return store.get_messages_since("alice", mark)
                return await store.aget_messages_since("alice", mark)

            with pytest.raises(CorruptMessageError) as caught:
                await read()
            assert_names(caught.value, 3, w)

    asyncio.run(go())


@pytest.mark.parametrize("run", ["sync", "async"])
def test_a_history_entry_that_is_not_utf8_is_corrupt(
    url: str, prefix: str, raw: redis.Redis, run: str
) -> None:
    async def go() -> None:
        async with RedisChatMemoryStore(url, key_prefix=prefix, keep_history=True) as store:
            messages = three(store)
            store.update_messages("alice", messages[1:])  # "a" leaves for the history
            h = store.keys("alice")[4]
            entry = raw.lindex(h, 0)
            assert isinstance(entry, bytes)
            raw.lset(h, 0, entry.replace(b'"a"', b'"caf\xe9"'))

            async def read() -> object:
                if run == "sync":
                    return store.get_history("alice")
                return await store.aget_history("alice")

            with pytest.raises(CorruptMessageError) as caught:
                await read()
            assert_names(caught.value, 0, h)
            # The window is intact, and still reads.
            assert texts(store.get_messages("alice")) == ["b", "c"]

    asyncio.run(go())


def test_a_client_that_decodes_replies_still_names_the_corrupt_element(
    url: str, prefix: str, raw: redis.Redis
) -> None:
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        with RedisChatMemoryStore(client, key_prefix=prefix, keep_history=True) as store:
            three(store)
            w = store.keys("alice")[0]
            assert texts(store.get_messages("alice")) == ["a", "b", "c"]
            raw.lset(w, 0, NOT_UTF8)
            for read in (store.get_messages, store.get_messages_since, store.get_history):
                with pytest.raises(CorruptMessageError) as caught:
                    read("alice")
                assert_names(caught.value, 0, w)
    finally:
        client.close()


# -- 8. a Redis Cluster ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[int]]:
    """The ports of a three-node Redis Cluster of this module's own."""
    binary, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if binary is None or cli is None:
        unavailable("redis-server and redis-cli are not installed", "needed to make a cluster")
    version = subprocess.run(
        [binary, "--version"], check=True, capture_output=True, text=True
    ).stdout
    major = int(version.split("v=")[1].split(".")[0])
    if major < 7:
        unavailable(f"redis-server {major} is too old", "--cluster-port needs Redis 7")
    directory = tmp_path_factory.mktemp("cluster")

    def node(bus: int) -> Callable[[int], list[str]]:
        return lambda port: [
            binary,
            *("--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory)),
            *("--cluster-enabled", "yes", "--cluster-port", str(bus)),
            *("--cluster-config-file", f"nodes-{port}.conf", "--save", "", "--appendonly", "no"),
        ]

    with ExitStack() as nodes:
        ports = [nodes.enter_context(serving(node(free_port()))) for _ in range(3)]
        subprocess.run(
            [cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports), "--cluster-yes"],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=60,
        )
        for port in ports:
            client = redis.Redis(port=port)
            try:
                wait_until(
                    lambda c=client: c.cluster("info")["cluster_state"] == "ok",  # type: ignore[misc]
                    f"node {port} to see the cluster",
                )
            finally:
                client.close()
        yield ports


IDS = [f"user-{i}" for i in range(24)]


def nodes_of(store: RedisChatMemoryStore) -> set[str]:
    client = store._client
    assert isinstance(client, redis.cluster.RedisCluster)
    return {client.get_node_from_key(store.keys(i)[0]).name for i in IDS}


@pytest.mark.slow
def test_a_cluster_url_keeps_conversations_on_every_node(cluster: list[int]) -> None:
    url = f"redis+cluster://127.0.0.1:{cluster[0]}"
    model = Model()
    with RedisChatMemoryStore(url, key_prefix=a_prefix(), keep_history=True) as store:
        assert isinstance(store._client, redis.cluster.RedisCluster)
        assert len(nodes_of(store)) == 3
        bot = service(store, model)
        for i in IDS:
            for question in ("q1", "q2", "q3"):
                assert bot.chat(i, f"{question} of {i}") == f"answer to {question} of {i}"
        for i in IDS:
            assert texts(store.get_messages(i)) == [
                f"q2 of {i}",
                f"answer to q2 of {i}",
                f"q3 of {i}",
                f"answer to q3 of {i}",
            ]
            history = store.get_history(i)
            assert [e.evicted for e in history] == [True, True, False, False, False, False]
            assert texts(store.get_messages_since(i)[0]) == texts(store.get_messages(i))
        assert sorted(store.memory_ids()) == sorted(IDS)  # type: ignore[type-var]
        store.delete_messages(IDS[0])
        store.forget(IDS[1])
        assert store.get_messages(IDS[0]) == []
        assert len(store.get_history(IDS[0])) == 6
        assert store.get_history(IDS[1]) == []


@pytest.mark.slow
async def test_a_cluster_url_serves_async_calls(cluster: list[int]) -> None:
    url = f"redis+cluster://127.0.0.1:{cluster[1]}"
    model = Model()
    async with RedisChatMemoryStore(url, key_prefix=a_prefix(), keep_history=True) as store:
        bot = service(store, model, ABot)
        for i in IDS:
            for question in ("q1", "q2", "q3"):
                assert await bot.chat(i, question) == f"answer to {question}"
        assert isinstance(store._aclient(), redis.asyncio.cluster.RedisCluster)
        for i in IDS:
            assert texts(await store.aget_messages(i)) == [
                "q2",
                "answer to q2",
                "q3",
                "answer to q3",
            ]
            assert len(await store.aget_history(i)) == 6
        await store.adelete_messages(IDS[0])
        await store.aforget(IDS[1])
        assert await store.aget_messages(IDS[0]) == []
        assert await store.aget_history(IDS[1]) == []


@pytest.mark.slow
def test_a_plain_url_to_a_cluster_node_says_to_use_the_cluster_form(cluster: list[int]) -> None:
    url = f"redis://127.0.0.1:{cluster[0]}/0"
    with RedisChatMemoryStore(url, key_prefix=a_prefix()) as store:
        errors = []
        for i in IDS:
            try:
                store.apply_changes(i, appended=[user("hi")], removed=[])
            except redis.exceptions.MovedError as exc:
                errors.append(exc)
        assert errors, "no id fell on another node"
        for error in errors:
            assert f"redis+cluster://127.0.0.1:{cluster[0]}/0" in str(error)
            assert isinstance(error.__cause__, redis.exceptions.MovedError)


# -- ids the keys hold ----------------------------------------------------------------------------


def test_long_ids_and_ids_with_lone_surrogates_go_through_a_turn(url: str, prefix: str) -> None:
    ids = ["user\udc80", "\ud800", "x" * 10_000, "\U0001f600" * 3_000]
    model = Model()
    with RedisChatMemoryStore(url, key_prefix=prefix) as store:
        bot = service(store, model)
        for memory_id in ids:
            store.check_memory_id(memory_id)
            assert bot.chat(memory_id, "hi\udfff") == "answer to hi\udfff"
        for memory_id in ids:
            assert texts(store.get_messages(memory_id)) == ["hi\udfff", "answer to hi\udfff"]
        assert sorted(store.memory_ids()) == sorted(ids)  # type: ignore[type-var]

"""Store failures through a service: the server goes down, a connection drops mid-call.

What must hold: the call raises the driver's own error; the memory is not left ahead of
the store (the next turn's request and the stored conversation show nothing of the failed
turn); and the next call after the server is back works.

The tests stop and start servers of their own (a Redis server and a PostgreSQL cluster in
temporary directories, on free ports), never the shared ones. A server is stopped from
inside the model call, so that the turn has read its memory and fails at its write.
"""

from __future__ import annotations

import os
import select
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from glob import glob
from pathlib import Path
from typing import Annotated, Any, Protocol

import psycopg
import pytest
import redis
import redis.exceptions
from psycopg import sql

from aiservices import ChatMemoryAccess, MemoryId, MessageWindowChatMemory, ai_service
from aiservices.messages import SystemMessage, UserMessage
from aiservices.models import ChatRequest
from aiservices.stores.postgres import PostgresChatMemoryStore
from aiservices.stores.redis import RedisChatMemoryStore
from aiservices.testing import ScriptedChatModel

from ._messages import texts
from ._server_backends import unavailable

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


# -- private servers ------------------------------------------------------------------------------


class RedisServer:
    """A Redis server of this test's own, whose data survives a crash (AOF, fsync always)."""

    def __init__(self, binary: str, directory: Path) -> None:
        self.binary = binary
        self.directory = directory
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                self.binary,
                *("--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory)),
                *("--save", "", "--appendonly", "yes", "--appendfsync", "always"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(self.answers, f"redis-server on port {self.port} to start")

    def answers(self) -> bool:
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5, retry=None)
        try:
            return bool(client.ping())
        except redis.exceptions.ConnectionError:
            return False
        finally:
            client.close()

    def crash(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
            self.process = None


class PostgresCluster:
    """A PostgreSQL cluster of this test's own, in a temporary directory."""

    def __init__(self, bindir: str, directory: Path) -> None:
        self.bindir = bindir
        self.directory = directory
        self.port = free_port()
        self.dsn = f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres"
        # PostgreSQL refuses to run as root: then it runs as the postgres user.
        self.run_as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.run_as:
            shutil.chown(directory, "postgres")
        self._pg("initdb", "-D", str(directory / "data"), "-U", "postgres", "--auth=trust",
                 "--no-sync", "-E", "UTF8", "--locale=C")  # fmt: skip

    def _pg(self, tool: str, *args: str) -> None:
        subprocess.run(
            [*self.run_as, f"{self.bindir}/{tool}", *args],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=60,
        )

    def start(self) -> None:
        options = f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1"
        self._pg("pg_ctl", "-D", str(self.directory / "data"), "-o", options,
                 "-l", str(self.directory / "log"), "-w", "start")  # fmt: skip

    def crash(self) -> None:
        self._pg("pg_ctl", "-D", str(self.directory / "data"), "-m", "immediate", "-w", "stop")

    def stop(self) -> None:
        self._pg("pg_ctl", "-D", str(self.directory / "data"), "-m", "fast", "-w", "stop")


def postgres_bindir() -> str | None:
    initdb = shutil.which("initdb")
    if initdb is not None:
        return str(Path(initdb).resolve().parent)
    found = sorted(glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    return str(Path(found[-1]).parent) if found else None


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    binary = shutil.which("redis-server")
    if binary is None:
        unavailable("redis-server is not installed", "needed to stop and restart a server")
    directory = Path(tempfile.mkdtemp(prefix="aiservices-redis-"))
    server = RedisServer(binary, directory)
    try:
        server.start()
        yield server
    finally:
        server.crash()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def postgres_cluster() -> Iterator[PostgresCluster]:
    bindir = postgres_bindir()
    if bindir is None:
        unavailable("PostgreSQL's initdb is not installed", "needed to stop and restart a server")
    directory = Path(tempfile.mkdtemp(prefix="aiservices-pg-"))
    try:
        cluster = PostgresCluster(bindir, directory)
        cluster.start()
        try:
            yield cluster
        finally:
            cluster.stop()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def running_redis(redis_server: RedisServer) -> Iterator[RedisServer]:
    """The private Redis server, running now and whatever the test did to it."""
    if not redis_server.answers():
        redis_server.start()
    yield redis_server
    if redis_server.process is None:
        redis_server.start()


@pytest.fixture
def running_postgres(postgres_cluster: PostgresCluster) -> Iterator[PostgresCluster]:
    """The private PostgreSQL cluster, running now and whatever the test did to it."""
    yield postgres_cluster
    try:
        psycopg.connect(postgres_cluster.dsn, connect_timeout=2).close()
    except psycopg.OperationalError:
        postgres_cluster.start()


# -- a service whose model can fail the store mid-turn --------------------------------------------


class Bot(ChatMemoryAccess, Protocol):
    def chat(self, user: Annotated[str, MemoryId], text: str) -> str: ...


class ABot(ChatMemoryAccess, Protocol):
    async def chat(self, user: Annotated[str, MemoryId], text: str) -> str: ...


class Model(ScriptedChatModel):
    """Answers "answer to <question>"; for a question in ``sabotage``, runs its action first."""

    def __init__(self) -> None:
        super().__init__(default=self.answer)
        self.sabotage: dict[str, Callable[[], None]] = {}

    def answer(self, request: ChatRequest) -> str:
        question = texts(list(request.messages))[-1] or ""
        action = self.sabotage.pop(question, None)
        if action is not None:
            action()
        return f"answer to {question}"


def service(store: Any, model: Model, interface: Any = Bot) -> Any:
    return ai_service(
        interface,
        model=model,
        chat_memory_provider=MessageWindowChatMemory.provider(max_messages=4, store=store),
    )


def check_recovered(bot: Any, model: Model, store: Any, before: list[str | None]) -> None:
    """The next turn sees exactly what was stored before the failure, and is stored after it."""
    assert texts(store.get_messages("alice")) == before
    assert bot.chat("alice", "after") == "answer to after"
    assert texts(model.last_messages) == [*before, "after"]
    assert texts(store.get_messages("alice")) == [*before[2:], "after", "answer to after"]


async def acheck_recovered(bot: Any, model: Model, store: Any, before: list[str | None]) -> None:
    assert texts(await store.aget_messages("alice")) == before
    assert await bot.chat("alice", "after") == "answer to after"
    assert texts(model.last_messages) == [*before, "after"]
    assert texts(await store.aget_messages("alice")) == [*before[2:], "after", "answer to after"]


BEFORE = ["q1", "answer to q1", "q2", "answer to q2"]


def two_turns(bot: Any) -> None:
    for question in ("q1", "q2"):
        assert bot.chat("alice", question) == f"answer to {question}"


# -- Redis ----------------------------------------------------------------------------------------


def test_redis_down_at_the_write(running_redis: RedisServer) -> None:
    model = Model()
    with RedisChatMemoryStore(running_redis.url, key_prefix=f"{uuid.uuid4().hex}:") as store:
        bot = service(store, model)
        two_turns(bot)
        model.sabotage["lost"] = running_redis.crash
        with pytest.raises(redis.exceptions.ConnectionError):
            bot.chat("alice", "lost")
        with pytest.raises(redis.exceptions.ConnectionError):
            bot.chat("alice", "while down")
        running_redis.start()
        check_recovered(bot, model, store, BEFORE)


@pytest.mark.parametrize("retries", ["url", "none"])
def test_redis_restarted_between_calls(running_redis: RedisServer, retries: str) -> None:
    # The client's pooled connection is to the server that went away; redis-py finds it
    # closed when it takes it, and connects again: the call never sees it.
    model = Model()
    prefix = f"{uuid.uuid4().hex}:"
    client = redis.Redis.from_url(running_redis.url)  # from_url: no retries
    target: Any = running_redis.url if retries == "url" else client
    with RedisChatMemoryStore(target, key_prefix=prefix) as store:
        bot = service(store, model)
        two_turns(bot)
        running_redis.crash()
        running_redis.start()
        assert bot.chat("alice", "q3") == "answer to q3"
        check_recovered(bot, model, store, ["q2", "answer to q2", "q3", "answer to q3"])
    client.close()


async def test_redis_down_at_the_write_of_an_async_call(running_redis: RedisServer) -> None:
    model = Model()
    async with RedisChatMemoryStore(running_redis.url, key_prefix=f"{uuid.uuid4().hex}:") as store:
        bot = service(store, model, ABot)
        for question in ("q1", "q2"):
            assert await bot.chat("alice", question) == f"answer to {question}"
        model.sabotage["lost"] = running_redis.crash
        with pytest.raises(redis.exceptions.ConnectionError):
            await bot.chat("alice", "lost")
        running_redis.start()
        await acheck_recovered(bot, model, store, BEFORE)


class Proxy:
    """A TCP proxy to a server that can cut a connection at a chosen request.

    ``drop_reply(marker)``: the next request containing ``marker`` reaches the server, but
    the connection is closed before its reply comes back. ``cut(marker)``: the next request
    containing ``marker`` never reaches the server; its connection is closed and new ones
    are refused until :meth:`heal`.
    """

    def __init__(self, port: int) -> None:
        self.upstream = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.marker: bytes | None = None
        self.mode = ""
        self.refusing = False
        self.dropped = 0
        self.closed = False
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def drop_reply(self, marker: bytes) -> None:
        self.mode, self.marker = "drop", marker

    def cut(self, marker: bytes) -> None:
        self.mode, self.marker = "cut", marker

    def heal(self) -> None:
        self.mode, self.marker, self.refusing = "", None, False

    def close(self) -> None:
        self.closed = True
        self.listener.close()
        for s in self.sockets:
            s.close()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.refusing:
                client.close()
                continue
            try:
                server = socket.create_connection(("127.0.0.1", self.upstream))
            except OSError:
                client.close()
                continue
            self.sockets += (client, server)
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        drop_next_reply = False
        try:
            while True:
                ready, _, _ = select.select([client, server], [], [], 0.5)
                if self.closed:
                    return
                if client in ready:
                    data = client.recv(65536)
                    if not data:
                        return
                    if self.marker is not None and self.marker in data:
                        mode, self.mode, self.marker = self.mode, "", None
                        if mode == "cut":
                            self.refusing = True
                            self.dropped += 1
                            return
                        drop_next_reply = True
                    server.sendall(data)
                if server in ready:
                    data = server.recv(65536)
                    if not data:
                        return
                    if drop_next_reply:
                        self.dropped += 1
                        return
                    client.sendall(data)
        except (OSError, ValueError):  # ValueError: close() closed a socket under select()
            return
        finally:
            client.close()
            server.close()


@pytest.fixture
def proxy(running_redis: RedisServer) -> Iterator[Proxy]:
    proxy = Proxy(running_redis.port)
    yield proxy
    proxy.close()


def test_a_reply_lost_after_the_write_is_not_applied_twice(proxy: Proxy) -> None:
    # redis-py sends the write again on a new connection; the store sees it was applied.
    model = Model()
    with RedisChatMemoryStore(proxy.url, key_prefix=f"{uuid.uuid4().hex}:") as store:
        bot = service(store, model)
        two_turns(bot)
        model.sabotage["q3"] = lambda: proxy.drop_reply(b"EVALSHA")
        assert bot.chat("alice", "q3") == "answer to q3"
        assert proxy.dropped == 1
        stored = texts(store.get_messages("alice"))
        assert stored == ["q2", "answer to q2", "q3", "answer to q3"]
        check_recovered(bot, model, store, stored)


def test_a_lost_reply_to_a_write_that_only_reaches_history_is_not_applied_twice(
    proxy: Proxy,
) -> None:
    # A window of one holding its system message: each message added leaves it in the write
    # that brings it, straight to history, and puts nothing in the window to recognise.
    with RedisChatMemoryStore(
        proxy.url, key_prefix=f"{uuid.uuid4().hex}:", keep_history=True
    ) as store:
        memory = MessageWindowChatMemory(1, id="c", store=store)
        memory.add(SystemMessage("Be brief."))
        memory.add(UserMessage("first"))
        proxy.drop_reply(b"EVALSHA")
        memory.add(UserMessage("second"))
        assert proxy.dropped == 1
        memory.add(UserMessage("third"))
        history = store.get_history("c")
        assert [e.message.text for e in history] == ["Be brief.", "first", "second", "third"]
        assert [e.evicted for e in history] == [False, True, True, True]
        assert len({e.message.message_id for e in history}) == 4
        assert texts(store.get_messages("c")) == ["Be brief."]


def test_a_reply_lost_by_a_client_that_does_not_retry_raises(proxy: Proxy) -> None:
    # The write was applied but the call can't know: it raises, and the memory, which
    # forgets what it staged, reads the stored conversation at the next turn.
    model = Model()
    client = redis.Redis.from_url(proxy.url)  # redis-py's from_url: no retries
    with RedisChatMemoryStore(client, key_prefix=f"{uuid.uuid4().hex}:") as store:
        bot = service(store, model)
        two_turns(bot)
        model.sabotage["q3"] = lambda: proxy.drop_reply(b"EVALSHA")
        with pytest.raises(redis.exceptions.ConnectionError):
            bot.chat("alice", "q3")
        stored = texts(store.get_messages("alice"))
        assert stored == ["q2", "answer to q2", "q3", "answer to q3"]
        check_recovered(bot, model, store, stored)
    client.close()


def test_a_connection_cut_before_the_write_raises_and_changes_nothing(proxy: Proxy) -> None:
    model = Model()
    with RedisChatMemoryStore(proxy.url, key_prefix=f"{uuid.uuid4().hex}:") as store:
        bot = service(store, model)
        two_turns(bot)
        model.sabotage["lost"] = lambda: proxy.cut(b"EVALSHA")
        with pytest.raises(redis.exceptions.ConnectionError):
            bot.chat("alice", "lost")
        assert proxy.dropped == 1
        proxy.heal()
        check_recovered(bot, model, store, BEFORE)


# -- PostgreSQL -----------------------------------------------------------------------------------


def postgres_store(cluster: PostgresCluster, **options: Any) -> PostgresChatMemoryStore:
    # A short wait for a connection: with the server down, a call fails in 2 s, not 30.
    return PostgresChatMemoryStore(cluster.dsn, table=f"t_{uuid.uuid4().hex}", timeout=2, **options)


def test_postgres_down_at_the_write(running_postgres: PostgresCluster) -> None:
    model = Model()
    with postgres_store(running_postgres) as store:
        bot = service(store, model)
        two_turns(bot)
        model.sabotage["lost"] = running_postgres.crash
        with pytest.raises(psycopg.OperationalError):
            bot.chat("alice", "lost")
        with pytest.raises(psycopg.OperationalError):  # psycopg_pool's PoolTimeout
            bot.chat("alice", "while down")
        running_postgres.start()
        check_recovered(bot, model, store, BEFORE)


def test_postgres_restarted_between_calls(running_postgres: PostgresCluster) -> None:
    # The pool's idle connections are to the server that went away: each is found closed
    # when taken from the pool, and replaced; the call never sees one.
    model = Model()
    with postgres_store(running_postgres, max_connections=3) as store:
        bot = service(store, model)
        two_turns(bot)
        running_postgres.crash()
        running_postgres.start()
        assert bot.chat("alice", "q3") == "answer to q3"
        check_recovered(bot, model, store, ["q2", "answer to q2", "q3", "answer to q3"])


async def test_postgres_restarted_between_async_calls(running_postgres: PostgresCluster) -> None:
    model = Model()
    async with postgres_store(running_postgres) as store:
        bot = service(store, model, ABot)
        for question in ("q1", "q2"):
            assert await bot.chat("alice", question) == f"answer to {question}"
        running_postgres.crash()
        running_postgres.start()
        assert await bot.chat("alice", "q3") == "answer to q3"
        await acheck_recovered(bot, model, store, ["q2", "answer to q2", "q3", "answer to q3"])


async def test_postgres_down_at_the_write_of_an_async_call(
    running_postgres: PostgresCluster,
) -> None:
    model = Model()
    async with postgres_store(running_postgres) as store:
        bot = service(store, model, ABot)
        for question in ("q1", "q2"):
            assert await bot.chat("alice", question) == f"answer to {question}"
        model.sabotage["lost"] = running_postgres.crash
        with pytest.raises(psycopg.OperationalError):
            await bot.chat("alice", "lost")
        running_postgres.start()
        await acheck_recovered(bot, model, store, BEFORE)


def test_postgres_connection_killed_mid_write(running_postgres: PostgresCluster) -> None:
    # The write waits for the conversation's lock, held elsewhere; its backend is then
    # terminated, as a failover or an administrator would.
    model = Model()
    with postgres_store(running_postgres) as store, psycopg.connect(running_postgres.dsn) as other:
        bot = service(store, model)
        two_turns(bot)
        conversations = sql.Identifier(f"{store.table}_conversations")
        other.execute(sql.SQL("SELECT * FROM {} FOR UPDATE").format(conversations))

        def kill_the_waiting_writer() -> None:
            def waiting() -> list[tuple[Any, ...]]:
                return other.execute(
                    "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND pid <> pg_backend_pid()"
                ).fetchall()

            wait_until(lambda: bool(waiting()), "the write to wait for the lock")
            other.execute("SELECT pg_terminate_backend(%s)", waiting()[0])

        def hold_the_lock_and_kill_the_writer() -> None:
            threading.Thread(target=kill_the_waiting_writer, daemon=True).start()

        model.sabotage["lost"] = hold_the_lock_and_kill_the_writer
        with pytest.raises(psycopg.OperationalError, match="terminat"):
            bot.chat("alice", "lost")
        other.rollback()
        check_recovered(bot, model, store, BEFORE)

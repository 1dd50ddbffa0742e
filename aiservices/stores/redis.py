"""A store on a Redis server: lists per conversation, changed only by Lua scripts.

Keys of one conversation (``P`` is ``key_prefix``; ``E`` is ``store_key(memory_id)`` in
unpadded base64url, ``=`` for the empty key)::

    P{E}:w   the window: a list of the messages as messages.message_to_json writes them
    P{E}:s   their sequence numbers, a list in step with P{E}:w
    P{E}:x   a hash: message_id -> "<sequence number> <token of the write that added it>"
    P{E}:n   the last sequence number given out
    P{E}:h   the history (keep_history): a list of "<sequence number> <when it left the
             window, unix seconds> <message>", in the order they left

The braces make ``E`` the hash tag, so a conversation's keys share one Redis Cluster slot.
base64url has no glob characters and no braces: no memory id can reach another's keys or
match a pattern meant for another.

A read is one ``LRANGE`` or one read-only script. Every write is one Lua script, which
Redis runs atomically: a turn appends to the lists and removes the evicted messages, found
by their message id from the front (``LPOS``), so writers in any thread, task or process
never lose another's messages, and the conversation is never written whole. A checked
write (``apply_changes(..., since=...)``) compares, in its script, the newest number in
``P{E}:s`` (-1: none) with the one its read saw, and changes nothing if they differ: numbers
only grow, so another writer's append changes it, and so does emptying the window.

Clients made from a URL wait at most ``socket_timeout`` for a reply. Each write they send
carries a deadline on the server's clock: the call's start plus ``socket_timeout``, placed
on that clock by the server time the last read of the conversation's node returned. A
script that runs later (the server was frozen or stalled while the call waited, and the
call raised ``TimeoutError``) changes nothing, so a call reported as failed never takes
effect afterwards.
"""

from __future__ import annotations

import base64
import bisect
import copy
import hashlib
import math
import re
import secrets
import threading
import time
from collections.abc import Callable, Collection, Hashable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Self, cast
from urllib.parse import parse_qs, urlsplit

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.retry
import redis.cluster
import redis.exceptions
from redis.backoff import FullJitterBackoff, NoBackoff
from redis.client import NEVER_DECODE
from redis.crc import key_slot
from redis.exceptions import NoScriptError
from redis.retry import Retry

from .._per_loop import PerLoop, close_in_loop
from ..messages import ChatMessage, message_from_json, message_to_json
from ._base import ConcurrentChangeError, memory_id_of, store_key
from ._common import (
    CorruptMessageError,
    HistoryEntry,
    MessageCache,
    WindowRead,
    appended_ids,
    check_retention,
    check_seconds,
    check_unique_ids,
    duplicate_id_error,
    plan_update,
    thread_call,
    window_since,
    with_message_ids,
)

__all__ = ["RedisChatMemoryStore"]

# Shared by the scripts. KEYS are always w, s, x, n, h, t.
_PRELUDE = """
local w, s, x, n, h, t = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local now
local function clock()
  if not now then
    local t = redis.call('TIME')
    now = t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
  end
  return now
end
local function to_history(seq, text)
  redis.call('RPUSH', h, seq .. ' ' .. clock() .. ' ' .. text)
end
-- Removes the message numbered seq from the window; returns its text.
local function remove(seq)
  local pos = redis.call('LPOS', s, seq)
  if not pos then return nil end
  if pos == 0 then
    redis.call('LPOP', s)
    return redis.call('LPOP', w)
  end
  -- No command removes at an index: mark the element, then remove the first marked one.
  -- The marks can't be a stored value: numbers never start with '-', JSON with '-'.
  local text = redis.call('LINDEX', w, pos)
  redis.call('LSET', w, pos, '-removed-')
  redis.call('LREM', w, 1, '-removed-')
  redis.call('LSET', s, pos, '-')
  redis.call('LREM', s, 1, '-')
  return text
end
-- The first ``passing`` messages (0 if nil) left the window in the write that brought them:
-- numbered in order with the others, they go to history alone.
local function append(pairs_from, token, passing)
  passing = passing or 0
  local count = (#ARGV - pairs_from + 1) / 2
  if redis.call('EXISTS', n) == 0 then
    -- Numbering starts from the clock (microseconds, exact in a Lua number until the year
    -- 2255): a conversation emptied and begun again never reuses a number that a reader
    -- may still hold for another message, since writing each number took longer than that.
    local t = redis.call('TIME')
    redis.call('SET', n, t[1] .. string.format('%06d', tonumber(t[2])))
  end
  local seq = redis.call('INCRBY', n, count) - count
  for k = pairs_from, #ARGV, 2 do
    seq = seq + 1
    -- Written with every digit ('..' would write a number this large with 14).
    local number = string.format('%d', seq)
    if passing > 0 then
      passing = passing - 1
      to_history(number, ARGV[k + 1])
    else
      redis.call('RPUSH', w, ARGV[k + 1])
      redis.call('RPUSH', s, number)
      redis.call('HSET', x, ARGV[k], number .. ' ' .. token)
    end
  end
end
-- Whether a write comes too late: the call that sent it stops waiting at the deadline
-- (server seconds; 0: none), after which its caller has been told that it failed.
local function late(deadline)
  local by = tonumber(deadline)
  if by == 0 then return false end
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000 > by
end
local function finish(ttl)
  -- Without history, an emptied conversation leaves no key behind; with it, the counter
  -- stays, so that later messages are numbered after the history's.
  if redis.call('EXISTS', w) == 0 and redis.call('EXISTS', h) == 0 then
    redis.call('DEL', n, t)
  end
  if ttl > 0 then
    for _, key in ipairs(KEYS) do redis.call('PEXPIRE', key, ttl) end
  end
end
"""

# ARGV: the highest sequence number the reader holds. Returns the window's sequence numbers,
# the texts of the messages numbered higher (always the last ones: numbers only grow), the
# server's time, and the message id of the newest message the reader holds by its number.
# That id tells a number reused apart: restored from an older snapshot, or failed over to a
# replica behind, the server numbers new messages again from where it was, and those are the
# newest; if any has a number the reader holds, the newest of them does.
_SINCE = """
local after = tonumber(ARGV[1])
local seqs = redis.call('LRANGE', s, 0, -1)
local first = #seqs + 1
while first > 1 and tonumber(seqs[first - 1]) > after do first = first - 1 end
local texts = {}
if first <= #seqs then texts = redis.call('LRANGE', w, first - 1, -1) end
local held, whole = false, false
if first > 1 then
  local text = redis.call('LINDEX', w, first - 2)
  local ok, message = pcall(cjson.decode, text)
  if ok and type(message) == 'table' and type(message.message_id) == 'string' then
    held = message.message_id
  else
    whole = text  -- cjson refuses some JSON (an escaped lone surrogate): read by the client
  end
end
return {seqs, texts, redis.call('TIME'), held, whole}
"""

# ARGV: keep_history (0/1), ttl in ms (0: none), deadline, the version the write was planned
# on ('': unchecked), token, the number of removed ids, the removed ids, the number of
# appended messages that go to history alone (keep_history only), then id, message, id,
# message, ... for the appended ones. A version is the window's newest sequence number, -1
# when it is empty.
# Returns {'ok', version after the write}; {'applied', version after it} when the same write
# (its token) was applied before, as when the client sends it again after losing the reply;
# 'changed' when the window's version is not the one planned on, 'late' past the deadline, or
# {'duplicate', message_id}, changing nothing.
_APPLY = """
local keep, ttl, planned, token = ARGV[1] == '1', tonumber(ARGV[2]), ARGV[4], ARGV[5]
local last_removed = 6 + tonumber(ARGV[6])
local passing = tonumber(ARGV[last_removed + 1])
local first_pair = last_removed + 2
local removing = {}
for k = 7, last_removed do removing[ARGV[k]] = true end
local duplicate
for k = first_pair, #ARGV, 2 do
  if not removing[ARGV[k]] then
    local entry = redis.call('HGET', x, ARGV[k])
    if entry then
      if string.sub(entry, -#token - 1) == ' ' .. token then
        -- Its messages were numbered in a row: the last is the newest the write left.
        -- (-2, no version at all, if the entry is not a number.)
        local seq = tonumber(string.match(entry, '^%S+'))
        return {'applied', seq and string.format('%d', seq + (#ARGV - 1 - k) / 2) or '-2'}
      end
      duplicate = ARGV[k]
      break
    end
  end
end
-- A write whose messages all left the window at once put none in x: t keeps the tokens of
-- the latest such writes, each with the version it left.
local to_history_only = passing > 0 and passing == (#ARGV - first_pair + 1) / 2
if to_history_only then
  for _, entry in ipairs(redis.call('LRANGE', t, 0, -1)) do
    if string.sub(entry, 1, #token + 1) == token .. ' ' then
      return {'applied', string.sub(entry, #token + 2)}
    end
  end
end
-- Another writer's append gives the window a newer number (numbers only grow); emptying it
-- leaves none.
if planned ~= '' and (redis.call('LINDEX', s, -1) or '-1') ~= planned then return 'changed' end
if duplicate then return {'duplicate', duplicate} end
if late(ARGV[3]) then return 'late' end
for k = 7, last_removed do
  local entry = redis.call('HGET', x, ARGV[k])
  if entry then
    local seq = string.match(entry, '^%S+')
    local text = remove(seq)
    if keep and text then to_history(seq, text) end
    redis.call('HDEL', x, ARGV[k])
  end
end
if #ARGV > last_removed + 1 then append(first_pair, token, passing) end
local version = redis.call('LINDEX', s, -1) or '-1'
if to_history_only then
  redis.call('LPUSH', t, token .. ' ' .. version)
  redis.call('LTRIM', t, 0, 15)
end
finish(ttl)
return {'ok', version}
"""

# Returns the window's texts, their sequence numbers and the id index, read together (what
# update_messages plans from), and the server's time.
_WINDOW = """
return {redis.call('LRANGE', w, 0, -1), redis.call('LRANGE', s, 0, -1),
        redis.call('HGETALL', x), redis.call('TIME')}
"""

# ARGV: keep_history, ttl, deadline, token, the window's sequence numbers as read
# (comma-separated), rewrite (0/1), the number of leaving messages, then sequence number, id
# ('=' and the id, '' if none) of each, then id, message, ... of those to append. Carries out
# update_messages' plan, or returns 'changed' (changing nothing) if the window is no longer
# the one it was planned on, 'late' past the deadline.
_EXECUTE = """
local keep, ttl, token = ARGV[1] == '1', tonumber(ARGV[2]), ARGV[4]
if table.concat(redis.call('LRANGE', s, 0, -1), ',') ~= ARGV[5] then return 'changed' end
if late(ARGV[3]) then return 'late' end
local last = 7 + 2 * tonumber(ARGV[7])
for k = 8, last, 2 do
  local seq, id = ARGV[k], ARGV[k + 1]
  local text = remove(seq)
  if keep and text then to_history(seq, text) end
  if id ~= '' then redis.call('HDEL', x, string.sub(id, 2)) end
end
if ARGV[6] == '1' then redis.call('DEL', w, s, x) end
if #ARGV > last then append(last + 1, token) end
finish(ttl)
return 'ok'
"""

# ARGV: keep_history, ttl, deadline. Empties the window (into history with keep_history).
_DELETE = """
local keep, ttl = ARGV[1] == '1', tonumber(ARGV[2])
if late(ARGV[3]) then return 'late' end
if keep then
  local texts = redis.call('LRANGE', w, 0, -1)
  local seqs = redis.call('LRANGE', s, 0, -1)
  for k = 1, #texts do to_history(seqs[k] or '?', texts[k]) end
end
redis.call('DEL', w, s, x)
finish(ttl)
return 'ok'
"""

# ARGV: deadline. Erases every key of the conversation.
_FORGET = """
if late(ARGV[1]) then return 'late' end
redis.call('DEL', w, s, x, n, h, t)
return 'ok'
"""

# Returns the history, the window's sequence numbers and the window, read together, and the
# server's time.
_HISTORY = """
return {redis.call('LRANGE', h, 0, -1), redis.call('LRANGE', s, 0, -1),
        redis.call('LRANGE', w, 0, -1), redis.call('TIME')}
"""


@dataclass(frozen=True, slots=True)
class _Script:
    source: str
    sha: str

    @classmethod
    def of(cls, body: str) -> _Script:
        source = _PRELUDE + body
        return cls(source, hashlib.sha1(source.encode()).hexdigest())  # Redis names it so


_APPLY_SCRIPT = _Script.of(_APPLY)
_WINDOW_SCRIPT = _Script.of(_WINDOW)
_EXECUTE_SCRIPT = _Script.of(_EXECUTE)
_DELETE_SCRIPT = _Script.of(_DELETE)
_SINCE_SCRIPT = _Script.of(_SINCE)
_FORGET_SCRIPT = _Script.of(_FORGET)
_HISTORY_SCRIPT = _Script.of(_HISTORY)
_TIME_SCRIPT = _Script.of("return redis.call('TIME')")

_Keys = tuple[str, str, str, str, str, str]
_Client = redis.Redis | redis.cluster.RedisCluster
_AsyncClient = redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster

DEFAULT_TIMEOUT = 5.0
"""Seconds a client made from a URL waits for a connection, and for each reply."""

# Clients made from a URL send a command again after a connection error, up to 3 times
# within about 0.15 s (pauses drawn up to 20, 40, 80 ms): a write is recognised if it was
# applied before (its token), so a lost reply is harmless. A timeout is not retried: the
# server is frozen or overloaded, and the call's wait is bounded by socket_timeout.
_RETRIES = 3
_BACKOFF = FullJitterBackoff(cap=1.0, base=0.01)
_RETRIED = (redis.exceptions.ConnectionError,)

# A cluster client retries at the cluster level, a timeout too, and redis-py gives it no way
# to tell them apart: it retries nothing, so that a frozen node fails the call within
# socket_timeout (it still follows MOVED and ASK redirections).
_CLUSTER_RETRIES = 0

# Replies as bytes, whatever the client's decode_responses: the store decodes them itself,
# so that bytes that are not UTF-8 are reported as the corrupt element they are.
_RAW = {NEVER_DECODE: True}

# How long the server time a read returned places a write's deadline: the clocks drift
# apart by far less than a second in that time. Older, a write asks the server first.
_CLOCK_AGE = 30.0

_MAX_KEY = 512 * 1024 * 1024  # Redis's proto-max-bulk-len, the limit on a key

_CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


class RedisChatMemoryStore:
    """Keeps conversations on a Redis server (6.0.6 or newer) or cluster, shared by every process.

    ``url_or_client`` is a ``redis://`` (or ``rediss://``, ``unix://``) URL; a
    ``redis+cluster://`` (or ``rediss+cluster://``) URL naming any node of a Redis Cluster;
    or a ``redis.Redis`` or ``redis.cluster.RedisCluster`` client. From a URL the store
    makes a client for its sync methods and, in each event loop that calls its async methods,
    a ``redis.asyncio`` client (a cluster client for a cluster URL). Given a client, async
    calls use ``async_client`` if given, else run the sync methods in a worker thread (a
    caller cancelled meanwhile is told so once the call has ended). Clients made from a URL
    are closed by `close` (or `aclose`); clients passed in are left open.

    ``key_prefix`` starts every key the store writes. ``ttl`` (seconds or a ``timedelta``)
    makes a conversation expire that long after its last write, history included. With
    ``keep_history=True``, messages leaving the window move to a history list instead of
    being deleted; `get_history` reads the whole transcript and `forget` erases
    it.

    ``socket_connect_timeout`` and ``socket_timeout`` (seconds, 5 each; ``None``: no limit,
    or for the connection as for a reply) bound how long a client made from a URL waits to
    connect and for each reply; one in the URL's query (``?socket_timeout=2``) wins, as in
    redis-py. A call that waits longer raises ``redis.exceptions.TimeoutError`` naming the
    server and the wait, and changes nothing: a write the server runs after its call gave up
    is refused. A client passed in keeps its own timeouts and retries. Errors are redis-py's
    own (``redis.exceptions.ConnectionError``, ...), raised once the client's retries are
    spent (a client made from a ``redis://`` URL resends a command 3 times within about
    0.15 s after a connection error, a cluster client none). A write sent again after its
    reply was lost is applied once.
    """

    def __init__(
        self,
        url_or_client: str | redis.Redis | redis.cluster.RedisCluster,
        *,
        key_prefix: str = "aiservices:",
        ttl: float | timedelta | None = None,
        keep_history: bool = False,
        async_client: redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster | None = None,
        retention: timedelta | None = None,
        socket_timeout: float | None = DEFAULT_TIMEOUT,
        socket_connect_timeout: float | None = DEFAULT_TIMEOUT,
    ) -> None:
        if not isinstance(key_prefix, str):
            raise TypeError(f"key_prefix must be a str, not {type(key_prefix).__name__}")
        self.key_prefix = key_prefix
        self.keep_history = bool(keep_history)
        if retention is not None:
            # Every persistent store's retention; here it is the keys' own expiry.
            if ttl is not None:
                raise ValueError("give retention= or ttl=, not both: they are the same setting")
            ttl = check_retention(retention)
        self._ttl_ms = 0 if ttl is None else _ttl_ms(ttl)
        self.retention: timedelta | None = (
            timedelta(milliseconds=self._ttl_ms) if self._ttl_ms else None
        )
        """How long a conversation untouched by any write lives (``ttl`` as a timedelta)."""
        self.ttl: float | None = self._ttl_ms / 1000 if self._ttl_ms else None
        """Seconds a conversation lives after its last write; ``None``: for ever."""
        socket_timeout = _seconds("socket_timeout", socket_timeout)
        socket_connect_timeout = _seconds("socket_connect_timeout", socket_connect_timeout)
        self._url: str | None = None
        self._client_url = ""  # the URL as redis-py reads it (no "+cluster")
        self._cluster = False
        self._sync_client: _Client | None = None
        self._lock = threading.Lock()
        if isinstance(url_or_client, str):
            self._url = url_or_client
            self._client_url, self._cluster = _client_url(url_or_client)
            # As redis-py reads the URL, a timeout in its query wins over the option.
            query = parse_qs(urlsplit(self._client_url).query)
            socket_timeout = _query_seconds(query, "socket_timeout", socket_timeout)
            socket_connect_timeout = _query_seconds(
                query, "socket_connect_timeout", socket_connect_timeout
            )
            self._timeouts = (socket_timeout, socket_connect_timeout)
        elif isinstance(url_or_client, redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster):
            raise TypeError(
                "url_or_client must be a URL or a sync redis.Redis client; pass a "
                "redis.asyncio.Redis client as async_client=, next to a sync one"
            )
        elif callable(getattr(url_or_client, "evalsha", None)):
            if (socket_timeout, socket_connect_timeout) != (DEFAULT_TIMEOUT, DEFAULT_TIMEOUT):
                raise TypeError(
                    "socket_timeout and socket_connect_timeout apply to the clients the store "
                    "makes from a URL; a client passed in keeps its own: set it on the client "
                    "(redis.Redis(..., socket_timeout=5))"
                )
            self._sync_client = url_or_client
            self._cluster = isinstance(url_or_client, redis.cluster.RedisCluster)
            socket_timeout = socket_connect_timeout = None
        else:
            raise TypeError(
                "url_or_client must be a redis:// URL or a redis.Redis client (for a cluster, "
                "a redis+cluster:// URL or a redis.cluster.RedisCluster client), not "
                f"{type(url_or_client).__name__}"
            )
        # None for a client passed in: it keeps its own.
        self.socket_timeout: float | None = socket_timeout
        """Seconds a client made from the URL waits for each reply (``None``: no limit)."""
        self.socket_connect_timeout: float | None = socket_connect_timeout
        """Seconds a client made from the URL waits to connect (``None``: as for a reply)."""
        self._async_client = async_client
        if async_client is not None:
            self._cluster = self._cluster or isinstance(
                async_client, redis.asyncio.cluster.RedisCluster
            )
        # The deadline added to the start of a write, if the store made the client that
        # sends it: a client passed in may wait longer, and resend after a timeout.
        self._fence = socket_timeout if self._url is not None else None
        self._afence = self._fence if async_client is None else None
        # The server time each node last returned, and when (time.monotonic()): by slot.
        self._clock: dict[int, tuple[float, float]] = {}
        self._loop_clients: PerLoop[_AsyncClient] = PerLoop()
        self._closed = False
        self._cache = MessageCache()

    def __repr__(self) -> str:
        where = _redact(self._url) if self._url is not None else repr(self._sync_client)
        return (
            f"{type(self).__name__}({where}, key_prefix={self.key_prefix!r}, ttl={self.ttl!r}, "
            f"keep_history={self.keep_history!r})"
        )

    def keys(self, memory_id: Hashable) -> _Keys:
        """The conversation's keys: window, sequence numbers, id index, counter, history,
        and the tokens of the latest writes that went to history alone."""
        tag = base64.urlsafe_b64encode(store_key(memory_id).encode("utf-8", "surrogatepass"))
        base = f"{self.key_prefix}{{{tag.rstrip(b'=').decode() or '='}}}:"
        return f"{base}w", f"{base}s", f"{base}x", f"{base}n", f"{base}h", f"{base}t"

    def check_memory_id(self, memory_id: Hashable) -> None:
        """Raise ``ValueError`` if ``memory_id``'s keys would be longer than Redis holds."""
        length = len(self.keys(memory_id)[0])
        if length > _MAX_KEY:
            raise ValueError(
                f"memory id of {length:,} characters once encoded can't be a Redis key (at most "
                f"{_MAX_KEY:,} bytes); use a shorter id, such as a hash of this one"
            )

    def memory_ids(self) -> Iterator[Hashable]:
        """The ids of the conversations this store holds, each as it was given.

        Scans the server's keys under ``key_prefix`` (``SCAN``, a page at a time; every
        primary node of a cluster).
        """
        prefix = self.key_prefix
        pattern = "".join("\\" + c if c in "*?[]\\" else c for c in prefix) + "{*}:*"
        tags: dict[str, None] = {}
        try:
            for raw in self._client.scan_iter(match=pattern, count=1000):
                key = raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else raw
                tag = key[len(prefix) + 1 : key.rindex("}")]
                tags.setdefault(tag, None)
        except (redis.exceptions.TimeoutError, redis.exceptions.MovedError) as exc:
            raise self._explained(exc, fenced=True) from exc  # a read changes nothing
        for tag in tags:
            padded = "" if tag == "=" else tag + "=" * (-len(tag) % 4)
            yield memory_id_of(base64.urlsafe_b64decode(padded).decode("utf-8", "surrogatepass"))

    # -- the store protocol --------------------------------------------------------------

    def get_messages(self, memory_id: Hashable) -> list[ChatMessage]:
        """The messages in the window, oldest first; ``[]`` for an unknown id."""
        w = self.keys(memory_id)[0]
        return self._parse(memory_id, w, self._lrange(w))

    def get_messages_since(
        self, memory_id: Hashable, since: object = None
    ) -> tuple[list[ChatMessage], object]:
        """The window, and what to pass as ``since`` to the next read of it.

        Messages an earlier read returned (``since`` is what it returned beside them) are
        reused rather than parsed again: only those numbered after it are fetched whole.
        """
        keys = self.keys(memory_id)
        raw = self._call(_SINCE_SCRIPT, keys, (_after(since),))
        self._mark(keys, raw[2])
        read = window_since(*self._since_rows(memory_id, keys[0], raw, since))
        if read is None:
            raw = self._call(_SINCE_SCRIPT, keys, (-1,))
            read = window_since(*self._since_rows(memory_id, keys[0], raw, None))
            assert read is not None  # every row has its text
        return read

    def apply_changes(
        self,
        memory_id: Hashable,
        *,
        appended: Sequence[ChatMessage],
        removed: Collection[str],
        history_only: Sequence[ChatMessage] = (),
        since: object = None,
    ) -> WindowRead:
        """In one script, remove the messages whose id is in ``removed`` (moving them to
        history with ``keep_history``), then append ``appended`` after every stored message.

        ``history_only`` left the window in the write that brought them: with
        ``keep_history`` they are recorded in history, as evicted, before ``appended``.
        ``since`` (what a read or a write returned) checks the write: if another writer has
        appended to the window or emptied it since, nothing changes and
        `ConcurrentChangeError` is raised. Returns the ``since`` for the next read and write.
        Sent again after a lost reply (redis-py retries on connection errors), the same call
        is recognised and not applied twice.
        """
        started = time.monotonic()
        keys = self.keys(memory_id)
        args, texts = _apply_args(appended, removed, history_only, self.keep_history, since)
        deadline = self._deadline(keys, started)
        result = self._call(_APPLY_SCRIPT, keys, [*self._flags(), deadline, *args])
        return self._applied(memory_id, result, appended, texts, since)

    def update_messages(self, memory_id: Hashable, messages: Sequence[ChatMessage]) -> None:
        """Make the window equal to ``messages``, writing only the difference.

        Stored messages missing from ``messages`` are removed (to history with
        ``keep_history``) and new ones appended. If the messages kept would change order, or
        a new one goes before one kept, the window is written again.
        """
        started = time.monotonic()
        keys, new, texts = self._update_args(memory_id, messages)
        for _ in range(_PLAN_TRIES):
            window = self._call(_WINDOW_SCRIPT, keys, ())
            deadline = _by(self._mark(keys, window[3]), started, self._fence)
            done = _text(
                self._call(_EXECUTE_SCRIPT, keys, self._plan(window, new, texts, deadline))
            )
            if done != "changed":
                break
        else:
            raise _busy(memory_id)
        self._check_in_time(done, memory_id, "update_messages")
        self._cache.remember(texts, new)

    def delete_messages(self, memory_id: Hashable) -> None:
        """Empty the window; with ``keep_history`` its messages stay in history, evicted."""
        started = time.monotonic()
        keys = self.keys(memory_id)
        deadline = self._deadline(keys, started)
        done = self._call(_DELETE_SCRIPT, keys, (*self._flags(), deadline))
        self._check_in_time(_text(done), memory_id, "delete_messages")

    def get_history(self, memory_id: Hashable) -> list[HistoryEntry]:
        """Every message kept for ``memory_id``, in order: the history, then the window.

        Each entry's ``evicted_at`` says when it left the window (``None``: still in it).
        Without ``keep_history`` evicted messages are deleted, so only the window and any
        history written earlier by a store with ``keep_history`` remain.
        """
        keys = self.keys(memory_id)
        raw = self._call(_HISTORY_SCRIPT, keys, ())
        self._mark(keys, raw[3])
        return self._history(memory_id, keys, raw)

    def forget(self, memory_id: Hashable) -> None:
        """Erase the conversation's window and history."""
        started = time.monotonic()
        keys = self.keys(memory_id)
        done = self._call(_FORGET_SCRIPT, keys, (self._deadline(keys, started),))
        self._check_in_time(_text(done), memory_id, "forget")

    # -- async twins ---------------------------------------------------------------------

    async def aget_messages(self, memory_id: Hashable) -> list[ChatMessage]:
        """`get_messages` for async callers."""
        client = self._aclient()
        if client is None:
            return await thread_call(self.get_messages, memory_id)
        w = self.keys(memory_id)[0]
        return self._parse(memory_id, w, await self._alrange(client, w))

    async def aget_messages_since(
        self, memory_id: Hashable, since: object = None
    ) -> tuple[list[ChatMessage], object]:
        """`get_messages_since` for async callers."""
        client = self._aclient()
        if client is None:
            return await thread_call(self.get_messages_since, memory_id, since)
        keys = self.keys(memory_id)
        raw = await self._acall(client, _SINCE_SCRIPT, keys, (_after(since),))
        self._mark(keys, raw[2])
        read = window_since(*self._since_rows(memory_id, keys[0], raw, since))
        if read is None:
            raw = await self._acall(client, _SINCE_SCRIPT, keys, (-1,))
            read = window_since(*self._since_rows(memory_id, keys[0], raw, None))
            assert read is not None  # every row has its text
        return read

    async def aapply_changes(
        self,
        memory_id: Hashable,
        *,
        appended: Sequence[ChatMessage],
        removed: Collection[str],
        history_only: Sequence[ChatMessage] = (),
        since: object = None,
    ) -> WindowRead:
        """`apply_changes` for async callers."""
        client = self._aclient()
        if client is None:
            # Only the keywords given: a subclass's apply_changes may take neither.
            more: dict[str, Any] = {"history_only": history_only} if history_only else {}
            if since is not None:
                more["since"] = since
            return await thread_call(
                self.apply_changes, memory_id, appended=appended, removed=removed, **more
            )
        started = time.monotonic()
        keys = self.keys(memory_id)
        args, texts = _apply_args(appended, removed, history_only, self.keep_history, since)
        deadline = await self._adeadline(client, keys, started)
        result = await self._acall(client, _APPLY_SCRIPT, keys, [*self._flags(), deadline, *args])
        return self._applied(memory_id, result, appended, texts, since)

    async def aupdate_messages(self, memory_id: Hashable, messages: Sequence[ChatMessage]) -> None:
        """`update_messages` for async callers."""
        client = self._aclient()
        if client is None:
            return await thread_call(self.update_messages, memory_id, messages)
        started = time.monotonic()
        keys, new, texts = self._update_args(memory_id, messages)
        for _ in range(_PLAN_TRIES):
            window = await self._acall(client, _WINDOW_SCRIPT, keys, ())
            deadline = _by(self._mark(keys, window[3]), started, self._afence)
            args = self._plan(window, new, texts, deadline)
            done = _text(await self._acall(client, _EXECUTE_SCRIPT, keys, args))
            if done != "changed":
                break
        else:
            raise _busy(memory_id)
        self._check_in_time(done, memory_id, "update_messages")
        self._cache.remember(texts, new)
        return None

    async def adelete_messages(self, memory_id: Hashable) -> None:
        """`delete_messages` for async callers."""
        client = self._aclient()
        if client is None:
            return await thread_call(self.delete_messages, memory_id)
        started = time.monotonic()
        keys = self.keys(memory_id)
        deadline = await self._adeadline(client, keys, started)
        done = await self._acall(client, _DELETE_SCRIPT, keys, (*self._flags(), deadline))
        self._check_in_time(_text(done), memory_id, "delete_messages")
        return None

    async def aget_history(self, memory_id: Hashable) -> list[HistoryEntry]:
        """`get_history` for async callers."""
        client = self._aclient()
        if client is None:
            return await thread_call(self.get_history, memory_id)
        keys = self.keys(memory_id)
        raw = await self._acall(client, _HISTORY_SCRIPT, keys, ())
        self._mark(keys, raw[3])
        return self._history(memory_id, keys, raw)

    async def aforget(self, memory_id: Hashable) -> None:
        """`forget` for async callers."""
        client = self._aclient()
        if client is None:
            return await thread_call(self.forget, memory_id)
        started = time.monotonic()
        keys = self.keys(memory_id)
        deadline = await self._adeadline(client, keys, started)
        done = await self._acall(client, _FORGET_SCRIPT, keys, (deadline,))
        self._check_in_time(_text(done), memory_id, "forget")
        return None

    # -- clients -------------------------------------------------------------------------

    @property
    def _client(self) -> _Client:
        """The sync client, made from the URL at first use."""
        # A cluster client reads the cluster's layout when it is made: made with the store,
        # it would fail the constructor whenever a node is down.
        client = self._sync_client
        if client is None:
            with self._lock:
                if self._sync_client is None:
                    self._sync_client = self._new_client()
                client = self._sync_client
        return client

    def _closed_error(self) -> redis.exceptions.ConnectionError:
        return redis.exceptions.ConnectionError(
            f"the store for Redis at {self._where()} was closed: make a new "
            "RedisChatMemoryStore, or close it only when its calls are done"
        )

    def _new_client(self) -> _Client:
        if self._closed:
            raise self._closed_error()
        url, (timeout, connect) = self._client_url, self._timeouts
        if self._cluster:
            return redis.cluster.RedisCluster.from_url(
                url,
                retry=Retry(NoBackoff(), _CLUSTER_RETRIES),
                socket_timeout=timeout,
                socket_connect_timeout=connect,
            )
        return redis.Redis.from_url(
            url,
            retry=Retry(_BACKOFF, _RETRIES, supported_errors=_RETRIED),
            socket_timeout=timeout,
            socket_connect_timeout=connect,
        )

    def _new_async_client(self) -> _AsyncClient:
        if self._closed:
            raise self._closed_error()  # else a client would be made for this loop, unclosed
        url, (timeout, connect) = self._client_url, self._timeouts
        if self._cluster:
            return redis.asyncio.cluster.RedisCluster.from_url(
                url,
                retry=redis.asyncio.retry.Retry(NoBackoff(), _CLUSTER_RETRIES),
                socket_timeout=timeout,
                socket_connect_timeout=connect,
            )
        return redis.asyncio.Redis.from_url(
            url,
            retry=redis.asyncio.retry.Retry(_BACKOFF, _RETRIES, supported_errors=_RETRIED),
            socket_timeout=timeout,
            socket_connect_timeout=connect,
        )

    def _aclient(self) -> _AsyncClient | None:
        if self._async_client is not None:
            return self._async_client
        if self._url is None:
            return None
        # An asyncio connection belongs to the event loop that opened it: one client per loop.
        return self._loop_clients.get(self._new_async_client)

    def close(self) -> None:
        """Close the clients this store made from its URL (not clients passed in).

        An async client is closed in its own event loop: at once if that loop is idle, soon
        if it is running; one whose loop has already closed can no longer be closed (call
        `aclose` in the loop before it ends).
        """
        if self._url is not None:
            self._closed = True  # the clients it made are not made again
        for loop, client in self._loop_clients.pop_all():
            close_in_loop(loop, client.aclose)
        if self._url is not None and self._sync_client is not None:
            with self._lock:
                made, self._sync_client = self._sync_client, None
            if made is not None:
                made.close()

    async def aclose(self) -> None:
        """Close the clients this store made, the current event loop's one awaited."""
        client = self._loop_clients.pop()
        if client is not None:
            await client.aclose()
        self.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- talking to the server -------------------------------------------------------------

    def _call(self, script: _Script, keys: _Keys, args: Sequence[Any]) -> Any:
        """``script``'s reply, undecoded; a timeout explained."""
        try:
            client = self._client
            execute: Any = client.execute_command  # untyped in redis-py
            try:
                return execute("EVALSHA", script.sha, len(keys), *keys, *args, **_RAW)
            except NoScriptError:
                # A server that restarted, or that never saw the script: load it and go on.
                client.script_load(script.source)
                return execute("EVALSHA", script.sha, len(keys), *keys, *args, **_RAW)
        except (redis.exceptions.TimeoutError, redis.exceptions.MovedError) as exc:
            raise self._explained(exc, fenced=self._fence is not None) from exc

    async def _acall(
        self, client: _AsyncClient, script: _Script, keys: _Keys, args: Sequence[Any]
    ) -> Any:
        """`_call` on an async client."""
        try:
            try:
                return await client.execute_command(
                    "EVALSHA", script.sha, len(keys), *keys, *args, **_RAW
                )
            except NoScriptError:
                await client.script_load(script.source)
                return await client.execute_command(
                    "EVALSHA", script.sha, len(keys), *keys, *args, **_RAW
                )
        except (redis.exceptions.TimeoutError, redis.exceptions.MovedError) as exc:
            raise self._explained(exc, fenced=self._afence is not None) from exc

    def _lrange(self, key: str) -> Any:
        try:
            execute: Any = self._client.execute_command
            return execute("LRANGE", key, 0, -1, **_RAW)
        except (redis.exceptions.TimeoutError, redis.exceptions.MovedError) as exc:
            raise self._explained(exc, fenced=True) from exc  # a read changes nothing

    async def _alrange(self, client: _AsyncClient, key: str) -> Any:
        try:
            return await client.execute_command("LRANGE", key, 0, -1, **_RAW)
        except (redis.exceptions.TimeoutError, redis.exceptions.MovedError) as exc:
            raise self._explained(exc, fenced=True) from exc

    def _slot(self, key: str) -> int:
        # A cluster's nodes have clocks of their own: each slot is placed on its node's.
        return key_slot(key.encode()) if self._cluster else 0

    def _mark(self, keys: _Keys, server_time: Any) -> tuple[float, float]:
        """Note the server time a script of the conversation returned, and when."""
        clock = (int(server_time[0]) + int(server_time[1]) / 1_000_000, time.monotonic())
        self._clock[self._slot(keys[0])] = clock
        return clock

    def _known_clock(self, keys: _Keys, started: float) -> tuple[float, float] | None:
        clock = self._clock.get(self._slot(keys[0]))
        return clock if clock is not None and started - clock[1] <= _CLOCK_AGE else None

    def _deadline(self, keys: _Keys, started: float) -> str:
        """The server time by which a write begun at ``started`` must run ("0": any time)."""
        if self._fence is None:
            return "0"
        clock = self._known_clock(keys, started)
        if clock is None:
            clock = self._mark(keys, self._call(_TIME_SCRIPT, keys, ()))
        return _by(clock, started, self._fence)

    async def _adeadline(self, client: _AsyncClient, keys: _Keys, started: float) -> str:
        """`_deadline` for a write sent by ``client``."""
        if self._afence is None:
            return "0"
        clock = self._known_clock(keys, started)
        if clock is None:
            clock = self._mark(keys, await self._acall(client, _TIME_SCRIPT, keys, ()))
        return _by(clock, started, self._afence)

    def _check_in_time(self, done: str, memory_id: Hashable, method: str) -> None:
        if done == "late":
            raise redis.exceptions.TimeoutError(
                f"{method}({memory_id!r}): Redis at {self._where()} ran the write more than "
                f"{self.socket_timeout or 0:g} s (socket_timeout) after the call began, when "
                "the call may have stopped waiting for it, so it was not applied: the stored "
                "conversation is unchanged. The server was stalled or overloaded; call again, "
                "or give the store a larger socket_timeout= if it is only slow"
            )

    def _where(self) -> str:
        return _redact(self._url) if self._url is not None else "the client's server"

    def _explained(
        self, exc: redis.exceptions.RedisError, *, fenced: bool
    ) -> redis.exceptions.RedisError:
        """``exc`` (a timeout, a redirection) of the same type, saying what failed and why."""
        if isinstance(exc, redis.exceptions.MovedError):
            if self._cluster:
                return _reworded(exc, str(exc))
            node = "redis+cluster://host:port"
            if self._url is not None:
                node = _redact(re.sub(r"^rediss?(?=://)", r"\g<0>+cluster", self._url))
            return _reworded(
                exc,
                f"Redis at {self._where()} is a node of a Redis Cluster, which keeps each "
                "conversation on the node of its hash slot, and this one is on another node "
                f"(MOVED {exc}); make the store with the URL {node} (or a "
                "redis.cluster.RedisCluster client) to reach every node",
            )
        connecting = "connect" in str(exc).lower()  # redis-py: "Timeout connecting to ..."
        option = "socket_connect_timeout" if connecting else "socket_timeout"
        seconds = self.socket_timeout
        if connecting and self.socket_connect_timeout is not None:
            seconds = self.socket_connect_timeout
        what = "could not be reached" if connecting else "did not answer"
        if seconds is not None:
            what += f" within {seconds:g} s ({option}={seconds:g})"
        if fenced or connecting:
            outcome = "The call changed nothing: a write the server runs later is refused"
        else:
            outcome = (
                "A write the server runs later may still be applied: the client was passed "
                "in, and keeps its own timeouts and retries"
            )
        return _reworded(
            exc,
            f"Redis at {self._where()} {what}: {exc}. {outcome}. Check that the server is "
            f"running and reachable; if it is only slow, give the store a larger {option}=",
        )

    # -- what the sync and async paths share ----------------------------------------------

    def _flags(self) -> tuple[int, int]:
        return (1 if self.keep_history else 0), self._ttl_ms

    def _applied(
        self,
        memory_id: Hashable,
        result: Any,
        appended: Sequence[ChatMessage],
        texts: list[str],
        since: object,
    ) -> WindowRead:
        """What ``apply_changes`` returns for the reply ``_APPLY`` gave, or its error."""
        status = _text(result[0] if isinstance(result, list) else result)
        if status == "duplicate":
            raise duplicate_id_error(_text(result[1]), memory_id)
        if status == "changed":
            raise ConcurrentChangeError(memory_id)
        self._check_in_time(status, memory_id, "apply_changes")
        self._cache.remember(texts[len(texts) - len(appended) :], appended)
        version = int(result[1])  # "ok" or "applied"
        if isinstance(since, WindowRead):
            return since.at(version)
        return WindowRead(-1, [], [], version)

    def _update_args(
        self, memory_id: Hashable, messages: Sequence[ChatMessage]
    ) -> tuple[_Keys, list[ChatMessage], list[str]]:
        new = with_message_ids(messages)
        check_unique_ids(new)
        return self.keys(memory_id), new, [message_to_json(m) for m in new]

    def _plan(
        self, window: Any, new: list[ChatMessage], texts: list[str], deadline: str
    ) -> list[Any]:
        """The arguments of ``_EXECUTE`` for making ``window`` (as ``_WINDOW`` read it) the
        wanted messages."""
        raw_texts, raw_seqs, index = window[:3]
        seqs = [_text(seq) for seq in raw_seqs]
        id_of = {}
        for k in range(0, len(index), 2):
            id_of[_text(index[k + 1]).partition(" ")[0]] = _text(index[k])
        ids = [id_of.get(seq) for seq in seqs]  # None: a row the index has lost
        # Undecodable texts compare unequal to every wanted one: such a message is replaced.
        stored = list(zip(ids, map(_text, raw_texts), strict=True))
        wanted = [(m.message_id, text) for m, text in zip(new, texts, strict=True)]
        plan = plan_update(stored, wanted)
        leaving = {*plan.removed, *plan.changed}
        token = secrets.token_urlsafe(12)
        args: list[Any] = [*self._flags(), deadline, token, ",".join(seqs)]
        gone = [(seq, mid) for seq, mid in zip(seqs, ids, strict=True) if mid in leaving]
        args += ("1" if plan.rewrite else "0", len(gone))
        for seq, mid in gone:
            args += (seq, "" if mid is None else "=" + mid)  # "" (an id) is an id too
        for m, text in zip(new[plan.fresh :], texts[plan.fresh :], strict=True):
            args += (m.message_id, text)
        return args

    def _since_rows(
        self, memory_id: Hashable, w: str, raw: Any, since: object
    ) -> tuple[list[tuple[int, object, object]], object, Callable[[list[int]], list[ChatMessage]]]:
        """The arguments of ``window_since`` for what ``_SINCE`` returned."""
        seqs, texts = raw[0], raw[1]
        first = len(seqs) - len(texts)
        rows: list[tuple[int, object, object]] = []
        for pos, seq in enumerate(seqs):
            number = _number(memory_id, _text(seq), f"{w[:-1]}s", pos)
            rows.append((number, number, texts[pos - first] if pos >= first else None))
        if first and isinstance(since, WindowRead):
            # The reader's message under the newest number it holds must be the stored one:
            # else the numbers were reused, and what it holds is read again.
            number = rows[first - 1][0]
            at = bisect.bisect_left(cast("list[int]", since.marks), number)
            held = since.messages[at] if since.marks[at : at + 1] == [number] else None
            if held is None or held.message_id != _stored_id(raw):
                since = None

        def parse(indexes: list[int]) -> list[ChatMessage]:
            decoded = _decoded(memory_id, w, [rows[i][2] for i in indexes], indexes)

            def corrupt(i: int, reason: str) -> Exception:
                return _corrupt(memory_id, w, indexes[i], reason)

            return self._cache.parse(decoded, corrupt)

        return rows, since, parse

    def _parse(self, memory_id: Hashable, w: str, raw: list[Any]) -> list[ChatMessage]:
        if not raw:
            return []
        texts = _decoded(memory_id, w, raw)

        def corrupt(i: int, reason: str) -> Exception:
            return _corrupt(memory_id, w, i, reason)

        return self._cache.parse(texts, corrupt)

    def _history(self, memory_id: Hashable, keys: _Keys, raw: list[Any]) -> list[HistoryEntry]:
        w, h = keys[0], keys[4]
        evicted, seqs, window = raw[0], raw[1], raw[2]
        # (sequence number, message text, evicted_at, where: key and position)
        rows: list[tuple[int, str, datetime | None, tuple[str, int]]] = []
        for pos, item in enumerate(_decoded(memory_id, h, evicted)):
            parts = item.split(" ", 2)
            if len(parts) != 3:
                raise _corrupt(memory_id, h, pos, "not '<number> <time> <message>'")
            seq, when, text = parts
            rows.append(
                (
                    _number(memory_id, seq, h, pos),
                    text,
                    _evicted_at(memory_id, when, h, pos),
                    (h, pos),
                )
            )
        if len(seqs) != len(window):
            raise _corrupt(
                memory_id, w, len(window), f"{len(window)} messages but {len(seqs)} numbers"
            )
        texts = _decoded(memory_id, w, window)
        for pos, (seq, text) in enumerate(zip(seqs, texts, strict=True)):
            rows.append((_number(memory_id, _text(seq), w, pos), text, None, (w, pos)))
        rows.sort(key=lambda row: row[0])

        def corrupt(i: int, reason: str) -> Exception:
            return _corrupt(memory_id, *rows[i][3], reason)

        messages = self._cache.parse([row[1] for row in rows], corrupt)
        return [HistoryEntry(m, row[2]) for m, row in zip(messages, rows, strict=True)]


_PLAN_TRIES = 20  # writers changing the window between a plan and its execution


def _apply_args(
    appended: Sequence[ChatMessage],
    removed: Collection[str],
    history_only: Sequence[ChatMessage],
    keep_history: bool,
    since: object,
) -> tuple[list[Any], list[str]]:
    """The arguments of ``_APPLY`` after the flags and the deadline, and the texts appended
    (``history_only``'s first; none without history)."""
    if not keep_history:
        history_only = ()
    every = [*history_only, *appended] if history_only else appended
    new_ids = appended_ids(every, removed)
    texts = [message_to_json(m) for m in every]
    planned = str(since.version) if isinstance(since, WindowRead) else ""
    # 96 random bits: one write's token is never taken for another's.
    token = secrets.token_urlsafe(12)
    args: list[Any] = [planned, token, len(removed), *removed, len(history_only)]
    for mid, text in zip(new_ids, texts, strict=True):
        args += (mid, text)
    return args, texts


def _by(clock: tuple[float, float], started: float, fence: float | None) -> str:
    """The server time ``fence`` seconds after ``started``, on the server clock ``clock``."""
    if fence is None:
        return "0"
    server, at = clock
    # ``at`` is when the reply came back, a little after the server read its clock: the
    # deadline errs early, never late.
    return f"{server + (started - at) + fence:.6f}"


def _busy(memory_id: Hashable) -> RuntimeError:
    return RuntimeError(
        f"update_messages({memory_id!r}): other writers changed the conversation "
        f"{_PLAN_TRIES} times while it was being replaced; try again"
    )


def _stored_id(raw: Any) -> str | None:
    """The message id ``_SINCE`` read of the newest message the reader holds by number."""
    if raw[3] is not None:
        return _text(raw[3])
    if len(raw) > 4 and raw[4] is not None:
        try:
            return message_from_json(_text(raw[4])).message_id
        except ValueError:
            return None
    return None


def _after(since: object) -> int:
    return since.after if isinstance(since, WindowRead) else -1


def _ttl_ms(ttl: float | timedelta) -> int:
    seconds = ttl.total_seconds() if isinstance(ttl, timedelta) else ttl
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise TypeError(f"ttl must be seconds or a timedelta, not {type(ttl).__name__}")
    if not math.isfinite(seconds):
        raise ValueError(
            f"ttl must be a finite number of seconds, got {ttl!r}; use ttl=None for no expiry"
        )
    ms = round(seconds * 1000)
    if ms < 1:
        raise ValueError(f"ttl must be at least 1 ms, got {ttl!r}; use ttl=None for no expiry")
    return ms


def _seconds(name: str, value: object) -> float | None:
    """A timeout option as seconds, or a clear error."""
    return check_seconds(name, value, none="no limit")


def _query_seconds(query: dict[str, list[str]], name: str, default: float | None) -> float | None:
    """A timeout given in a URL's query, else ``default``."""
    if name not in query:
        return default
    text = query[name][-1]
    try:
        return _seconds(name, float(text))
    except ValueError:
        raise ValueError(
            f"{name}={text!r} in the URL is not a positive number of seconds"
        ) from None


def _client_url(url: str) -> tuple[str, bool]:
    """The URL as redis-py reads it, and whether it names a Redis Cluster."""
    scheme, sep, rest = url.partition("://")
    plain = _CLUSTER_SCHEMES.get(scheme.lower())
    if sep and plain is not None:
        return f"{plain}://{rest}", True
    return url, False


def _redact(url: str) -> str:
    # A password in the URL never reaches a repr or an error message.
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest:
        rest = "***@" + rest.rpartition("@")[2]
    rest = re.sub(r"(?i)([?&]password=)[^&]*", r"\g<1>***", rest)
    return repr(f"{scheme}{sep}{rest}")


def _reworded(exc: redis.exceptions.RedisError, message: str) -> redis.exceptions.RedisError:
    """A copy of ``exc`` (same type and attributes) whose message is ``message``."""
    new = copy.copy(exc)
    new.args = (message,)
    return new


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _decoded(
    memory_id: Hashable, key: str, raw: Sequence[Any], positions: Sequence[int] | None = None
) -> list[str]:
    """The elements of the list ``key`` as text; one that is not UTF-8 is corrupt."""
    try:
        return [t.decode() if type(t) is bytes else t for t in raw]
    except UnicodeDecodeError:
        for i, t in enumerate(raw):
            try:
                if type(t) is bytes:
                    t.decode()
            except UnicodeDecodeError as exc:
                pos = i if positions is None else positions[i]
                raise _corrupt(
                    memory_id, key, pos, f"it is not UTF-8 text ({exc.reason} at byte {exc.start})"
                ) from None
        raise


def _number(memory_id: Hashable, seq: str, key: str, pos: int) -> int:
    try:
        return int(seq)
    except ValueError:
        raise _corrupt(memory_id, key, pos, f"sequence number {seq!r} is not a number") from None


def _evicted_at(memory_id: Hashable, when: str, key: str, pos: int) -> datetime:
    seconds, _, micros = when.partition(".")
    try:
        return datetime.fromtimestamp(int(seconds), UTC).replace(microsecond=int(micros or 0))
    except (TypeError, ValueError, OverflowError):
        raise _corrupt(memory_id, key, pos, f"eviction time {when!r} is not a timestamp") from None


def _corrupt(memory_id: Hashable, key: str, pos: int, reason: str) -> CorruptMessageError:
    return CorruptMessageError(
        memory_id,
        pos,
        reason,
        hint=(
            f"it is element {pos} of the list {key}: repair it with LSET, or erase the "
            "conversation with the store's forget()"
        ),
    )

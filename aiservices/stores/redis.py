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

A read is one ``LRANGE``. Every write is one Lua script, which Redis runs atomically: a
turn appends to the lists and removes the evicted messages, found by their message id from
the front (``LPOS``), so writers in any thread, task or process never lose another's
messages, and the conversation is never written whole.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import secrets
from collections.abc import Callable, Collection, Hashable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Self

import redis
import redis.asyncio
import redis.asyncio.retry
from redis.backoff import FullJitterBackoff
from redis.exceptions import NoScriptError
from redis.retry import Retry

from .._per_loop import PerLoop, close_in_loop
from ..messages import ChatMessage, message_to_json
from ._base import memory_id_of, store_key
from ._common import (
    CorruptMessageError,
    HistoryEntry,
    MessageCache,
    WindowRead,
    appended_ids,
    check_retention,
    check_unique_ids,
    duplicate_id_error,
    plan_update,
    window_since,
    with_message_ids,
)

__all__ = ["RedisChatMemoryStore"]

# Shared by the scripts. KEYS are always w, s, x, n, h.
_PRELUDE = """
local w, s, x, n, h = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
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
local function append(pairs_from, token)
  local count = (#ARGV - pairs_from + 1) / 2
  if redis.call('EXISTS', n) == 0 then
    -- Numbering starts from the clock (milliseconds): a conversation emptied and begun
    -- again never reuses a number that a reader may still hold for another message.
    local t = redis.call('TIME')
    redis.call('SET', n, t[1] .. string.format('%03d', math.floor(tonumber(t[2]) / 1000)))
  end
  local seq = redis.call('INCRBY', n, count) - count
  for k = pairs_from, #ARGV, 2 do
    seq = seq + 1
    redis.call('RPUSH', w, ARGV[k + 1])
    redis.call('RPUSH', s, seq)
    redis.call('HSET', x, ARGV[k], seq .. ' ' .. token)
  end
end
local function finish(ttl)
  -- Without history, an emptied conversation leaves no key behind; with it, the counter
  -- stays, so that later messages are numbered after the history's.
  if redis.call('EXISTS', w) == 0 and redis.call('EXISTS', h) == 0 then
    redis.call('DEL', n)
  end
  if ttl > 0 then
    for _, key in ipairs(KEYS) do redis.call('PEXPIRE', key, ttl) end
  end
end
"""

# ARGV: the highest sequence number the reader holds. Returns the window's sequence numbers
# and the texts of the messages numbered higher (always the last ones: numbers only grow).
_SINCE = """
local after = tonumber(ARGV[1])
local seqs = redis.call('LRANGE', s, 0, -1)
local first = #seqs + 1
while first > 1 and tonumber(seqs[first - 1]) > after do first = first - 1 end
local texts = {}
if first <= #seqs then texts = redis.call('LRANGE', w, first - 1, -1) end
return {seqs, texts}
"""

# ARGV: keep_history (0/1), ttl in ms (0: none), token, the number of removed ids, the
# removed ids, then id, message, id, message, ... for the appended ones.
# Returns 'ok'; 'applied' when the same write (its token) was applied before, as when the
# client sends it again after losing the reply; or {'duplicate', message_id}, changing
# nothing.
_APPLY = """
local keep, ttl, token = ARGV[1] == '1', tonumber(ARGV[2]), ARGV[3]
local last_removed = 4 + tonumber(ARGV[4])
local removing = {}
for k = 5, last_removed do removing[ARGV[k]] = true end
for k = last_removed + 1, #ARGV, 2 do
  if not removing[ARGV[k]] then
    local entry = redis.call('HGET', x, ARGV[k])
    if entry then
      if string.sub(entry, -#token - 1) == ' ' .. token then return 'applied' end
      return {'duplicate', ARGV[k]}
    end
  end
end
for k = 5, last_removed do
  local entry = redis.call('HGET', x, ARGV[k])
  if entry then
    local seq = string.match(entry, '^%S+')
    local text = remove(seq)
    if keep and text then to_history(seq, text) end
    redis.call('HDEL', x, ARGV[k])
  end
end
if #ARGV > last_removed then append(last_removed + 1, token) end
finish(ttl)
return 'ok'
"""

# Returns the window's texts, their sequence numbers and the id index, read together: what
# update_messages plans from.
_WINDOW = """
return {redis.call('LRANGE', w, 0, -1), redis.call('LRANGE', s, 0, -1),
        redis.call('HGETALL', x)}
"""

# ARGV: keep_history, ttl, token, the window's sequence numbers as read (comma-separated),
# rewrite (0/1), the number of leaving messages, then sequence number, id ('' if none) of
# each, then id, message, ... of those to append. Carries out update_messages' plan, or
# returns 'changed' (changing nothing) if the window is no longer the one it was planned on.
_EXECUTE = """
local keep, ttl, token = ARGV[1] == '1', tonumber(ARGV[2]), ARGV[3]
if table.concat(redis.call('LRANGE', s, 0, -1), ',') ~= ARGV[4] then return 'changed' end
local last = 6 + 2 * tonumber(ARGV[6])
for k = 7, last, 2 do
  local seq, id = ARGV[k], ARGV[k + 1]
  local text = remove(seq)
  if keep and text then to_history(seq, text) end
  if id ~= '' then redis.call('HDEL', x, id) end
end
if ARGV[5] == '1' then redis.call('DEL', w, s, x) end
if #ARGV > last then append(last + 1, token) end
finish(ttl)
return 'ok'
"""

# ARGV: keep_history, ttl. Empties the window (into history with keep_history).
_DELETE = """
local keep, ttl = ARGV[1] == '1', tonumber(ARGV[2])
if keep then
  local texts = redis.call('LRANGE', w, 0, -1)
  local seqs = redis.call('LRANGE', s, 0, -1)
  for k = 1, #texts do to_history(seqs[k] or '?', texts[k]) end
end
redis.call('DEL', w, s, x)
finish(ttl)
return 'ok'
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

_Keys = tuple[str, str, str, str, str]

# Clients made from a URL send a command again after a connection error, up to 3 times
# within about 0.15 s (pauses drawn up to 20, 40, 80 ms): a write is recognised if it was
# applied before (its token), so a lost reply is harmless.
_RETRIES = 3
_BACKOFF = FullJitterBackoff(cap=1.0, base=0.01)


def _run(client: redis.Redis, script: _Script, keys: _Keys, args: Sequence[Any]) -> Any:
    try:
        return client.evalsha(script.sha, len(keys), *keys, *args)
    except NoScriptError:
        # A server that restarted, or that never saw the script: load it and go on.
        client.script_load(script.source)
        return client.evalsha(script.sha, len(keys), *keys, *args)


async def _arun(
    client: redis.asyncio.Redis, script: _Script, keys: _Keys, args: Sequence[Any]
) -> Any:
    try:
        return await client.evalsha(script.sha, len(keys), *keys, *args)
    except NoScriptError:
        await client.script_load(script.source)
        return await client.evalsha(script.sha, len(keys), *keys, *args)


class RedisChatMemoryStore:
    """Keeps conversations on a Redis server (6.0.6 or newer), shared by every process.

    ``url_or_client`` is a ``redis://`` (or ``rediss://``, ``unix://``) URL, or a
    ``redis.Redis`` client. From a URL the store makes a client for its sync methods and, in
    each event loop that calls its async methods, a ``redis.asyncio`` client. Given a client,
    async calls use ``async_client`` if given, else run the sync methods in a worker thread.
    Clients made from a URL are closed by :meth:`close` (or :meth:`aclose`); clients passed
    in are left open.

    ``key_prefix`` starts every key the store writes. ``ttl`` (seconds or a ``timedelta``)
    makes a conversation expire that long after its last write, history included. With
    ``keep_history=True``, messages leaving the window move to a history list instead of
    being deleted; :meth:`get_history` reads the whole transcript and :meth:`forget` erases
    it. Errors are redis-py's own (``redis.exceptions.ConnectionError``, ...), raised once the
    client's retries are spent (a client made from a URL retries a command 3 times within
    about 0.15 s). A write sent again after its reply was lost is applied once.
    """

    def __init__(
        self,
        url_or_client: str | redis.Redis,
        *,
        key_prefix: str = "aiservices:",
        ttl: float | timedelta | None = None,
        keep_history: bool = False,
        async_client: redis.asyncio.Redis | None = None,
        retention: timedelta | None = None,
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
        self._url: str | None = None
        if isinstance(url_or_client, str):
            self._url = url_or_client
            self._client = redis.Redis.from_url(url_or_client, retry=Retry(_BACKOFF, _RETRIES))
        elif isinstance(url_or_client, redis.asyncio.Redis):
            raise TypeError(
                "url_or_client must be a URL or a sync redis.Redis client; pass a "
                "redis.asyncio.Redis client as async_client=, next to a sync one"
            )
        elif callable(getattr(url_or_client, "evalsha", None)):
            self._client = url_or_client
        else:
            raise TypeError(
                "url_or_client must be a redis:// URL or a redis.Redis client, not "
                f"{type(url_or_client).__name__}"
            )
        self._async_client = async_client
        self._loop_clients: PerLoop[redis.asyncio.Redis] = PerLoop()
        self._cache = MessageCache()

    def __repr__(self) -> str:
        where = _redact(self._url) if self._url is not None else repr(self._client)
        return (
            f"{type(self).__name__}({where}, key_prefix={self.key_prefix!r}, ttl={self.ttl!r}, "
            f"keep_history={self.keep_history!r})"
        )

    def keys(self, memory_id: Hashable) -> _Keys:
        """The conversation's keys: window, sequence numbers, id index, counter, history."""
        tag = base64.urlsafe_b64encode(store_key(memory_id).encode("utf-8", "surrogatepass"))
        base = f"{self.key_prefix}{{{tag.rstrip(b'=').decode() or '='}}}:"
        return f"{base}w", f"{base}s", f"{base}x", f"{base}n", f"{base}h"

    def memory_ids(self) -> Iterator[Hashable]:
        """The ids of the conversations this store holds, each as it was given.

        Scans the server's keys under ``key_prefix`` (``SCAN``, a page at a time).
        """
        prefix = self.key_prefix
        pattern = "".join("\\" + c if c in "*?[]\\" else c for c in prefix) + "{*}:*"
        tags: dict[str, None] = {}
        for raw in self._client.scan_iter(match=pattern, count=1000):
            key = raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else raw
            tag = key[len(prefix) + 1 : key.rindex("}")]
            tags.setdefault(tag, None)
        for tag in tags:
            padded = "" if tag == "=" else tag + "=" * (-len(tag) % 4)
            yield memory_id_of(base64.urlsafe_b64decode(padded).decode("utf-8", "surrogatepass"))

    # -- the store protocol --------------------------------------------------------------

    def get_messages(self, memory_id: Hashable) -> list[ChatMessage]:
        """The messages in the window, oldest first; ``[]`` for an unknown id."""
        w = self.keys(memory_id)[0]
        return self._parse(memory_id, w, self._client.lrange(w, 0, -1))

    def get_messages_since(
        self, memory_id: Hashable, since: object = None
    ) -> tuple[list[ChatMessage], object]:
        """The window, and what to pass as ``since`` to the next read of it.

        Messages an earlier read returned (``since`` is what it returned beside them) are
        reused rather than parsed again: only those numbered after it are fetched whole.
        """
        keys = self.keys(memory_id)
        raw = _run(self._client, _SINCE_SCRIPT, keys, (_after(since),))
        read = window_since(*self._since_rows(memory_id, keys[0], raw, since))
        if read is None:
            raw = _run(self._client, _SINCE_SCRIPT, keys, (-1,))
            read = window_since(*self._since_rows(memory_id, keys[0], raw, None))
            assert read is not None  # every row has its text
        return read

    def apply_changes(
        self,
        memory_id: Hashable,
        *,
        appended: Sequence[ChatMessage],
        removed: Collection[str],
    ) -> None:
        """In one script, remove the messages whose id is in ``removed`` (moving them to
        history with ``keep_history``), then append ``appended`` after every stored message.

        Sent again after a lost reply (redis-py retries on connection errors), the same call
        is recognised and not applied twice.
        """
        keys, args, texts = self._apply_args(memory_id, appended, removed)
        result = _run(self._client, _APPLY_SCRIPT, keys, args)
        self._applied(memory_id, result, appended, texts)

    def update_messages(self, memory_id: Hashable, messages: Sequence[ChatMessage]) -> None:
        """Make the window equal to ``messages``, writing only the difference.

        Stored messages missing from ``messages`` are removed (to history with
        ``keep_history``) and new ones appended. If the messages kept would change order, or
        a new one goes before one kept, the window is written again.
        """
        keys, new, texts = self._update_args(memory_id, messages)
        for _ in range(_PLAN_TRIES):
            window = _run(self._client, _WINDOW_SCRIPT, keys, ())
            done = _run(self._client, _EXECUTE_SCRIPT, keys, self._plan(window, new, texts))
            if _text(done) == "ok":
                break
        else:
            raise _busy(memory_id)
        self._cache.remember(texts, new)

    def delete_messages(self, memory_id: Hashable) -> None:
        """Empty the window; with ``keep_history`` its messages stay in history, evicted."""
        _run(self._client, _DELETE_SCRIPT, self.keys(memory_id), self._flags())

    def get_history(self, memory_id: Hashable) -> list[HistoryEntry]:
        """Every message kept for ``memory_id``, in order: the history, then the window.

        Each entry's ``evicted_at`` says when it left the window (``None``: still in it).
        Without ``keep_history`` evicted messages are deleted, so only the window and any
        history written earlier by a store with ``keep_history`` remain.
        """
        w, s, _, _, h = keys = self.keys(memory_id)
        with self._client.pipeline(transaction=True) as pipe:
            for key in (h, s, w):
                pipe.lrange(key, 0, -1)
            raw = pipe.execute()
        return self._history(memory_id, keys, raw)

    def forget(self, memory_id: Hashable) -> None:
        """Erase the conversation's window and history."""
        self._client.delete(*self.keys(memory_id))

    # -- async twins ---------------------------------------------------------------------

    async def aget_messages(self, memory_id: Hashable) -> list[ChatMessage]:
        """:meth:`get_messages` for async callers."""
        client = self._aclient()
        if client is None:
            return await asyncio.to_thread(self.get_messages, memory_id)
        w = self.keys(memory_id)[0]
        return self._parse(memory_id, w, await client.lrange(w, 0, -1))

    async def aget_messages_since(
        self, memory_id: Hashable, since: object = None
    ) -> tuple[list[ChatMessage], object]:
        """:meth:`get_messages_since` for async callers."""
        client = self._aclient()
        if client is None:
            return await asyncio.to_thread(self.get_messages_since, memory_id, since)
        keys = self.keys(memory_id)
        raw = await _arun(client, _SINCE_SCRIPT, keys, (_after(since),))
        read = window_since(*self._since_rows(memory_id, keys[0], raw, since))
        if read is None:
            raw = await _arun(client, _SINCE_SCRIPT, keys, (-1,))
            read = window_since(*self._since_rows(memory_id, keys[0], raw, None))
            assert read is not None  # every row has its text
        return read

    async def aapply_changes(
        self,
        memory_id: Hashable,
        *,
        appended: Sequence[ChatMessage],
        removed: Collection[str],
    ) -> None:
        """:meth:`apply_changes` for async callers."""
        client = self._aclient()
        if client is None:
            return await asyncio.to_thread(
                self.apply_changes, memory_id, appended=appended, removed=removed
            )
        keys, args, texts = self._apply_args(memory_id, appended, removed)
        result = await _arun(client, _APPLY_SCRIPT, keys, args)
        self._applied(memory_id, result, appended, texts)
        return None

    async def aupdate_messages(self, memory_id: Hashable, messages: Sequence[ChatMessage]) -> None:
        """:meth:`update_messages` for async callers."""
        client = self._aclient()
        if client is None:
            return await asyncio.to_thread(self.update_messages, memory_id, messages)
        keys, new, texts = self._update_args(memory_id, messages)
        for _ in range(_PLAN_TRIES):
            window = await _arun(client, _WINDOW_SCRIPT, keys, ())
            done = await _arun(client, _EXECUTE_SCRIPT, keys, self._plan(window, new, texts))
            if _text(done) == "ok":
                break
        else:
            raise _busy(memory_id)
        self._cache.remember(texts, new)
        return None

    async def adelete_messages(self, memory_id: Hashable) -> None:
        """:meth:`delete_messages` for async callers."""
        client = self._aclient()
        if client is None:
            return await asyncio.to_thread(self.delete_messages, memory_id)
        await _arun(client, _DELETE_SCRIPT, self.keys(memory_id), self._flags())
        return None

    async def aget_history(self, memory_id: Hashable) -> list[HistoryEntry]:
        """:meth:`get_history` for async callers."""
        client = self._aclient()
        if client is None:
            return await asyncio.to_thread(self.get_history, memory_id)
        w, s, _, _, h = keys = self.keys(memory_id)
        async with client.pipeline(transaction=True) as pipe:
            for key in (h, s, w):
                pipe.lrange(key, 0, -1)
            raw = await pipe.execute()
        return self._history(memory_id, keys, raw)

    async def aforget(self, memory_id: Hashable) -> None:
        """:meth:`forget` for async callers."""
        client = self._aclient()
        if client is None:
            return await asyncio.to_thread(self.forget, memory_id)
        await client.delete(*self.keys(memory_id))
        return None

    # -- clients -------------------------------------------------------------------------

    def _aclient(self) -> redis.asyncio.Redis | None:
        if self._async_client is not None:
            return self._async_client
        if self._url is None:
            return None
        url = self._url
        # An asyncio connection belongs to the event loop that opened it: one client per loop.
        return self._loop_clients.get(
            lambda: redis.asyncio.Redis.from_url(
                url, retry=redis.asyncio.retry.Retry(_BACKOFF, _RETRIES)
            )
        )

    def close(self) -> None:
        """Close the clients this store made from its URL (not clients passed in).

        An async client is closed in its own event loop: at once if that loop is idle, soon
        if it is running; one whose loop has already closed can no longer be closed (call
        :meth:`aclose` in the loop before it ends).
        """
        for loop, client in self._loop_clients.pop_all():
            close_in_loop(loop, client.aclose)
        if self._url is not None:
            self._client.close()

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

    # -- what the sync and async paths share ----------------------------------------------

    def _flags(self) -> tuple[int, int]:
        return (1 if self.keep_history else 0), self._ttl_ms

    def _apply_args(
        self, memory_id: Hashable, appended: Sequence[ChatMessage], removed: Collection[str]
    ) -> tuple[_Keys, list[Any], list[str]]:
        new_ids = appended_ids(appended)
        texts = [message_to_json(m) for m in appended]
        # 96 random bits: one write's token is never taken for another's.
        args: list[Any] = [*self._flags(), secrets.token_urlsafe(12), len(removed), *removed]
        for mid, text in zip(new_ids, texts, strict=True):
            args += (mid, text)
        return self.keys(memory_id), args, texts

    def _applied(
        self,
        memory_id: Hashable,
        result: Any,
        appended: Sequence[ChatMessage],
        texts: list[str],
    ) -> None:
        if isinstance(result, list):
            raise duplicate_id_error(_text(result[1]), memory_id)
        self._cache.remember(texts, appended)

    def _update_args(
        self, memory_id: Hashable, messages: Sequence[ChatMessage]
    ) -> tuple[_Keys, list[ChatMessage], list[str]]:
        new = with_message_ids(messages)
        check_unique_ids(new)
        return self.keys(memory_id), new, [message_to_json(m) for m in new]

    def _plan(self, window: Any, new: list[ChatMessage], texts: list[str]) -> list[Any]:
        """The arguments of ``_EXECUTE`` for making ``window`` (as ``_WINDOW`` read it) the
        wanted messages."""
        raw_texts, raw_seqs, index = window
        seqs = [_text(seq) for seq in raw_seqs]
        id_of = {}
        for k in range(0, len(index), 2):
            id_of[_text(index[k + 1]).partition(" ")[0]] = _text(index[k])
        ids = [id_of.get(seq, "") for seq in seqs]
        stored = list(zip(ids, map(_text, raw_texts), strict=True))
        wanted = [(m.message_id, text) for m, text in zip(new, texts, strict=True)]
        plan = plan_update(stored, wanted)
        leaving = {*plan.removed, *plan.changed}
        args: list[Any] = [*self._flags(), secrets.token_urlsafe(12), ",".join(seqs)]
        gone = [(seq, mid) for seq, mid in zip(seqs, ids, strict=True) if mid in leaving]
        args += ("1" if plan.rewrite else "0", len(gone))
        for seq, mid in gone:
            args += (seq, mid)
        for m, text in zip(new[plan.fresh :], texts[plan.fresh :], strict=True):
            args += (m.message_id, text)
        return args

    def _since_rows(
        self, memory_id: Hashable, w: str, raw: Any, since: object
    ) -> tuple[list[tuple[int, object, object]], object, Callable[[list[int]], list[ChatMessage]]]:
        """The arguments of ``window_since`` for what ``_SINCE`` returned."""
        seqs, texts = raw
        first = len(seqs) - len(texts)
        rows: list[tuple[int, object, object]] = []
        for pos, seq in enumerate(seqs):
            number = _number(memory_id, _text(seq), f"{w[:-1]}s", pos)
            rows.append((number, number, texts[pos - first] if pos >= first else None))

        def parse(indexes: list[int]) -> list[ChatMessage]:
            picked = [rows[i][2] for i in indexes]
            decoded = [t.decode() if type(t) is bytes else t for t in picked]

            def corrupt(i: int, reason: str) -> Exception:
                return _corrupt(memory_id, w, indexes[i], reason)

            return self._cache.parse(decoded, corrupt)

        return rows, since, parse

    def _parse(self, memory_id: Hashable, w: str, raw: list[Any]) -> list[ChatMessage]:
        if not raw:
            return []
        texts = [t.decode() if type(t) is bytes else t for t in raw]

        def corrupt(i: int, reason: str) -> Exception:
            return _corrupt(memory_id, w, i, reason)

        return self._cache.parse(texts, corrupt)

    def _history(self, memory_id: Hashable, keys: _Keys, raw: list[Any]) -> list[HistoryEntry]:
        w, _, _, _, h = keys
        evicted, seqs, window = raw
        # (sequence number, message text, evicted_at, where: key and position)
        rows: list[tuple[int, str, datetime | None, tuple[str, int]]] = []
        for pos, item in enumerate(evicted):
            parts = _text(item).split(" ", 2)
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
        for pos, (seq, text) in enumerate(zip(seqs, window, strict=True)):
            rows.append((_number(memory_id, _text(seq), w, pos), _text(text), None, (w, pos)))
        rows.sort(key=lambda row: row[0])

        def corrupt(i: int, reason: str) -> Exception:
            return _corrupt(memory_id, *rows[i][3], reason)

        messages = self._cache.parse([row[1] for row in rows], corrupt)
        return [HistoryEntry(m, row[2]) for m, row in zip(messages, rows, strict=True)]


_PLAN_TRIES = 20  # writers changing the window between a plan and its execution


def _busy(memory_id: Hashable) -> RuntimeError:
    return RuntimeError(
        f"update_messages({memory_id!r}): other writers changed the conversation "
        f"{_PLAN_TRIES} times while it was being replaced; try again"
    )


def _after(since: object) -> int:
    return since.after if isinstance(since, WindowRead) else -1


def _ttl_ms(ttl: float | timedelta) -> int:
    seconds = ttl.total_seconds() if isinstance(ttl, timedelta) else ttl
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise TypeError(f"ttl must be seconds or a timedelta, not {type(ttl).__name__}")
    ms = round(seconds * 1000)
    if ms < 1:
        raise ValueError(f"ttl must be at least 1 ms, got {ttl!r}; use ttl=None for no expiry")
    return ms


def _redact(url: str) -> str:
    # A password in the URL never reaches a repr.
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest:
        rest = "***@" + rest.rpartition("@")[2]
    return repr(f"{scheme}{sep}{rest}")


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


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

"""MCP servers as toolsets: the tools of a Model Context Protocol server, offered to a service.

```python
from aiservices.mcp import McpToolset

with McpToolset.stdio("python", ["weather_server.py"]) as weather:
    bot = ai_service(Assistant, model=..., tools=[weather])
    bot.chat("Weather in Oslo?")

files = McpToolset.http("http://127.0.0.1:8000/mcp", headers={"Authorization": "Bearer ..."},
                        filter=lambda name: name.startswith("read_"))
```

The toolset connects when a service is built with it (listing the server's tools once)
and keeps one connection, run by an event loop of its own in a background thread: sync and
async service methods alike call tools through it, with no event loop started per call and
no deadlock inside a running loop; an async call awaits the answer, so cancelling it cancels
the request. A tool that fails on the server comes back to the model as text; a connection
that breaks fails the call in flight (the error goes back to the model too) and the next
call connects again, as does a call made after a server went away between calls. Close the
toolset with ``close()`` / ``aclose()`` or by using it as a context manager. Needs the MCP
SDK: ``pip install "aiservices[mcp]"``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, Self

try:
    from mcp import Client, MCPError, StdioServerParameters
    from mcp_types import CONNECTION_CLOSED, ToolListChangedNotification
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError('aiservices.mcp needs the MCP SDK: pip install "aiservices[mcp]"') from exc

from ._described import described
from .tools import Tool, valid_tool_name

__all__ = ["McpToolError", "McpToolset"]

_INVALID_NAME_CHARS = re.compile(r"[^A-Za-z0-9_-]")


class McpToolError(Exception):
    """An MCP server answered a tool call with an error; the message is its text."""


class McpToolset:
    """The tools of one MCP server, for ``tools=[...]``; make one with `stdio` or
    `http`."""

    def __init__(
        self,
        server: StdioServerParameters | str | Any,
        *,
        filter: Callable[[str], bool] | None = None,  # noqa: A002 - the name design.md gives
        timeout: float | None = 60.0,
        prefix: str = "",
        label: str | None = None,
    ) -> None:
        """``server`` is what ``mcp.Client`` connects to: stdio parameters, a URL, an
        in-process server, or a function that makes a transport (``lambda:
        sse_client(url)``: a transport serves one connection, and the toolset connects again
        when one ends).

        ``timeout`` bounds each listing and call in seconds (``None``: no bound); ``prefix``
        goes before each tool's name as the model sees it (``"weather_"``), so that two
        servers' tools of one name can serve one service.
        """
        if filter is not None and not callable(filter):
            raise TypeError(f"filter must be a callable name -> bool, not {filter!r}")
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0
        ):
            raise ValueError(
                f"timeout must be a positive number of seconds or None, not {timeout!r}"
            )
        if not isinstance(prefix, str) or (prefix and not valid_tool_name(prefix)):
            raise ValueError(
                f"prefix must be letters, digits, '_' or '-' (at most 64), not {prefix!r}"
            )
        self._prefix = prefix
        self._label = label or repr(server)
        if (
            callable(server)
            and not isinstance(server, type | _Fresh)
            and not hasattr(server, "__aenter__")  # (an asynccontextmanager's is callable)
        ):
            server = _Fresh(server)
        self._server = server
        self._filter = filter
        self._timeout = timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._connection: _Connection | None = None
        self._connecting: asyncio.Lock | None = None
        self._tools: list[Tool] | None = None
        self._connected_once = False
        self._closed = False

    @classmethod
    def stdio(
        cls,
        command: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        filter: Callable[[str], bool] | None = None,  # noqa: A002
        timeout: float | None = 60.0,
        prefix: str = "",
    ) -> McpToolset:
        """A server run as a subprocess, spoken to over its stdin and stdout.

        The server gets only the variables of ``env`` and a few safe ones of this process
        (``PATH``, ``HOME``, ...), as the MCP SDK sets it up: pass ``env={**os.environ, ...}``
        for it to see them all.
        """
        if isinstance(args, str | bytes) or not all(isinstance(a, str) for a in args):
            raise TypeError(
                f"args must be a list of strings, one per argument, not {args!r:.80}: "
                f"McpToolset.stdio({command!r}, ['server.py', '--flag'])"
            )
        parameters = StdioServerParameters(
            command=command, args=list(args), env=None if env is None else dict(env)
        )
        shown = f"{command!r}, {list(args)!r}" if args else repr(command)
        return cls(
            parameters,
            filter=filter,
            timeout=timeout,
            prefix=prefix,
            label=f"McpToolset.stdio({shown})",
        )

    @classmethod
    def http(
        cls,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        filter: Callable[[str], bool] | None = None,  # noqa: A002
        timeout: float | None = 60.0,
        prefix: str = "",
    ) -> McpToolset:
        """A server reached over streamable HTTP at ``url``."""
        server: Any = url
        if headers:
            from mcp.client.streamable_http import streamable_http_client
            from mcp.shared._httpx_utils import create_mcp_http_client

            given = dict(headers)

            @contextlib.asynccontextmanager
            async def transport() -> AsyncIterator[Any]:
                # A client handed to the transport is the caller's to close.
                async with (
                    create_mcp_http_client(given) as client,
                    streamable_http_client(url, http_client=client) as streams,
                ):
                    yield streams

            server = _Fresh(transport)
        return cls(
            server,
            filter=filter,
            timeout=timeout,
            prefix=prefix,
            label=f"McpToolset.http({url!r})",
        )

    def __repr__(self) -> str:
        return self._label

    # -- what a service asks of a toolset ----------------------------------------------------

    def aiservices_tools(self) -> list[Tool]:
        """The server's tools (those ``filter`` keeps) as ``Tool`` objects: listed at first
        use, and again once the server says its list changed or the toolset reconnects."""
        tools = self._tools
        if self._closed:
            raise RuntimeError(f"{self._label} is closed")
        if tools is None:
            kept = [spec for spec in self._run(self._list()) if self._keeps(spec.name)]
            tools = [self._tool(spec) for spec in kept]
            seen: dict[str, str] = {}
            for tool, spec in zip(tools, kept, strict=True):
                other = seen.setdefault(tool.name, spec.name)
                if other != spec.name:
                    raise ValueError(
                        f"{self._label}: the server's tools {other!r} and {spec.name!r} are "
                        f"both offered as {tool.name!r} (a tool name the providers accept is "
                        "letters, digits, '_' and '-', at most 64); leave one out with "
                        f"filter=lambda name: name != {spec.name!r}"
                    )
            self._tools = tools
        return list(tools)

    def _changed(self) -> None:
        """The server's tool list changed (or may have): list it again at the next use."""
        self._tools = None

    def _keeps(self, name: str) -> bool:
        return self._filter is None or bool(self._filter(name))

    def _tool(self, spec: Any) -> Tool:
        remote = spec.name
        name = self._prefix + remote
        if not valid_tool_name(name):
            name = _INVALID_NAME_CHARS.sub("_", name)[:64] or "tool"

        schema = dict(spec.input_schema or {})
        schema.setdefault("type", "object")
        if schema["type"] == "object":
            # No parameters may be listed as a bare {"type": "object"}, which OpenAI refuses.
            schema.setdefault("properties", {})
        try:
            return Tool(name, spec.description or "", schema, _Remote(self, remote))
        except (ValueError, TypeError) as exc:
            raise type(exc)(
                f"{self._label}: the server's tool {remote!r} can't be offered ({exc}); leave "
                f"it out with filter=lambda name: name != {remote!r}"
            ) from exc

    # -- the background loop -----------------------------------------------------------------

    def _run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        future = self._submit(coroutine)
        try:
            return future.result(self._timeout)
        except TimeoutError:
            if future.done():
                raise  # the call's own TimeoutError, not the wait's
            future.cancel()  # a server that never answers must not keep the call going
            raise self._timed_out() from None

    async def _arun(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        """`_run` awaited: cancelling the caller cancels the coroutine on the toolset's loop."""
        future = self._submit(coroutine)
        deadline = asyncio.timeout(self._timeout)
        try:
            async with deadline:
                return await asyncio.wrap_future(future)
        except TimeoutError:
            if not deadline.expired():
                raise  # the call's own TimeoutError, not the wait's
            raise self._timed_out() from None
        finally:
            future.cancel()  # the caller is cancelled or out of time: so is the request

    def _timed_out(self) -> TimeoutError:
        connection = self._connection
        if connection is None or connection.client is None:
            return TimeoutError(
                f"{self._label}: the MCP server did not answer within {self._timeout:g} s "
                "while connecting; check that it starts and speaks MCP, or raise timeout="
            )
        return TimeoutError(
            f"{self._label}: the MCP server did not answer within {self._timeout:g} s"
        )

    def _submit(self, coroutine: Coroutine[Any, Any, Any]) -> Future[Any]:
        if self._closed:
            coroutine.close()
            raise RuntimeError(f"{self._label} is closed")
        return asyncio.run_coroutine_threadsafe(coroutine, self._start())

    def _start(self) -> asyncio.AbstractEventLoop:
        with self._start_lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="aiservices-mcp", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    async def _current(self) -> _Connection:
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            connection = self._connection
            if connection is None or not connection.alive:
                if connection is not None:
                    await connection.close()  # its server went away while it was idle
                if self._connected_once and not _reusable(self._server):
                    raise ConnectionError(
                        f"{self!r}: the connection to the MCP server ended, and a transport "
                        "serves one connection; pass a function that makes the transport "
                        "(McpToolset(lambda: sse_client(url))) so that the toolset can "
                        "connect again"
                    )
                connection = self._connection = _Connection(self._server, self._changed)
                try:
                    await connection.open()
                except BaseException as error:
                    self._connection = None
                    await connection.close()
                    if isinstance(error, ExceptionGroup):
                        # The client's task groups wrap what happened: say it plainly.
                        hint = (
                            " (a stdio server must write nothing else to stdout)"
                            if isinstance(self._server, StdioServerParameters)
                            else ""
                        )
                        raise ConnectionError(
                            f"{self!r}: the MCP server could not be reached: "
                            f"{described(error)}; check that it starts and speaks MCP{hint}"
                        ) from error
                    raise
                if self._connected_once:
                    self._changed()  # a server started again may offer other tools
                self._connected_once = True
            return connection

    async def _client(self) -> Any:
        return (await self._current()).client

    async def _drop(self, broken: _Connection | None = None) -> None:
        """Close the connection (``broken``: only if it is still the current one)."""
        connection = self._connection
        if connection is None or (broken is not None and connection is not broken):
            return
        self._connection = None
        await connection.close()

    async def _list(self) -> list[Any]:
        client = await self._client()
        tools: list[Any] = []
        cursor: str | None = None
        while True:
            page = await client.list_tools(cursor=cursor)
            tools += page.tools
            cursor = page.next_cursor
            if not cursor:
                return tools

    async def _call(self, name: str, arguments: dict[str, Any]) -> Any:
        connection = await self._current()
        try:
            result = await connection.client.call_tool(name, arguments)
        except MCPError as error:
            if error.code != CONNECTION_CLOSED:
                raise  # the server's answer to this call: the connection is fine
            await self._drop(connection)
            raise
        except (RuntimeError, ValueError, TypeError):
            # The client refused this call's result (structured content that doesn't meet
            # the tool's output schema, say): the connection and the calls beside it are fine.
            raise
        except Exception:
            # The connection failed (the server died, the stream closed): the next call
            # connects again; calls on a newer connection are left alone.
            await self._drop(connection)
            raise
        texts = [_described(block) for block in result.content]
        if result.is_error:
            if not texts and result.structured_content is not None:
                texts = [json.dumps(result.structured_content)]
            raise McpToolError("\n".join(texts) or f"the MCP tool {name!r} failed")
        if texts:
            return "\n".join(texts)
        if result.structured_content is not None:
            return json.dumps(result.structured_content)
        return ""

    # -- closing -------------------------------------------------------------------------------

    def close(self) -> None:
        """Disconnect from the server and stop the background loop."""
        if self._closed:
            return
        self._closed = True
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._drop(), loop).result(self._timeout)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(self._timeout)
            if not thread.is_alive():
                loop.close()

    async def aclose(self) -> None:
        """`close` without blocking the event loop."""
        await asyncio.to_thread(self.close)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class _Remote:
    """A server's tool as a ``Tool``'s function: called, it waits for the server's answer;
    async service calls await ``_aiservices_acall`` instead, so that cancelling them cancels
    the request."""

    __slots__ = ("_name", "_toolset")

    def __init__(self, toolset: McpToolset, name: str) -> None:
        self._toolset = toolset
        self._name = name

    # (Positional-only self: a tool may have a parameter named "self".)
    def __call__(self, /, **arguments: Any) -> Any:
        return self._toolset._run(self._toolset._call(self._name, arguments))

    async def _aiservices_acall(self, /, **arguments: Any) -> Any:
        return await self._toolset._arun(self._toolset._call(self._name, arguments))

    def __repr__(self) -> str:
        return f"<{self._name!r} of {self._toolset!r}>"


class _Fresh:
    """A transport made anew for each connection (a transport serves one connection)."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make = make


def _reusable(server: Any) -> bool:
    """Whether ``mcp.Client`` can connect to ``server`` more than once (not a transport)."""
    return isinstance(server, str | StdioServerParameters | _Fresh) or not hasattr(
        server, "__aenter__"
    )


class _Connection:
    """One ``mcp.Client`` connection, held open by a task of the background loop.

    The SDK's client must be entered and left in one task, so a holder task enters it,
    waits until asked to close, and leaves it.
    """

    def __init__(self, server: Any, changed: Callable[[], None]) -> None:
        self.server = server
        self.changed = changed  # called when the server says its tool list changed
        self.client: Any = None
        self._ready: asyncio.Future[None] | None = None
        self._closing: asyncio.Event | None = None
        self._holder: asyncio.Task[None] | None = None

    @property
    def alive(self) -> bool:
        """Whether a request sent now would reach the server: held open, not hung up on."""
        return self._holder is not None and not self._holder.done() and not _hung_up(self.client)

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        self._closing = asyncio.Event()
        self._holder = loop.create_task(self._hold())
        await self._ready

    async def _hold(self) -> None:
        assert self._ready is not None
        assert self._closing is not None
        server = self.server.make() if isinstance(self.server, _Fresh) else self.server
        listening: asyncio.Task[None] | None = None
        try:
            async with Client(server, message_handler=self._notified) as client:
                self.client = client
                self._ready.set_result(None)
                listening = asyncio.get_running_loop().create_task(self._listen(client))
                try:
                    await self._closing.wait()
                finally:
                    listening.cancel()
                    await asyncio.gather(listening, return_exceptions=True)
        except BaseException as error:
            if not self._ready.done():
                self._ready.set_exception(error)
            elif not isinstance(error, Exception):
                raise
        finally:
            self.client = None

    async def _notified(self, message: Any) -> None:
        # Servers of protocols before 2026-07-28 send notifications/tools/list_changed.
        if isinstance(message, ToolListChangedNotification):
            self.changed()

    async def _listen(self, client: Any) -> None:
        """Hear of changes to the tool list on a server of the 2026-07-28 protocol on."""
        try:
            async with client.listen(tools_list_changed=True) as events:
                async for _ in events:
                    self.changed()
        except Exception:  # an older server: its notifications come to _notified
            pass

    async def close(self) -> None:
        if self._closing is not None:
            self._closing.set()
        holder = self._holder
        if holder is not None:
            if self.client is None:
                holder.cancel()  # still connecting (a server that never answers)
            await asyncio.gather(holder, return_exceptions=True)


def _hung_up(client: Any) -> bool:
    """Whether ``client``'s connection has ended on the server's side (a stdio server that
    exited, say)."""
    # The SDK tells a request sent on such a connection only by failing it with the error of a
    # request the server may have run (MCPError CONNECTION_CLOSED), so its dispatcher's own
    # flag is read; an SDK without it leaves the failure to that request, as a call in flight.
    try:
        dispatcher = client.session._dispatcher
    except (AttributeError, RuntimeError):  # no client, or one not entered
        return False
    return getattr(dispatcher, "_closed", False) is True


def _described(block: Any) -> str:
    """A result's content block as text for the model: what it holds when that is text,
    else what it is (a tool result reaches the model as text only)."""
    kind = getattr(block, "type", "")
    if kind == "text":
        return str(block.text)
    if kind in ("image", "audio"):
        return f"[{kind}: {getattr(block, 'mime_type', None) or 'unknown type'}]"
    if kind == "resource":
        resource = block.resource
        text = getattr(resource, "text", None)
        if isinstance(text, str):
            return text
        mime = getattr(resource, "mime_type", None) or "binary"
        return f"[resource {resource.uri}: {mime}]"
    if kind == "resource_link":
        about = getattr(block, "description", None)
        name = getattr(block, "title", None) or block.name
        return f"[resource link: {name} {block.uri}]" + (f" {about}" if about else "")
    return f"[{kind or type(block).__name__} content]"

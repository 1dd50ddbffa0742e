"""What the adapters on provider SDKs share: client lifetimes, connection options, checks.

Nothing here imports an SDK: each adapter module imports its own and hands its client
classes in, so this module stays importable without either installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import re
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Final, Generic, Protocol, Self, TypeVar

from .._per_loop import PerLoop, close_in_loop
from ._base import check_sampling

__all__ = [
    "LazyClient",
    "SdkChatModel",
    "Secret",
    "followed_client",
    "cached",
    "cached_each",
    "check_choice",
    "check_clients",
    "check_model_name",
    "check_sampling",
    "check_transport",
    "client_options",
    "create_keywords",
    "merge_extra",
    "plain",
    "transport_errors_as",
]

_CACHE_LIMIT: Final = 512
"""How many converted tools or schemas a model keeps before it starts its cache afresh."""


class _SyncClient(Protocol):
    def close(self) -> None: ...


class _AsyncClient(Protocol):
    async def close(self) -> None: ...


SyncT = TypeVar("SyncT", bound=_SyncClient)
AsyncT = TypeVar("AsyncT", bound=_AsyncClient)
K = TypeVar("K")
V = TypeVar("V")


class Secret:
    """Holds a key so that no repr, log line or traceback of ours shows it."""

    __slots__ = ("value",)

    def __init__(self, value: str) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "'**********'"


class LazyClient(Generic[SyncT]):
    """Owns a sync SDK client made on first use; one handed in is used but never closed."""

    def __init__(self, client: SyncT | None, options: dict[str, Any]) -> None:
        self._client = client
        self._owns_client = client is None
        self._client_options = options  # the key in it stays wrapped in a Secret
        self._lock = threading.Lock()

    def _new_client(self) -> SyncT:
        """A new sync SDK client, made from `_connection_options`."""
        raise NotImplementedError

    def _sync_client(self) -> SyncT:
        client = self._client
        if client is None:
            with self._lock:
                client = self._client
                if client is None:
                    client = self._client = self._new_client()
        return client

    def _connection_options(self) -> dict[str, Any]:
        options = dict(self._client_options)
        for name, value in options.items():
            if isinstance(value, Secret):
                options[name] = value.value
        return options

    def _close_client(self) -> None:
        client = self._client
        if client is not None and self._owns_client:
            self._client = None
            client.close()


class SdkChatModel(LazyClient[SyncT], Generic[SyncT, AsyncT]):
    """A chat model's SDK clients: a lazy sync one and one async one per event loop."""

    model_name: str

    def __init__(
        self,
        sdk: tuple[Callable[..., SyncT], Callable[..., AsyncT]],
        client: SyncT | None,
        async_client: AsyncT | None,
        *,
        base_url: str | None,
        options: dict[str, Any],
        http_client: Any,
        async_http_client: Any,
    ) -> None:
        super().__init__(client, options)
        if http_client is not None:
            # Closing an SDK client closes its HTTP client: one handed in is the caller's.
            self._owns_client = False
        self._sdk = sdk
        self._base_url = base_url
        self._http_client = http_client
        self._async_http_client = async_http_client
        self._given_async_client = async_client
        # Each closed in its own loop when asyncio.run() ends that loop: left to the garbage
        # collector, the SDK would schedule its closing in whichever loop runs then. Those
        # made around an HTTP client handed in are never closed: that would close it.
        self._closes_async = async_http_client is None
        self._http_loop: weakref.ref[asyncio.AbstractEventLoop] | None = None
        self._async_clients: PerLoop[AsyncT] = PerLoop(
            aclose=_aclose if self._closes_async else None
        )

    def __repr__(self) -> str:
        # Also for an object whose __init__ raised: a traceback that shows locals calls this.
        base_url = getattr(self, "_base_url", None)
        where = f", base_url={_redact_url(base_url)!r}" if base_url else ""
        return f"{type(self).__name__}(model={getattr(self, 'model_name', None)!r}{where})"

    def _new_client(self) -> SyncT:
        return self._sdk[0](**self._connection_options(), http_client=self._http_client)

    def _async_client(self) -> AsyncT:
        if self._given_async_client is not None:
            return self._given_async_client
        if not self._closes_async:
            self._check_http_loop()
        # One client per event loop: an async connection pool cannot outlive the loop it was
        # made in, and users do call asyncio.run() more than once.
        return self._async_clients.get(
            lambda: self._sdk[1](**self._connection_options(), http_client=self._async_http_client)
        )

    def _check_http_loop(self) -> None:
        """Refuse a second event loop for the async HTTP client handed in: its connections
        belong to the loop it was first used in, and would fail obscurely in another."""
        loop = asyncio.get_running_loop()
        if self._http_loop is None:
            self._http_loop = weakref.ref(loop)
        elif self._http_loop() is not loop:  # (None once that loop is gone)
            raise RuntimeError(
                f"{type(self).__name__} was given async_http_client=, which was first used "
                "in another event loop (an earlier asyncio.run(), or another thread's loop): "
                "an async HTTP client's connections belong to one loop. Give the adapter no "
                "async_http_client (it then makes one client per loop), or make a new "
                "adapter, with a new HTTP client, for each loop"
            )

    def close(self) -> None:
        """Close the SDK clients this model made (those handed in are left open, and so are
        the HTTP clients handed in).

        An async client is closed in its own event loop: at once if that loop is idle, soon
        if it is running; one whose loop has already closed was closed when asyncio.run()
        ended that loop, or can no longer be.
        """
        self._close_client()
        for loop, client in self._async_clients.pop_all():
            if self._closes_async:
                close_in_loop(loop, client.close)

    async def aclose(self) -> None:
        """Close the SDK clients this model made, this event loop's async one awaited."""
        client = self._async_clients.pop()
        if client is not None and self._closes_async:
            await client.close()
        # In a thread: closing another loop's client may run that loop, which this thread,
        # running this one, cannot.
        await asyncio.to_thread(self.close)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


async def _aclose(client: _AsyncClient) -> None:
    await client.close()


def _redact_url(url: str) -> str:
    # A base URL may carry credentials (https://user:secret@host/v1), and a gateway's key
    # may be in its query (?api-key=..., ?sig=...) or even its fragment: every query value
    # and the fragment are masked, as a secret cannot be told by its name.
    url, hash_mark, fragment = url.partition("#")
    url = re.sub(r"//[^/@?]*@", "//***@", url)
    head, mark, query = url.partition("?")
    if mark:
        items = [
            f"{name}=***" if equals else ("***" if name else "")
            for name, equals, _ in (item.partition("=") for item in query.split("&"))
        ]
        head = f"{head}?{'&'.join(items)}"
    return f"{head}{hash_mark}{'***' if fragment else ''}"


def sdk_missing(exc: ModuleNotFoundError, sdk: str) -> ModuleNotFoundError:
    """The error for an adapter imported without its SDK: one that names the extra to
    install, or ``exc`` itself when another module is missing."""
    if exc.name is None or exc.name.partition(".")[0] != sdk:
        return exc
    return ModuleNotFoundError(
        f'aiservices.models.{sdk} needs the {sdk} SDK: pip install "aiservices[{sdk}]"',
        name=sdk,
    )


@contextlib.contextmanager
def transport_errors_as(
    timeout_error: Callable[..., Exception],
    connection_error: Callable[..., Exception],
    response: Any,
) -> Iterator[None]:
    """Raise an ``httpx`` / ``httpx2`` transport failure in the block as the SDK's own
    ``timeout_error`` / ``connection_error`` (for the request of ``response``), and a
    streamed event that is not JSON as a ``ValueError`` that shows it."""
    # A stream's body is read after the SDK's create() returned: a connection dropped or
    # stalled midway would escape as the HTTP library's error, where one before the stream
    # started is the SDK's (and the openai SDK translates it itself). The SDKs parse each
    # event with json.loads, whose error names neither the server nor what it sent (a
    # proxy's HTML error page, say).
    try:
        yield
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"the server streamed an event that is not JSON: {exc.doc[:200]!r}"
        ) from exc
    except Exception as exc:
        kind = _transport_failure(exc)
        if kind is None:
            raise
        error = timeout_error if kind == "timeout" else connection_error
        raise error(request=response.request) from exc


def _transport_failure(exc: Exception) -> str | None:
    # Only a module already loaded can have raised its error; the SDK may be on either.
    for name in ("httpx2", "httpx"):
        module = sys.modules.get(name)
        if module is not None:
            if isinstance(exc, module.TimeoutException):
                return "timeout"
            if isinstance(exc, module.RequestError):
                return "connection"
    return None


# -- constructor checks ----------------------------------------------------------------------


def check_model_name(model: object, example: str) -> None:
    """Reject a model name that is not a non-empty string."""
    if not isinstance(model, str) or not model.strip():
        raise ValueError(f"model must be a non-empty model name such as {example!r}, not {model!r}")


def check_transport(max_retries: int | None, timeout: object) -> None:
    """Reject a negative ``max_retries`` or a numeric ``timeout`` that is not positive."""
    if max_retries is not None and not (
        isinstance(max_retries, int) and not isinstance(max_retries, bool) and max_retries >= 0
    ):
        raise ValueError(f"max_retries must be an int >= 0, not {max_retries!r}")
    if isinstance(timeout, int | float) and not isinstance(timeout, bool) and timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")


def check_http_package(sdk_client: type, objects: Mapping[str, object]) -> None:
    """Reject ``httpx`` objects for an SDK built on ``httpx2`` (``sdk_client``: its default
    HTTP client class), which refuses them only at its first request."""
    if _package(sdk_client) != "httpx2":
        return
    for name, value in objects.items():
        if value is not None and _package(type(value)) == "httpx":
            kind = type(value).__name__
            raise TypeError(
                f"{name} is an httpx.{kind}, but the installed "
                f"{sdk_client.__module__.partition('.')[0]} SDK is built on httpx2: pass an "
                f"httpx2.{kind}"
            )


def _package(cls: type) -> str:
    # The top package of the first class in the MRO that comes from httpx or httpx2.
    for klass in cls.__mro__:
        root = str(getattr(klass, "__module__", "")).partition(".")[0]
        if root in ("httpx", "httpx2"):
            return root
    return str(cls.__module__).partition(".")[0]


def check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    """Reject an option value that is not one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, not {value!r}")


def check_clients(
    sdk: tuple[type, type],
    client: object,
    async_client: object,
    connection: Mapping[str, object],
) -> None:
    """Reject handed-in clients of the wrong SDK class, and connection settings that could
    reach only one of the two paths, or neither."""
    for name, value, kind in (("client", client, sdk[0]), ("async_client", async_client, sdk[1])):
        if value is not None and not isinstance(value, kind):
            # Named as users import it: openai.OpenAI, not openai._client.OpenAI.
            package = kind.__module__.partition(".")[0]
            raise TypeError(
                f"{name} must be an {package}.{kind.__name__}, not {type(value).__name__}"
            )
    if client is not None and async_client is not None:
        unused = [name for name, value in connection.items() if value is not None]
        if unused:
            raise ValueError(
                f"{', '.join(unused)} would go unused: client= and async_client= are "
                "both given, so set these on those clients instead"
            )
    elif client is not None or async_client is not None:
        # The client made for the other path follows the one given, so an option could only
        # reach the client made: sync and async calls would differ (another server, say).
        given, other = ("client", "async") if client is not None else ("async_client", "sync")
        own = "async_http_client" if client is not None else "http_client"
        one_sided = [
            name for name, value in connection.items() if value is not None and name != own
        ]
        if one_sided:
            raise ValueError(
                f"{', '.join(one_sided)} cannot be given with {given}=: the {other} client "
                f"made beside it takes its settings from it, so set these on the client you "
                f"pass instead"
            )


def client_options(
    api_key: str | None,
    client: object = None,
    *,
    default_headers: Mapping[str, str] | None = None,
    **settings: object,
) -> dict[str, Any]:
    """Keyword arguments for the SDK clients a model makes, the key wrapped in a `Secret`.

    A setting left ``None`` is taken from the handed-in ``client`` (sync or async), if any,
    the headers and query it was made with included, so the clients made beside it talk to
    the same server the same way.
    """
    options: dict[str, Any] = {} if api_key is None else {"api_key": Secret(api_key)}
    for name, given in settings.items():
        value = getattr(client, name, None) if given is None and client is not None else given
        if value is not None:
            options[name] = value
    if default_headers is None and client is not None:
        # The headers it was made with, without those the SDK adds (auth, platform): the
        # SDK keeps them apart, under this name, in both SDKs.
        custom = getattr(client, "_custom_headers", None)
        if isinstance(custom, Mapping) and custom:
            default_headers = dict(custom)
    if default_headers is not None:
        options["default_headers"] = default_headers
    query = getattr(client, "_custom_query", None) if client is not None else None
    if isinstance(query, Mapping) and query:
        # The query it was made with (a tenant, Azure's api-version): kept apart in both SDKs.
        options["default_query"] = dict(query)
    return options


def followed_client(client: object, async_client: object) -> Any:
    """The handed-in client whose settings the clients a model makes follow: the sync one,
    else the async one."""
    return client if client is not None else async_client


# -- request mapping -------------------------------------------------------------------------


def create_keywords(create: Callable[..., object]) -> frozenset[str]:
    """The keyword arguments an SDK's ``create()`` method takes."""
    return frozenset(inspect.signature(create).parameters) - {"self"}


def merge_extra(kwargs: dict[str, Any], extra: Mapping[str, Any], keywords: frozenset[str]) -> None:
    """Merge ``extra`` into ``kwargs``: ``keywords`` as they are, other keys into ``extra_body``.

    The ``extra_body`` already in ``kwargs`` is copied, never changed: it may be shared.
    """
    body: dict[str, Any] | None = None
    for key, value in extra.items():
        if key == "extra_body":
            body = {**(body or kwargs.get("extra_body") or {}), **value}
        elif key in keywords:
            kwargs[key] = value
        else:
            if body is None:
                body = dict(kwargs.get("extra_body") or {})
            body[key] = value
    if body is not None:
        kwargs["extra_body"] = body


def cached(cache: dict[int, tuple[K, V]], key: K, convert: Callable[[K], V]) -> V:
    """``convert(key)``, worked out once per ``key`` object while it stays in ``cache``."""
    # Services hand the same specification objects on every call: convert each once.
    hit = cache.get(id(key))
    if hit is not None and hit[0] is key:
        return hit[1]
    return _convert(cache, key, convert)


def cached_each(
    cache: dict[int, tuple[K, V]], keys: Iterable[K], convert: Callable[[K], V]
) -> list[V]:
    """`cached` for each of ``keys``, in order."""
    # The hit test is inlined: this runs for every tool of every request.
    out: list[V] = []
    append = out.append
    for key in keys:
        hit = cache.get(id(key))
        append(hit[1] if hit is not None and hit[0] is key else _convert(cache, key, convert))
    return out


def _convert(cache: dict[int, tuple[K, V]], key: K, convert: Callable[[K], V]) -> V:
    value = convert(key)
    if len(cache) >= _CACHE_LIMIT:
        cache.clear()
    cache[id(key)] = (key, value)
    return value


def plain(value: Any) -> Any:
    """``value`` with every mapping made a dict and every list or tuple a list, recursively."""
    # Schemas may arrive as read-only mappings; the SDKs serialise plain dicts and lists.
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value

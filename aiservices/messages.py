"""Chat messages: immutable pydantic models and their JSON form.

Every message may carry recording metadata: ``message_id``, ``turn_id`` and ``created_at``.
A service sets them when it records a turn; a memory sets a ``message_id`` on messages
added without one. Equality and hashing compare content only (the type and the content
fields), so ``memory.messages() == [UserMessage("hi")]`` holds for recorded messages too;
the JSON form keeps the metadata: reading it back gives a message equal in every field.

The JSON form is canonical: messages equal with equal metadata give the same text, however
they were built. Fields come in the order the class declares them, those that are ``None``
are left out, and an aware ``created_at`` is written in UTC with a ``Z`` (the same instant,
read back in UTC; a naive one is written as it is). Stores rely on it: they tell what
changed by comparing texts. Text in any key order or offset, as earlier versions wrote it,
still reads.
"""

from __future__ import annotations

import functools
import itertools
import os
import re
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Final, Literal, Self, TypeAlias, TypeVar

from pydantic import BaseModel, ConfigDict, Field, Json, TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError

__all__ = [
    "AiMessage",
    "Reasoning",
    "ChatMessage",
    "SystemMessage",
    "ToolExecutionRequest",
    "ToolExecutionResultMessage",
    "UserMessage",
    "FORMAT_VERSION",
    "message_from_json",
    "message_to_json",
    "messages_from_json",
    "new_message_id",
    "messages_to_json",
]

FORMAT_VERSION: Final = 1
"""Version of the JSON form written by ``messages_to_json`` and ``message_to_json``."""


_F = TypeVar("_F", bound=Callable[..., None])


def _positional_init(init: _F) -> _F:
    # Marks a positional-friendly __init__ as pydantic's own, so validation (JSON, nested
    # models) builds instances directly instead of calling it with raw keyword data.
    init.__pydantic_base_init__ = True  # type: ignore[attr-defined]
    return init


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, defer_build=True)


class ToolExecutionRequest(_Frozen):
    """A tool call the model asked for; ``arguments`` is a JSON string."""

    id: str
    name: str
    arguments: str = "{}"

    @_positional_init
    def __init__(self, id: str, name: str, arguments: str = "{}") -> None:  # noqa: A002
        BaseModel.__init__(self, id=id, name=name, arguments=arguments)


class _Message(_Frozen):
    _content: ClassVar[tuple[str, ...]] = ()
    _all_fields: ClassVar[set[str]] = set()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls._all_fields = _SharedFields(cls.model_fields)

    type: str = Field(repr=False)
    message_id: str | None = Field(default=None, repr=False)
    turn_id: str | None = Field(default=None, repr=False)
    created_at: datetime | None = Field(default=None, repr=False)

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        d, o = self.__dict__, other.__dict__
        return all(d[f] == o[f] for f in self._content)

    def __hash__(self) -> int:
        d = self.__dict__
        return hash((type(self), *(_hashable(d[f]) for f in self._content)))

    def with_metadata(
        self,
        *,
        message_id: str | None = None,
        turn_id: str | None = None,
        created_at: datetime | None = None,
    ) -> Self:
        """A copy with the given recording metadata; ``None`` keeps the current value."""
        values = dict(self.__dict__)
        if message_id is not None:
            values["message_id"] = _checked_id("message_id", message_id)
        if turn_id is not None:
            values["turn_id"] = _checked_id("turn_id", turn_id)
        if created_at is not None:
            if not isinstance(created_at, datetime):
                raise TypeError(f"created_at must be a datetime, not {type(created_at).__name__}")
            values["created_at"] = created_at
        return unchecked_message(type(self), values)

    # pydantic's copies share the fields set, which recorded messages keep frozen and shared
    # by class: a copy that model_copy(update=...) may change gets a set of its own.
    def __copy__(self) -> Self:
        copied = super().__copy__()
        _set_fields(copied, set(self.__pydantic_fields_set__))
        return copied

    def __deepcopy__(self, memo: dict[int, Any] | None = None) -> Self:
        copied = super().__deepcopy__(memo)
        _set_fields(copied, set(self.__pydantic_fields_set__))
        return copied


class _SharedFields(set[str]):
    """The fields set every recorded message of a class shares: a set, as pydantic needs,
    that refuses changes (a copy gets a set of its own)."""

    __slots__ = ()

    def _refuse(self, *args: object, **kwargs: object) -> Any:
        raise TypeError("this fields set is shared by recorded messages; change a copy")

    add = discard = remove = pop = clear = update = _refuse
    intersection_update = difference_update = symmetric_difference_update = _refuse
    __ior__ = __iand__ = __isub__ = __ixor__ = _refuse


_Msg = TypeVar("_Msg", bound=_Message)
_new = object.__new__
# pydantic keeps instance state in slots; their descriptors set it past the frozen check.
_set_dict = object.__setattr__
_set_fields = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__


def unchecked_message(cls: type[_Msg], values: dict[str, object]) -> _Msg:
    """A message of ``cls`` made from ``values`` known valid, without validation.

    For the framework's hot paths: ``values`` names every field and becomes the message's
    ``__dict__`` as it is. The message shares its class's read-only fields set (a set of
    its own would cost about 470 bytes per message).
    """
    instance = _new(cls)
    _set_dict(instance, "__dict__", values)
    _set_fields(instance, cls._all_fields)
    _set_extra(instance, None)
    _set_private(instance, None)
    return instance


def _hashable(value: object) -> object:
    return tuple(value) if isinstance(value, list) else value


class SystemMessage(_Message):
    """Instructions for the model; a memory keeps at most one."""

    _content = ("text",)
    type: Literal["system"] = Field(default="system", repr=False)
    text: str

    @_positional_init
    def __init__(
        self,
        text: str,
        *,
        message_id: str | None = None,
        turn_id: str | None = None,
        created_at: datetime | None = None,
    ) -> None:
        BaseModel.__init__(
            self, text=text, message_id=message_id, turn_id=turn_id, created_at=created_at
        )


class UserMessage(_Message):
    """What the user said; ``name`` identifies the speaker to the model."""

    _content = ("text", "name")
    type: Literal["user"] = Field(default="user", repr=False)
    text: str
    name: str | None = None

    @_positional_init
    def __init__(
        self,
        text: str,
        name: str | None = None,
        *,
        message_id: str | None = None,
        turn_id: str | None = None,
        created_at: datetime | None = None,
    ) -> None:
        BaseModel.__init__(
            self,
            text=text,
            name=name,
            message_id=message_id,
            turn_id=turn_id,
            created_at=created_at,
        )


class Reasoning(_Frozen):
    """A reasoning block the provider returned with an answer (Anthropic's thinking).

    Kept with the answer so that the next request can send it back, as the provider
    requires when thinking and tools meet: ``text`` and ``signature`` for a thinking block,
    ``redacted`` for a redacted one (its encrypted data).
    """

    text: str = ""
    signature: str | None = None
    redacted: str | None = None


class AiMessage(_Message):
    """The model's answer: text, tool requests, or both.

    ``reasoning`` holds the provider's reasoning blocks, when it returned any; equality
    ignores them, as it ignores ids and times.
    """

    _content = ("text", "tool_execution_requests")
    type: Literal["ai"] = Field(default="ai", repr=False)
    text: str | None = None
    tool_execution_requests: list[ToolExecutionRequest] = Field(default_factory=list)
    reasoning: list[Reasoning] | None = Field(default=None, repr=False)

    @_positional_init
    def __init__(
        self,
        text: str | None = None,
        tool_execution_requests: Sequence[ToolExecutionRequest] = (),
        *,
        reasoning: Sequence[Reasoning] | None = None,
        message_id: str | None = None,
        turn_id: str | None = None,
        created_at: datetime | None = None,
    ) -> None:
        BaseModel.__init__(
            self,
            text=text,
            tool_execution_requests=list(tool_execution_requests),
            reasoning=None if reasoning is None else list(reasoning),
            message_id=message_id,
            turn_id=turn_id,
            created_at=created_at,
        )

    @property
    def has_tool_execution_requests(self) -> bool:
        """Whether the model asked for at least one tool."""
        return bool(self.tool_execution_requests)


class ToolExecutionResultMessage(_Message):
    """A tool's result; ``id`` is the id of the request it answers.

    ``is_error`` is ``True`` when ``text`` tells of a failure (the tool raised, its arguments
    did not validate, it does not exist); providers that can mark it (Anthropic) do.
    """

    _content = ("id", "tool_name", "text")
    type: Literal["tool_result"] = Field(default="tool_result", repr=False)
    id: str
    tool_name: str
    text: str
    is_error: bool | None = Field(default=None, repr=False)

    @_positional_init
    def __init__(
        self,
        id: str,  # noqa: A002
        tool_name: str,
        text: str,
        *,
        is_error: bool | None = None,
        message_id: str | None = None,
        turn_id: str | None = None,
        created_at: datetime | None = None,
    ) -> None:
        BaseModel.__init__(
            self,
            id=id,
            tool_name=tool_name,
            text=text,
            is_error=is_error,
            message_id=message_id,
            turn_id=turn_id,
            created_at=created_at,
        )


ChatMessage: TypeAlias = SystemMessage | UserMessage | AiMessage | ToolExecutionResultMessage
"""Any message a memory holds."""

_Tagged = Annotated[ChatMessage, Field(discriminator="type")]


@functools.cache
def _envelope() -> type[BaseModel]:
    # Made at first use, not at import: a model class costs about a millisecond to make.
    class _Envelope(_Frozen):
        format: int
        messages: list[_Tagged]

    return _Envelope


@functools.cache
def _message_adapter() -> TypeAdapter[ChatMessage]:
    # Built at first use, not at import: schemas cost milliseconds to build.
    return TypeAdapter(_Tagged)


@functools.cache
def _each_adapter() -> TypeAdapter[list[ChatMessage]]:
    # Each item is a JSON text parsed on its own: one that holds more or less than one
    # message fails, whatever its neighbours hold.
    return TypeAdapter(list[Json[_Tagged]])


@functools.cache
def _time_adapter() -> TypeAdapter[datetime]:
    return TypeAdapter(datetime)


_MESSAGE_TYPES: Final = (SystemMessage, UserMessage, AiMessage, ToolExecutionResultMessage)


class _IdSource:
    # A random per-process prefix (80 bits) above a 48-bit counter: unique across processes
    # (the prefix is drawn again after a fork), ordered within one, and ~20x cheaper than
    # uuid4(). One int counts both, so an id costs one increment and one hex conversion.
    __slots__ = ("counter",)

    def __init__(self) -> None:
        self.reseed()

    def reseed(self) -> None:
        self.counter = itertools.count((int.from_bytes(os.urandom(10), "big") << 48) + 1)


_ids = _IdSource()
os.register_at_fork(after_in_child=_ids.reseed)


def new_message_id() -> str:
    """A fresh message id: 32 hex characters, unique across processes."""
    return next(_ids.counter).to_bytes(16, "big").hex()


def _check_version(text: str | bytes) -> None:
    import json  # only input that failed validation gets here

    try:
        raw = json.loads(text)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"not valid chat messages JSON: {exc}") from None
    if not isinstance(raw, dict) or "format" not in raw:
        raise ValueError(
            'chat messages JSON must be an object {"format": N, "messages": [...]}, '
            "as written by messages_to_json"
        )
    version = raw["format"]
    if type(version) is not int:
        raise ValueError(f"chat messages JSON has a non-integer format version: {version!r}")
    if version > FORMAT_VERSION:
        raise ValueError(
            f"chat messages JSON has format version {version}, newer than the "
            f"{FORMAT_VERSION} this version of aiservices reads; upgrade aiservices"
        )
    if version < 1:
        raise ValueError(f"chat messages JSON has an unknown format version {version}")


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False)[:5]:
        loc = ".".join(str(p) for p in err["loc"])
        parts.append(f"{loc}: {err['msg']}" if loc else err["msg"])
    return "; ".join(parts)


def messages_to_json(messages: Iterable[ChatMessage]) -> str:
    """Serialise messages, with a type tag on each and the format version on the whole."""
    body = ",".join(map(message_to_json, messages))
    return f'{{"format":{FORMAT_VERSION},"messages":[{body}]}}'


def messages_from_json(text: str | bytes) -> list[ChatMessage]:
    """Read what ``messages_to_json`` wrote; anything malformed is a ``ValueError``."""
    try:
        envelope: Any = _envelope().model_validate_json(text)
    except ValidationError as exc:
        _check_version(text)
        found = _list_with_lone_surrogates(text)
        if found is not None:
            return found
        raise ValueError(f"invalid chat messages JSON: {_describe(exc)}") from None
    if envelope.format != FORMAT_VERSION:
        _check_version(text)
    return list(envelope.messages)


_Serialise: TypeAlias = Callable[..., bytes]

# Per message class: its fields in declared order, and its serialiser's to_json. Filled at
# first use, as building a serialiser costs milliseconds.
_forms: dict[type, tuple[list[str], _Serialise]] = {}


def _form(cls: type[_Message]) -> tuple[list[str], _Serialise]:
    cls.model_rebuild()  # a no-op once built; classes defer building until first use
    form = (list(cls.model_fields), cls.__pydantic_serializer__.to_json)
    _forms[cls] = form
    return form


def message_to_json(message: ChatMessage) -> str:
    """Serialise one message with its type tag, in the canonical form (see the module)."""
    form = _forms.get(type(message))
    if form is None:
        if not isinstance(message, _MESSAGE_TYPES):
            raise TypeError(f"not a chat message: {message!r}")
        form = _form(type(message))
    order, to_json = form
    # pydantic writes the fields in the order of the instance's __dict__, the order it was
    # built in (unchecked_message takes any), and an aware time with its own offset.
    values = message.__dict__
    if [*values] != order:
        # The same values under the same names, in declared order: the message stays equal
        # to itself in every way, and is written faster the next time. The new dict takes
        # the old one's place in one step, so a reader sees one or the other, both whole.
        values = {name: values[name] for name in order}
        _set_dict(message, "__dict__", values)
    at = values["created_at"]
    if at is not None and at.tzinfo is not UTC and at.utcoffset():
        message = unchecked_message(type(message), {**values, "created_at": at.astimezone(UTC)})
    # The serialiser itself: model_dump_json costs a third more in argument handling.
    try:
        return to_json(message, exclude_none=True).decode()
    except PydanticSerializationError:
        if not _has_surrogates(message):
            raise
        return _escaping_surrogates(message)


def message_from_json(text: str | bytes) -> ChatMessage:
    """Read one message written by ``message_to_json``; a ``ValueError`` if malformed."""
    try:
        return _message_adapter().validate_json(text)
    except ValidationError as exc:
        message = _with_lone_surrogates(text)
        if message is None:
            raise ValueError(f"invalid chat message JSON: {_describe(exc)}") from None
        return message


def messages_from_texts(texts: Sequence[object]) -> list[ChatMessage]:
    """Read one message from each text in one call; a ``ValueError`` if any is not exactly one.

    As fast as parsing the texts joined into one array, and, unlike that, a text holding
    part of a message, or two, is an error even when its neighbours make up for it.
    """
    try:
        return _each_adapter().validate_python(texts)
    except ValidationError as exc:
        raise ValueError(f"invalid chat message JSON: {_describe(exc)}") from None


# Lone surrogates (str can hold them; UTF-8 can't, so neither can a store) are written as
# JSON escapes. pydantic's JSON reader refuses those escapes, so a text holding one is read
# with the json module instead.
_SURROGATE: Final = re.compile(r"[\ud800-\udfff]")
_SURROGATE_ESCAPE: Final = re.compile(r"\\u[dD][89a-fA-F]")


def _has_surrogates(value: object) -> bool:
    if isinstance(value, str):
        return _SURROGATE.search(value) is not None
    if isinstance(value, BaseModel):
        return any(map(_has_surrogates, value.__dict__.values()))
    if isinstance(value, list):
        return any(map(_has_surrogates, value))
    return False


def _paired(value: Any) -> Any:
    """``value`` with each high surrogate followed by a low one made the character they
    spell, as any JSON reader would read them back; lone surrogates stay."""
    if isinstance(value, str):
        if _SURROGATE.search(value) is None:
            return value
        return value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")
    if isinstance(value, dict):
        return {k: _paired(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_paired(v) for v in value]
    return value


def _escaping_surrogates(message: _Message) -> str:
    """The canonical text of a message whose strings hold surrogates, each lone one escaped."""
    import json

    values = _paired(message.model_dump(mode="json", exclude_none=True))
    # Escapes as pydantic's writer does (only quotes, backslashes and control characters),
    # so the text differs from its form only where a lone surrogate is.
    text = json.dumps(values, ensure_ascii=False, separators=(",", ":"))
    return _SURROGATE.sub(lambda m: f"\\u{ord(m[0]):04x}", text)


def _checked_id(name: str, value: object) -> str:
    # Refused here as the constructor refuses it: a number written as an id could not be
    # read back, and would make the stored conversation unreadable.
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    return str(value)


def _escaped_surrogates(text: str | bytes) -> object:
    """``text`` parsed as plain JSON when it escapes a lone surrogate (which pydantic's
    reader refuses); ``None`` otherwise."""
    import json

    if isinstance(text, bytes | bytearray):
        try:
            text = text.decode()
        except UnicodeDecodeError:
            return None
    if not isinstance(text, str) or _SURROGATE_ESCAPE.search(text) is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _list_with_lone_surrogates(text: str | bytes) -> list[ChatMessage] | None:
    """The messages of a list whose texts escape lone surrogates; ``None`` if it is not one."""
    import json

    values = _escaped_surrogates(text)
    if not isinstance(values, dict) or values.get("format") != FORMAT_VERSION:
        return None
    listed = values.get("messages")
    if not isinstance(listed, list):
        return None
    try:
        # Each as the one-message reader takes it, lone surrogates escaped again.
        return [message_from_json(json.dumps(m)) for m in listed]
    except ValueError:
        return None


def _with_lone_surrogates(text: str | bytes) -> ChatMessage | None:
    """The message of a text that escapes lone surrogates; ``None`` if it is not one."""
    import json

    values = _escaped_surrogates(text)
    if not isinstance(values, dict):
        return None
    try:
        at = values.get("created_at")
        if isinstance(at, str):
            # Read as pydantic reads a time from JSON; the rest validates as it would.
            values["created_at"] = _time_adapter().validate_json(json.dumps(at))
        return _message_adapter().validate_python(values)
    except (ValueError, ValidationError):
        return None

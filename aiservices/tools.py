"""Tools the model may call: the ``@tool`` decorator, what a call to a tool produced, its errors.

```
AiServiceError
 └── ToolExecutionError          a tool request that failed; the text goes to the model
      ├── ToolArgumentsError      kind "arguments": not JSON, or not valid for the tool
      ├── UnknownToolError        kind "unknown_tool": the model named a tool that is not there
      └── ToolRaisedError         kind "raised": the tool raised (the exception is __cause__)
```
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Final, Literal, TypeAlias, TypeVar, overload

from pydantic import PlainSerializer
from pydantic_core import to_jsonable_python

from .errors import AiServiceError
from .messages import ToolExecutionRequest, ToolExecutionResultMessage
from .models import ToolSpecification

__all__ = [
    "Tool",
    "ToolArgumentsError",
    "ToolErrorHandler",
    "ToolErrorKind",
    "ToolExecution",
    "ToolExecutionError",
    "ToolRaisedError",
    "ToolSpecification",
    "UnknownToolError",
    "tool",
]

_F = TypeVar("_F", bound=Callable[..., Any])

# What OpenAI and Anthropic both accept as a tool name: 1 to 64 of these (ASCII only).
_TOOL_NAME_CHARS: Final = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"
)
_TOOL_ATTRIBUTE: Final = "_aiservices_tool"


def valid_tool_name(name: str) -> bool:
    """Whether both providers accept ``name`` as a tool name."""
    return 0 < len(name) <= 64 and _TOOL_NAME_CHARS.issuperset(name)


class ToolOptions:
    """What ``@tool(...)`` said about a function; ``None`` means "from the function"."""

    # A plain class rather than a dataclass: it is made when `tool` is first imported, and a
    # dataclass would cost that import a compile of each generated method.
    __slots__ = ("description", "name", "return_direct")

    def __init__(
        self, name: str | None = None, description: str | None = None, return_direct: bool = False
    ) -> None:
        self.name = name
        self.description = description
        self.return_direct = return_direct


_DEFAULT_OPTIONS: Final = ToolOptions()


@overload
def tool(fn: _F, /) -> _F: ...


@overload
def tool(
    *, name: str | None = None, description: str | None = None, return_direct: bool = False
) -> Callable[[_F], _F]: ...


def tool(
    fn: Any = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    return_direct: bool = False,
) -> Any:
    """Mark a function or method as a tool the model may call; it is returned unchanged.

    ``name`` defaults to the function's name, ``description`` to its docstring.
    With ``return_direct=True`` a service returns the tool's result to its caller instead of
    showing it to the model (when every tool the model asked for in that answer is such a
    tool and none failed).
    """
    if isinstance(fn, str):
        raise TypeError(f"tool({fn!r}): pass the name as a keyword, @tool(name={fn!r})")
    if name is not None and (not isinstance(name, str) or not valid_tool_name(name)):
        raise ValueError(f"tool(name={name!r}): a tool name is 1 to 64 letters, digits, '_' or '-'")
    if description is not None and not isinstance(description, str):
        raise TypeError(f"tool(description=...) takes a str, got {type(description).__name__}")
    if not isinstance(return_direct, bool):
        raise TypeError(f"tool(return_direct=...) takes a bool, got {return_direct!r}")
    options = (
        _DEFAULT_OPTIONS
        if name is None and description is None and not return_direct
        else ToolOptions(name, description, return_direct)
    )

    def mark(target: _F) -> _F:
        _mark(target, options)
        return target

    return mark if fn is None else mark(fn)


def _mark(target: object, options: ToolOptions) -> None:
    if isinstance(target, (staticmethod, classmethod)):
        function: object = target.__func__
    elif isinstance(target, type):
        raise TypeError(
            f"@tool cannot mark the class {target.__qualname__}: mark the methods the model "
            "may call, and pass an instance in tools=[...]"
        )
    elif inspect.ismethod(target):
        raise TypeError(
            f"@tool cannot mark the bound method {target.__qualname__}: mark the method "
            "where its class defines it, or wrap the call in a function"
        )
    elif callable(target):
        function = target
    else:
        raise TypeError(f"@tool marks functions and methods, not {type(target).__name__}")
    try:
        setattr(function, _TOOL_ATTRIBUTE, options)
    except (AttributeError, TypeError):
        raise TypeError(
            f"@tool cannot mark {function!r}: it takes no attributes; wrap it in a function"
        ) from None


def tool_options(target: object) -> ToolOptions | None:
    """The options ``@tool`` set on ``target`` (a function, or a method's function)."""
    options = getattr(target, _TOOL_ATTRIBUTE, None)
    return options if isinstance(options, ToolOptions) else None


class Tool:
    """A tool made from a JSON schema and a callable, for tools that are not Python signatures.

    ``parameters`` is an object schema of the arguments (JSON Schema, any draft the
    ``jsonschema`` library knows); ``function`` (sync or ``async def``) is called with them
    as keyword arguments and returns a string, or a value sent as JSON. The model's
    arguments are validated against the schema first; an invalid call sends the validation
    error back to the model. Goes in ``tools=[...]`` or comes from a ``tool_provider``.
    """

    __slots__ = ("_validator", "description", "function", "name", "parameters")

    def __init__(
        self,
        name: str,
        description: str,
        parameters: Mapping[str, Any],
        function: Callable[..., Any],
    ) -> None:
        if not isinstance(name, str) or not valid_tool_name(name):
            raise ValueError(f"Tool({name!r}): a tool name is 1 to 64 letters, digits, '_' or '-'")
        if not isinstance(description, str):
            raise TypeError(f"Tool({name!r}): description must be a str")
        if not callable(function):
            raise TypeError(f"Tool({name!r}): function must be callable, got {function!r}")
        if inspect.isasyncgenfunction(function):
            raise TypeError(
                f"Tool({name!r}): an async generator can't be a tool (its result must be whole "
                "when the model reads it); collect its items in a list and return that"
            )
        if not isinstance(parameters, Mapping) or parameters.get("type") != "object":
            raise ValueError(
                f"Tool({name!r}): parameters must be an object schema "
                '({"type": "object", "properties": {...}}), got ' + repr(parameters)[:80]
            )
        from jsonschema import exceptions, validators

        checker = validators.validator_for(parameters)
        try:
            checker.check_schema(dict(parameters))
        except exceptions.SchemaError as exc:
            raise ValueError(
                f"Tool({name!r}): parameters is not a valid JSON schema: {exc.message}"
            ) from None
        self.name = name
        self.description = description
        self.parameters = parameters
        self.function = function
        self._validator = checker(parameters)

    def __repr__(self) -> str:
        return f"Tool({self.name!r})"

    @property
    def specification(self) -> ToolSpecification:
        """What the model is shown of this tool."""
        return ToolSpecification(self.name, self.description, self.parameters)

    def check_arguments(self, arguments: object) -> None:
        """Raise ``ValueError`` saying what is wrong unless ``arguments`` fit the schema."""
        from jsonschema.exceptions import best_match

        try:
            error = best_match(self._validator.iter_errors(arguments))  # type: ignore[arg-type]
        except Exception as exc:  # the schema itself fails (a $ref that resolves nowhere)
            raise ValueError(f"the tool's schema cannot check them: {exc}") from exc
        if error is not None:
            where = "/".join(str(part) for part in error.absolute_path)
            raise ValueError(f"{where}: {error.message}" if where else error.message)


ToolErrorKind: TypeAlias = Literal["arguments", "unknown_tool", "raised"]


class ToolExecutionError(AiServiceError):
    """A tool request that failed; the message is the text the model is shown.

    ``kind`` says what failed, ``request`` is the model's request, and ``__cause__`` the
    original exception (pydantic's ``ValidationError``, or what the tool raised).
    """

    kind: ClassVar[ToolErrorKind]

    def __init__(self, message: str, request: ToolExecutionRequest) -> None:
        super().__init__(message)
        self.request = request

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.request), self.__dict__)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        """In a pydantic model or a FastAPI response (``Result[T]``), the text the model saw."""
        from pydantic_core import core_schema

        return core_schema.json_or_python_schema(
            json_schema=core_schema.str_schema(),
            python_schema=core_schema.is_instance_schema(cls),
            serialization=core_schema.plain_serializer_function_ser_schema(str),
        )

    @property
    def tool_name(self) -> str:
        """The tool name the model asked for."""
        return self.request.name


class ToolArgumentsError(ToolExecutionError):
    """The arguments were not JSON, or did not validate against the tool's parameters."""

    kind: ClassVar[ToolErrorKind] = "arguments"


class UnknownToolError(ToolExecutionError):
    """The model asked for a tool that is not offered."""

    kind: ClassVar[ToolErrorKind] = "unknown_tool"


class ToolRaisedError(ToolExecutionError):
    """The tool raised, or returned a value that has no text form; ``__cause__`` says what."""

    kind: ClassVar[ToolErrorKind] = "raised"


ToolErrorHandler: TypeAlias = Callable[[ToolExecutionError, ToolExecutionRequest], str]
"""Turns a failed request into the text the model is shown, or raises to end the call."""


def _json_value(value: object) -> object:
    # A tool may return anything: in JSON (a FastAPI response), what has no JSON form is
    # written as its str(), as a prompt template writes it.
    return to_jsonable_python(value, fallback=str, inf_nan_mode="strings")


@dataclass(frozen=True, slots=True)
class ToolExecution:
    """One tool request and what came of it.

    ``result`` is the text sent back to the model; ``value`` what the tool returned
    (``None`` when it failed); ``error`` why it failed. ``return_direct`` is set when the
    tool was declared ``return_direct=True`` and ran without error.
    """

    request: ToolExecutionRequest
    result: str
    value: Annotated[Any, PlainSerializer(_json_value, when_used="json")] = None
    error: ToolExecutionError | None = None
    return_direct: bool = False

    def to_message(self) -> ToolExecutionResultMessage:
        """The message recording this result, answering the request by its id."""
        request = self.request
        return ToolExecutionResultMessage(
            request.id, request.name, self.result, is_error=self.error is not None or None
        )

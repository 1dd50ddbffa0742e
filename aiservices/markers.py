"""Markers read from ``Annotated[...]`` parameters of a service interface.

Plain frozen data: the service reads them once, when it is built. Any other metadata
inside ``Annotated`` is left alone (pydantic's ``Field`` on tool parameters, say).
"""

from __future__ import annotations

import types
from typing import Annotated, Final, Union, get_args, get_origin

__all__ = ["Context", "MemoryId", "UserName", "V"]

# Plain classes rather than frozen dataclasses: they are made at `import aiservices`, where
# a dataclass would cost a compile of each generated method.


class _Marker:
    __slots__ = ()

    def __repr__(self) -> str:
        return type(self).__name__

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self))


class MemoryId(_Marker):
    """Marks the parameter that selects the conversation: ``Annotated[str, MemoryId]``."""

    __slots__ = ()


class Context(_Marker):
    """Marks a per-call value for tools and providers, never sent to the model.

    On a service method, ``Annotated[User, Context]`` is neither a template variable nor
    part of the prompt. A tool declaring a parameter ``Annotated[T, Context]`` receives it
    (``None`` from a method without one), as do ``system_message_provider`` and
    ``tool_provider`` through a ``context`` keyword when they declare one.
    """

    __slots__ = ()


class UserName(_Marker):
    """Marks the parameter whose value becomes the recorded ``UserMessage.name``."""

    __slots__ = ()


class V:
    """Exposes a parameter to templates under another name: ``Annotated[str, V("topic")]``."""

    __slots__ = ("name",)
    __match_args__ = ("name",)
    name: str

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"V({name!r}): a template variable name must be a Python identifier")
        object.__setattr__(self, "name", name)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"V is immutable: cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"V is immutable: cannot delete {name!r}")

    def __repr__(self) -> str:
        return f"V(name={self.name!r})"

    def __eq__(self, other: object) -> bool:
        return type(other) is V and other.name == self.name

    def __hash__(self) -> int:
        return hash((V, self.name))


def is_marker(metadata: object, marker: type[_Marker]) -> bool:
    """Whether ``metadata`` is ``marker`` itself or an instance of it."""
    return metadata is marker or isinstance(metadata, marker)


def metadata_of(annotation: object) -> tuple[object, ...]:
    """The ``Annotated`` metadata of a parameter's type, also of each member of a union:
    ``Annotated[str, MemoryId] | None`` is a memory id as ``Annotated[str | None, MemoryId]``
    is."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return tuple(getattr(annotation, "__metadata__", ()))
    if origin is Union or origin is types.UnionType:
        return tuple(m for member in get_args(annotation) for m in metadata_of(member))
    return ()


MEMORY_ID: Final = MemoryId()
USER_NAME: Final = UserName()

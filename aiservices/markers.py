"""Markers read from ``Annotated[...]`` parameters of a service interface.

Plain frozen data: the service reads them once, when it is built. Any other metadata
inside ``Annotated`` is left alone (pydantic's ``Field`` on tool parameters, say).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = ["MemoryId", "UserName", "V"]


class _Marker:
    __slots__ = ()

    def __repr__(self) -> str:
        return type(self).__name__


@dataclass(frozen=True, slots=True, repr=False)
class MemoryId(_Marker):
    """Marks the parameter that selects the conversation: ``Annotated[str, MemoryId]``."""


@dataclass(frozen=True, slots=True, repr=False)
class UserName(_Marker):
    """Marks the parameter whose value becomes the recorded ``UserMessage.name``."""


@dataclass(frozen=True, slots=True)
class V:
    """Exposes a parameter to templates under another name: ``Annotated[str, V("topic")]``."""

    name: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(
                f"V({self.name!r}): a template variable name must be a Python identifier"
            )


def is_marker(metadata: object, marker: type[_Marker]) -> bool:
    """Whether ``metadata`` is ``marker`` itself or an instance of it."""
    return metadata is marker or isinstance(metadata, marker)


MEMORY_ID: Final = MemoryId()
USER_NAME: Final = UserName()

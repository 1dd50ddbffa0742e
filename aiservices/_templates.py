"""Prompt templates: ``{{name}}`` placeholders, parsed and checked once, rendered in one pass."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Final

from pydantic import BaseModel
from pydantic_core import PydanticSerializationError, to_json

__all__ = ["BUILTIN_VARIABLES", "Template", "render_value"]

_PLACEHOLDER: Final = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")

BUILTIN_VARIABLES: Final = frozenset({"current_date", "current_time", "current_date_time"})
"""Variables every template may use unless a parameter has the same name (as in LangChain4j)."""


def render_value(value: object) -> str:
    """Text for a value inside a prompt: strings as they are, structured values as JSON."""
    if type(value) is str:
        return value
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    if isinstance(value, (dict, list, tuple, set, frozenset)) or (
        dataclasses.is_dataclass(value) and not isinstance(value, type)
    ):
        # Inside, what has no JSON form is written as its str(), as it would be alone.
        try:
            return to_json(_ordered(value), fallback=str, inf_nan_mode="strings").decode()
        except PydanticSerializationError:
            return str(value)  # (bytes that are not UTF-8, a list that holds itself)
    return str(value)


def _ordered(value: Any, within: frozenset[int] = frozenset()) -> Any:
    """``value`` with its sets sorted, so a prompt is the same text in every process."""
    # A set iterates in hash order, which changes with each interpreter's hash seed:
    # the same call would send different prompts (and miss a provider's prompt cache).
    kind = type(value)
    if kind not in _CONTAINERS or id(value) in within:
        return value  # (a structure that holds itself is left for the JSON writer to refuse)
    within = within | {id(value)}
    if kind is dict:
        return {key: _ordered(item, within) for key, item in value.items()}
    items = [_ordered(item, within) for item in value]
    if kind is list or kind is tuple:
        return items
    try:
        return sorted(items)
    except TypeError:  # items that do not compare with each other
        return sorted(items, key=lambda item: (type(item).__name__, repr(item)))


_CONTAINERS: Final = frozenset({dict, list, tuple, set, frozenset})


def _builtin(name: str) -> str:
    now = datetime.now().astimezone()
    if name == "current_date":
        return now.date().isoformat()
    if name == "current_time":
        return now.time().replace(microsecond=0).isoformat()
    return now.replace(microsecond=0).isoformat()


@dataclasses.dataclass(frozen=True, slots=True)
class Template:
    """A parsed template: literal text between placeholders, in order."""

    source: str
    literals: tuple[str, ...]
    names: tuple[str, ...]

    @classmethod
    def parse(cls, source: str) -> Template:
        """Split ``source`` at its ``{{name}}`` placeholders; malformed ones are ``ValueError``."""
        literals: list[str] = []
        names: list[str] = []
        position = 0
        for match in _PLACEHOLDER.finditer(source):
            name = match.group(1)
            if not name.isidentifier():
                raise ValueError(
                    f"template placeholder {match.group(0)!r} must hold a name, like {{{{topic}}}}"
                )
            literals.append(source[position : match.start()])
            names.append(name)
            position = match.end()
        literals.append(source[position:])
        return cls(source, tuple(literals), tuple(names))

    @property
    def variables(self) -> frozenset[str]:
        """The names the template refers to."""
        return frozenset(self.names)

    def render(self, values: Mapping[str, Any]) -> str:
        """Fill every placeholder once; text inside the values is never rendered again."""
        names = self.names
        if not names:
            return self.source
        literals = self.literals
        parts: list[str] = [literals[0]]
        for i, name in enumerate(names):
            value = values[name] if name in values else _builtin(name)
            parts.append(value if type(value) is str else render_value(value))
            parts.append(literals[i + 1])
        return "".join(parts)

    def unknown(self, known: Sequence[str] | frozenset[str]) -> list[str]:
        """Names the template uses that are neither in ``known`` nor built in."""
        return [
            n for n in dict.fromkeys(self.names) if n not in known and n not in BUILTIN_VARIABLES
        ]

"""OpenAI's strict mode: the one check of whether a JSON schema qualifies, for tool
parameters and answer formats alike.

Strict mode accepts a subset of JSON Schema: supported keywords only (``format`` from a
short list), every node saying what it is (a ``type``, an ``anyOf`` or a bare ``$ref``),
every object closed (``additionalProperties: false``) with every property required, and
limits on nesting, properties and enum values. A schema that does not qualify is sent
without ``strict``: the provider then takes it as a best-effort schema.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

__all__ = ["is_strict_schema"]

KEYWORDS: Final = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "anyOf",
        "enum",
        "const",
        "$ref",
        "$defs",
        "definitions",
        "title",
        "description",
        "pattern",
        "format",
        "multipleOf",
        "maximum",
        "exclusiveMaximum",
        "minimum",
        "exclusiveMinimum",
        "minItems",
        "maxItems",
    }
)
FORMATS: Final = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}
)
MAX_DEPTH: Final = 10
MAX_PROPERTIES: Final = 5000
MAX_ENUM_VALUES: Final = 1000


def is_strict_schema(schema: object) -> bool:
    """Whether strict mode accepts ``schema``, an object schema with its ``$defs``."""
    if not isinstance(schema, Mapping) or schema.get("type") != "object":
        return False
    defs: dict[str, Any] = {}
    for key in ("$defs", "definitions"):
        found = schema.get(key)
        if found is not None:
            if not isinstance(found, Mapping):
                return False
            defs.update(found)
    check = _Check()
    if not (check.node(schema) and all(check.node(d) for d in defs.values())):
        return False
    return (
        check.properties <= MAX_PROPERTIES
        and check.enum_values <= MAX_ENUM_VALUES
        and _Depth(defs).of(schema) <= MAX_DEPTH
    )


class _Check:
    __slots__ = ("enum_values", "properties")

    def __init__(self) -> None:
        self.properties = 0
        self.enum_values = 0

    def node(self, node: Any) -> bool:
        if not isinstance(node, Mapping) or not KEYWORDS.issuperset(node):
            return False
        if "$ref" in node:
            return len(node) == 1  # nothing may stand beside a reference
        if "type" not in node and "anyOf" not in node:
            return False  # "schema must have a 'type' key"
        fmt = node.get("format")
        if fmt is not None and fmt not in FORMATS:
            return False
        enum = node.get("enum")
        if enum is not None:
            self.enum_values += len(enum)
        kind = node.get("type")
        properties = node.get("properties")
        if (
            properties is not None
            or kind == "object"
            or (isinstance(kind, list) and "object" in kind)
        ):
            if not isinstance(properties, Mapping) or node.get("additionalProperties") is not False:
                return False
            if set(node.get("required", ())) != set(properties):
                return False
            self.properties += len(properties)
            if not all(self.node(p) for p in properties.values()):
                return False
        items = node.get("items")
        if items is not None and not self.node(items):
            return False
        any_of = node.get("anyOf")
        return any_of is None or (isinstance(any_of, list) and all(self.node(v) for v in any_of))


class _Depth:
    """How deeply objects nest, following references; a recursive reference adds nothing."""

    __slots__ = ("defs", "known")

    def __init__(self, defs: Mapping[str, Any]) -> None:
        self.defs = defs
        self.known: dict[str, int] = {}

    def of(self, node: Any) -> int:
        if isinstance(node, list):
            return max((self.of(member) for member in node), default=0)
        if not isinstance(node, Mapping):
            return 0
        deepest = 0
        ref = node.get("$ref")
        if isinstance(ref, str):
            name = ref.rsplit("/", 1)[-1]
            if name not in self.known and name in self.defs:
                self.known[name] = 0
                self.known[name] = self.of(self.defs[name])
            deepest = self.known.get(name, 0)
        properties = node.get("properties")
        inner = [node.get("items"), node.get("anyOf"), node.get("additionalProperties")]
        if isinstance(properties, Mapping):
            inner.extend(properties.values())
        deepest = max(deepest, *(self.of(n) for n in inner))
        is_object = isinstance(properties, Mapping) or node.get("type") == "object"
        return deepest + 1 if is_object else deepest

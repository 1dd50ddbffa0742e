"""A tool's signature as a JSON schema and an argument validator."""

import dataclasses
import enum
import json
import typing
import warnings
from typing import Annotated, Any, Literal, Optional

import pytest
import typing_extensions
from pydantic import BaseModel, Field, ValidationError

from aiservices._tool_schema import (
    clean_json_schema,
    describe_validation_error,
    read_signature,
)
from aiservices.errors import InterfaceError
from aiservices.markers import Context, MemoryId, UserName


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Size(enum.Enum):
    """How big."""

    S = 1
    L = 2


class Address(BaseModel):
    """A postal address."""

    street: str
    city: str = "Paris"


@dataclasses.dataclass
class Point:
    x: int
    y: int = 0


class Node(BaseModel):
    value: int
    children: list["Node"] = []


class Opaque:
    pass


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int


class Dog(BaseModel):
    kind: Literal["dog"]
    bark: str


def schema_of(fn: Any, *, skip_first: bool = False) -> dict[str, Any]:
    return dict(read_signature(fn, skip_first=skip_first, where=fn.__qualname__).schema)


def only_property(fn: Any) -> tuple[dict[str, Any], list[str]]:
    schema = schema_of(fn)
    (prop,) = schema["properties"].values()
    return prop, schema["required"]


def walk(node: Any) -> list[dict[str, Any]]:
    found = []
    if isinstance(node, dict):
        found.append(node)
        for value in node.values():
            found.extend(walk(value))
    elif isinstance(node, list):
        for value in node:
            found.extend(walk(value))
    return found


def test_no_parameters_is_an_empty_object_schema() -> None:
    def ping() -> str:
        return "pong"

    assert schema_of(ping) == {
        "type": "object",
        "properties": {},
        "required": [],
        "additionalProperties": False,
    }


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        (int, {"type": "integer"}),
        (float, {"type": "number"}),
        (str, {"type": "string"}),
        (bool, {"type": "boolean"}),
        (list[int], {"type": "array", "items": {"type": "integer"}}),
        (dict[str, float], {"type": "object", "additionalProperties": {"type": "number"}}),
        (Optional[int], {"anyOf": [{"type": "integer"}, {"type": "null"}]}),  # noqa: UP045
        (int | None, {"anyOf": [{"type": "integer"}, {"type": "null"}]}),
        (Literal["x", "y"], {"type": "string", "enum": ["x", "y"]}),
        (Color, {"type": "string", "enum": ["red", "green"]}),
        (Size, {"type": "integer", "enum": [1, 2], "description": "How big. (1 = S, 2 = L)"}),
        (Any, {}),
        (
            Annotated[int, Field(description="how many", ge=0, le=10)],
            {"type": "integer", "description": "how many", "minimum": 0, "maximum": 10},
        ),
        (
            Address,
            {
                "type": "object",
                "description": "A postal address.",
                "properties": {
                    "street": {"type": "string"},
                    "city": {"type": "string", "default": "Paris"},
                },
                "required": ["street"],
            },
        ),
        (
            Point,
            {
                "type": "object",
                "properties": {"x": {"type": "integer"}, "y": {"type": "integer", "default": 0}},
                "required": ["x"],
                "additionalProperties": False,
            },
        ),
        (
            list[Address],
            {
                "type": "array",
                "items": {
                    "type": "object",
                    "description": "A postal address.",
                    "properties": {
                        "street": {"type": "string"},
                        "city": {"type": "string", "default": "Paris"},
                    },
                    "required": ["street"],
                },
            },
        ),
    ],
)
def test_required_parameter_schema(annotation: Any, expected: dict[str, Any]) -> None:
    def fn(p):  # type: ignore[no-untyped-def]
        return p

    fn.__annotations__ = {"p": annotation}
    prop, required = only_property(fn)
    assert prop == expected
    assert required == ["p"]


def test_defaults_are_shown_and_make_a_parameter_optional() -> None:
    def fn(
        a: int,
        b: int = 2,
        c: Optional[str] = None,  # noqa: UP045
        color: Color = Color.GREEN,
        where: Address = Address(street="Main"),  # noqa: B008
    ) -> None: ...

    schema = schema_of(fn)
    assert schema["required"] == ["a"]
    props = schema["properties"]
    assert props["b"] == {"type": "integer", "default": 2}
    assert props["c"] == {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None}
    assert props["color"] == {"type": "string", "enum": ["red", "green"], "default": "green"}
    assert props["where"]["default"] == {"street": "Main", "city": "Paris"}


def test_a_none_default_lets_the_model_send_null() -> None:
    # `limit: int = None` shows the model `"default": null`: sending it must be valid.
    def fn(
        limit: int = None,  # type: ignore[assignment]  # noqa: RUF013
        page: Annotated[int, Field(description="Page", ge=1)] = None,  # type: ignore[assignment]  # noqa: RUF013
        tag: str | None = None,
    ) -> None: ...

    signature = read_signature(fn, skip_first=False, where="fn")
    props = signature.schema["properties"]
    assert props["limit"] == {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None}
    assert props["page"]["anyOf"] == [{"minimum": 1, "type": "integer"}, {"type": "null"}]
    assert props["page"]["description"] == "Page"
    assert props["tag"] == {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None}
    assert signature.validate_json('{"limit": null, "page": null}') == {"limit": None, "page": None}
    with pytest.raises(ValidationError):
        signature.validate_json('{"page": 0}')  # the field's own constraint still holds


def test_a_default_without_a_json_form_is_left_out_silently() -> None:
    sentinel = Opaque()

    def fn(a: Any = sentinel) -> None: ...

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        schema = schema_of(fn)
    assert schema["properties"]["a"] == {}
    assert schema["required"] == []


def test_field_as_default_documents_and_defaults_the_parameter() -> None:
    def fn(n: int = Field(3, description="how many", gt=0), m: int = Field(gt=0)) -> int:
        return n + m

    signature = read_signature(fn, skip_first=False, where="fn")
    assert signature.schema["properties"] == {
        "n": {"type": "integer", "description": "how many", "exclusiveMinimum": 0, "default": 3},
        "m": {"type": "integer", "exclusiveMinimum": 0},
    }
    assert signature.schema["required"] == ["m"]
    # The function's own default is the FieldInfo: the validator supplies the real one.
    assert signature.bind('{"m": 1}', None) == ((), {"n": 3, "m": 1})


def test_annotated_field_default_makes_the_parameter_optional() -> None:
    def fn(n: Annotated[int, Field(default=5, description="n")]) -> int:
        return n

    signature = read_signature(fn, skip_first=False, where="fn")
    assert signature.schema["required"] == []
    assert signature.bind("{}", None) == ((), {"n": 5})


def test_an_aliased_parameter_shows_its_default_under_its_alias() -> None:
    def travel(origin: Annotated[str, Field(alias="from")] = "home", to: str = "work") -> str:
        return f"{origin} -> {to}"

    signature = read_signature(travel, skip_first=False, where="travel")
    assert signature.schema["properties"] == {
        "from": {"type": "string", "default": "home"},
        "to": {"type": "string", "default": "work"},
    }
    assert signature.bind('{"from": "Oslo"}', None) == ((), {"origin": "Oslo"})


def test_a_parameter_with_alias_choices_and_a_default_builds() -> None:
    from pydantic import AliasChoices

    def travel(
        origin: Annotated[str, Field(validation_alias=AliasChoices("from", "start"))] = "home",
    ) -> str:
        return origin

    signature = read_signature(travel, skip_first=False, where="travel")
    assert signature.schema["required"] == []


def test_a_field_description_overrides_a_model_docstring() -> None:
    def fn(where: Annotated[Address, Field(description="Delivery address")]) -> None: ...

    prop, _ = only_property(fn)
    assert prop["description"] == "Delivery address"
    assert prop["type"] == "object"


def test_no_titles_and_no_refs_for_non_recursive_types() -> None:
    def fn(a: Address, b: list[Point], c: dict[str, Color], title: str) -> None: ...

    schema = schema_of(fn)
    nodes = walk(schema)
    # "title" survives only as a property name.
    assert [n for n in nodes if "title" in n] == [schema["properties"]]
    assert not any("$ref" in n for n in nodes)
    assert "$defs" not in schema


def test_recursive_types_keep_local_defs() -> None:
    def fn(tree: Node) -> None: ...

    schema = schema_of(fn)
    node = {
        "type": "object",
        "properties": {
            "value": {"type": "integer"},
            "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}, "default": []},
        },
        "required": ["value"],
    }
    assert schema["properties"]["tree"] == {"$ref": "#/$defs/Node"}
    assert schema["$defs"] == {"Node": node}


def test_discriminated_unions_become_any_of_without_dangling_refs() -> None:
    def adopt(pet: Annotated[Cat | Dog, Field(discriminator="kind")]) -> None: ...

    schema = schema_of(adopt)
    assert schema["properties"]["pet"] == {
        "anyOf": [
            {
                "type": "object",
                "properties": {
                    "kind": {"type": "string", "const": "cat"},
                    "lives": {"type": "integer"},
                },
                "required": ["kind", "lives"],
            },
            {
                "type": "object",
                "properties": {
                    "kind": {"type": "string", "const": "dog"},
                    "bark": {"type": "string"},
                },
                "required": ["kind", "bark"],
            },
        ]
    }
    assert "$defs" not in schema
    signature = read_signature(adopt, skip_first=False, where="adopt")
    assert signature.bind('{"pet": {"kind": "dog", "bark": "woof"}}', None)[1] == {
        "pet": Dog(kind="dog", bark="woof")
    }


class Kitten(BaseModel):
    kind: Literal["kitten"] = "kitten"
    lives: int


class Puppy(BaseModel):
    kind: Literal["puppy"] = "puppy"
    good: bool


def test_a_discriminated_unions_tag_is_required_even_with_a_default() -> None:
    # What the model is shown is what is accepted: pydantic needs the tag to pick a variant.
    def adopt(pet: Annotated[Kitten | Puppy, Field(discriminator="kind")]) -> None: ...

    variants = schema_of(adopt)["properties"]["pet"]["anyOf"]
    assert [sorted(v["required"]) for v in variants] == [["kind", "lives"], ["good", "kind"]]
    signature = read_signature(adopt, skip_first=False, where="adopt")
    with pytest.raises(ValidationError):
        signature.bind('{"pet": {"lives": 9}}', None)


def test_memory_id_parameter_is_hidden_and_injected() -> None:
    def fn(user: Annotated[str, MemoryId], query: str) -> str:
        return query

    signature = read_signature(fn, skip_first=False, where="fn")
    assert list(signature.schema["properties"]) == ["query"]
    assert signature.schema["required"] == ["query"]
    assert signature.memory_id == "user"
    assert signature.bind('{"query": "q"}', "alice") == ((), {"query": "q", "user": "alice"})


def test_a_memory_id_marked_inside_an_optional_is_hidden_and_injected() -> None:
    def fn(user: Annotated[str, MemoryId] | None, query: str) -> str:
        return query

    signature = read_signature(fn, skip_first=False, where="fn")
    assert list(signature.schema["properties"]) == ["query"]
    assert signature.memory_id == "user"


def test_memory_id_marker_instance_works_like_the_class() -> None:
    def fn(user: Annotated[str, MemoryId()], query: str) -> str:
        return query

    assert read_signature(fn, skip_first=False, where="fn").memory_id == "user"


def test_the_model_cannot_pass_the_memory_id_itself() -> None:
    def fn(user: Annotated[str, MemoryId], query: str) -> str:
        return query

    signature = read_signature(fn, skip_first=False, where="fn")
    with pytest.raises(ValidationError, match="user"):
        signature.bind('{"query": "q", "user": "mallory"}', "alice")


def test_a_parameter_cannot_be_both_the_memory_id_and_the_context() -> None:
    def fn(user: Annotated[str, Context, MemoryId], query: str) -> str:
        return query

    with pytest.raises(InterfaceError) as info:
        read_signature(fn, skip_first=False, where="fn")
    assert info.value.problems == [
        "fn(user): a Context parameter cannot also be a MemoryId; mark it with one (a tool "
        "that needs both takes two parameters)"
    ]


def test_other_markers_pass_through_to_the_schema() -> None:
    def fn(name: Annotated[str, UserName, Field(description="who")]) -> str:
        return name

    prop, _ = only_property(fn)
    assert prop == {"type": "string", "description": "who"}


def test_self_is_skipped_for_methods() -> None:
    class Calculator:
        def add(self, a: int) -> int:
            return a

    schema = schema_of(Calculator.add, skip_first=True)
    assert list(schema["properties"]) == ["a"]


def test_positional_only_parameters_are_passed_by_position() -> None:
    def fn(a: int, b: int = 2, /, c: int = 3) -> int:
        return a + b + c

    signature = read_signature(fn, skip_first=False, where="fn")
    assert signature.bind('{"a": 1, "c": 5}', None) == ((1, 2), {"c": 5})


def test_arguments_are_coerced_by_pydantic() -> None:
    def fn(n: int, color: Color, where: Address, pt: Point) -> None: ...

    signature = read_signature(fn, skip_first=False, where="fn")
    args, kwargs = signature.bind(
        '{"n": "4", "color": "red", "where": {"street": "s"}, "pt": {"x": 1}}', None
    )
    assert args == ()
    assert kwargs == {
        "n": 4,
        "color": Color.RED,
        "where": Address(street="s"),
        "pt": Point(1, 0),
    }


class Parcel(typing.TypedDict):
    to: "Destination"
    note: typing.NotRequired[str]


class Destination(typing.TypedDict):
    city: str
    then: typing.NotRequired["Destination"]


def test_a_typing_typeddict_parameter_is_read_on_every_python() -> None:
    # Pydantic reads only typing_extensions.TypedDict before Python 3.12; the tool takes
    # typing's, nested, recursive and inside containers, as a return type does.
    def ship(parcel: Parcel, stops: list[Destination] | None = None) -> str:
        return parcel["to"]["city"]

    signature = read_signature(ship, skip_first=False, where="ship")
    properties = signature.schema["properties"]
    assert properties["parcel"]["required"] == ["to"]
    assert list(signature.schema["$defs"]["Destination"]["properties"]) == ["city", "then"]
    assert "Destination" in json.dumps(properties["stops"])
    _, kwargs = signature.bind(
        '{"parcel": {"to": {"city": "Oslo", "then": {"city": "Rome"}}}, "stops": [{"city": "A"}]}',
        None,
    )
    assert kwargs == {
        "parcel": {"to": {"city": "Oslo", "then": {"city": "Rome"}}},
        "stops": [{"city": "A"}],
    }
    with pytest.raises(ValidationError):
        signature.bind('{"parcel": {"note": "no destination"}}', None)


class Unresolvable(typing.TypedDict):
    session: "NotDefinedAnywhere"  # type: ignore[name-defined] # noqa: F821


Aliased = typing_extensions.TypeAliasType("Aliased", Parcel)


def test_typeddicts_the_model_never_sees_are_left_as_they_are() -> None:
    # A Context parameter is handed over as given, never validated: its type may name
    # what only a type checker sees.
    def whoami(ctx: Annotated[Unresolvable, Context], name: str) -> str:
        return name

    signature = read_signature(whoami, skip_first=False, where="whoami")
    assert list(signature.schema["properties"]) == ["name"]

    def ship(parcel: Aliased) -> str:  # type: ignore[valid-type]
        return "ok"

    shipped = read_signature(ship, skip_first=False, where="ship")
    assert shipped.schema["properties"]["parcel"]["required"] == ["to"]


def test_an_enum_parameter_with_a_description_of_its_own_keeps_the_values_meanings() -> None:
    def paint(size: Annotated[Size, Field(description="The size")]) -> None: ...

    schema = schema_of(paint, skip_first=False)
    assert schema["properties"]["size"]["description"] == "The size (1 = S, 2 = L)"


def test_two_parameters_sent_under_one_name_are_an_interface_error() -> None:
    # The schema would show one property for both, and no call could fill them.
    def aliased(a: Annotated[int, Field(alias="b")], b: str) -> str:
        return b

    def defaulted(b: str, a: int = Field(1, alias="b")) -> str:
        return b

    with pytest.raises(InterfaceError) as raised:
        read_signature(aliased, skip_first=False, where="aliased")
    assert raised.value.problems == [
        "aliased(b): the model would send it as 'b', as it sends a; give each parameter a "
        "name or alias of its own"
    ]
    with pytest.raises(InterfaceError, match=r"defaulted\(a\): the model would send it as 'b'"):
        read_signature(defaulted, skip_first=False, where="defaulted")


def test_empty_arguments_mean_no_arguments() -> None:
    def fn(n: int = 1) -> int:
        return n

    assert read_signature(fn, skip_first=False, where="fn").bind("", None) == ((), {})


def test_invalid_arguments_raise_validation_error() -> None:
    def fn(n: int) -> int:
        return n

    signature = read_signature(fn, skip_first=False, where="fn")
    for bad in ('{"n": "x"}', "{}", '{"n": 1, "m": 2}', "[1]", '{"n": 1'):
        with pytest.raises(ValidationError):
            signature.bind(bad, None)


def test_returns_nothing() -> None:
    def none() -> None: ...

    def untyped():  # type: ignore[no-untyped-def]
        return None

    def maybe() -> int | None:
        return None

    def read(fn: Any) -> bool:
        return read_signature(fn, skip_first=False, where="f").returns_nothing

    assert read(none)
    assert read(untyped)
    assert not read(maybe)


def test_variadic_parameters_and_two_memory_ids_are_all_reported() -> None:
    def fn(
        a: Annotated[str, MemoryId],
        b: Annotated[str, MemoryId],
        *args: int,
        **kwargs: int,
    ) -> None: ...

    with pytest.raises(InterfaceError) as info:
        read_signature(fn, skip_first=False, where="tools.fn")
    problems = info.value.problems
    assert len(problems) == 3
    assert problems[0].startswith("tools.fn(b): a second MemoryId parameter")
    assert problems[1].startswith("tools.fn(args): a tool cannot take *args")
    assert problems[2].startswith("tools.fn(kwargs): a tool cannot take **kwargs")


def test_a_type_without_a_schema_names_the_parameter() -> None:
    def fn(ok: int, thing: Opaque, other: Opaque) -> None: ...

    with pytest.raises(InterfaceError) as info:
        read_signature(fn, skip_first=False, where="fn")
    problems = info.value.problems
    assert [p.split(":")[0] for p in problems] == ["fn(thing)", "fn(other)"]
    assert "Opaque" in problems[0]


def test_string_annotations_resolve_in_the_tool_module() -> None:
    def fn(a: "Address", b: list["Point"]) -> None: ...

    props = schema_of(fn)["properties"]
    assert props["a"]["description"] == "A postal address."
    assert props["b"]["items"]["required"] == ["x"]


def test_an_unresolvable_annotation_is_an_interface_error() -> None:
    def fn(a: "Missing") -> None: ...  # type: ignore[name-defined]  # noqa: F821

    with pytest.raises(InterfaceError, match=r"^fn: its signature cannot be read .*Missing"):
        read_signature(fn, skip_first=False, where="fn")


def test_a_return_type_known_only_to_type_checkers_is_no_problem() -> None:
    # `if TYPE_CHECKING: from billing import Receipt` with `-> "Receipt"`: only whether the
    # tool returns something is read from its return type.
    def issue(a: "Address", amount: int) -> "Receipt":  # type: ignore[name-defined]  # noqa: F821
        raise NotImplementedError

    signature = read_signature(issue, skip_first=False, where="issue")
    assert set(signature.schema["properties"]) == {"a", "amount"}
    assert not signature.returns_nothing

    def nothing(a: "Address") -> "None":
        return None

    assert read_signature(nothing, skip_first=False, where="nothing").returns_nothing


def test_two_defaults_for_one_parameter_are_an_interface_error() -> None:
    def fn(n: Annotated[int, Field(default=3)] = 5) -> None: ...

    with pytest.raises(InterfaceError, match=r"^fn\(n\): two defaults"):
        read_signature(fn, skip_first=False, where="fn")


def test_clean_json_schema_inlines_refs_with_sibling_keywords() -> None:
    raw = {
        "$defs": {
            "A": {"title": "A", "type": "object", "properties": {"b": {"$ref": "#/$defs/B"}}},
            "B": {"title": "B", "type": "string", "description": "b's doc"},
        },
        "title": "Root",
        "type": "object",
        "properties": {
            "a": {"$ref": "#/$defs/A", "description": "an a"},
            "title": {"title": "Title", "type": "string", "default": {"title": "kept"}},
        },
        "required": ["a"],
    }
    assert clean_json_schema(raw) == {
        "type": "object",
        "properties": {
            "a": {
                "type": "object",
                "description": "an a",
                "properties": {"b": {"type": "string", "description": "b's doc"}},
            },
            "title": {"type": "string", "default": {"title": "kept"}},
        },
        "required": ["a"],
    }


def test_clean_json_schema_keeps_mutually_recursive_definitions() -> None:
    raw = {
        "$defs": {
            "A": {"type": "object", "properties": {"b": {"$ref": "#/$defs/B"}}},
            "B": {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}},
            "C": {"type": "integer"},
        },
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/A"}, "c": {"$ref": "#/$defs/C"}},
    }
    cleaned = clean_json_schema(raw)
    assert cleaned["properties"] == {"a": {"$ref": "#/$defs/A"}, "c": {"type": "integer"}}
    assert sorted(cleaned["$defs"]) == ["A", "B"]


def test_describe_validation_error_is_short() -> None:
    def fn(*, a: int, b: int, c: int, d: int, e: int, f: int, g: int) -> None: ...

    signature = read_signature(fn, skip_first=False, where="fn")
    with pytest.raises(ValidationError) as info:
        signature.bind('{"a": "x"' + "}", None)
    text = describe_validation_error(info.value)
    assert text.startswith("a: Input should be a valid integer, unable to parse string as an ")
    assert '(got "x")' in text
    assert "b: Field required" in text
    assert text.endswith("; and 2 more")
    assert "http" not in text


def test_describe_validation_error_shortens_long_inputs() -> None:
    def fn(a: int) -> None: ...

    signature = read_signature(fn, skip_first=False, where="fn")
    with pytest.raises(ValidationError) as info:
        signature.bind('{"a": "' + "x" * 500 + '"}', None)
    text = describe_validation_error(info.value)
    assert len(text) < 200
    assert text.endswith("...)")


def test_a_method_taken_from_its_class_is_named_as_such() -> None:
    class Orders:
        def find(self, order_id: str) -> str:
            return order_id

    with pytest.raises(InterfaceError, match=r"a method taken from its class, not bound"):
        read_signature(Orders.find, skip_first=False, where="Orders.find")


def test_an_infinite_or_nan_default_is_left_out_so_the_schema_is_valid_json() -> None:
    class Limits(BaseModel):
        ceiling: float = float("inf")
        floor: float = 0.0

    def search(
        query: str,
        *,
        max_price: float = float("inf"),
        min_score: Annotated[float, Field(description="lowest score")] = float("nan"),
        below: float = Field(float("-inf")),
        limits: Limits = Limits(),  # noqa: B008
        steps: tuple[float, ...] = (1.0, float("inf")),
        page: int = 1,
    ) -> str:
        return query

    schema = schema_of(search)
    properties = schema["properties"]
    for name in ("max_price", "min_score", "below", "limits", "steps"):
        assert "default" not in properties[name], name
    assert properties["page"]["default"] == 1
    assert properties["min_score"]["description"] == "lowest score"
    limits = properties["limits"]["properties"]  # inside the model too
    assert "default" not in limits["ceiling"]
    assert limits["floor"]["default"] == 0.0
    json.dumps(schema, allow_nan=False)  # what the SDKs' HTTP clients require

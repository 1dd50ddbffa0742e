"""The typed-output registry: supported types, schemas sent to the model, lenient parsing."""

from __future__ import annotations

import dataclasses
import enum
import re
import sys
import typing
from collections.abc import Mapping, Sequence
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Annotated, Any, Generic, Literal, TypeVar

import pytest
import typing_extensions
from pydantic import BaseModel, ConfigDict, Field, RootModel, model_validator

from aiservices import Result
from aiservices._output import OutputPlan, UnsupportedOutputType, plan_output
from aiservices.messages import AiMessage, UserMessage

RETRY_HINT = "Answer again with JSON matching the schema."
NAME_RULE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


class Sentiment(enum.Enum):
    POSITIVE = "positive"
    NEGATIVE = "negative"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Size(enum.Enum):
    SMALL = (1, "small")
    LARGE = (2, "large")


class Color(enum.Enum):
    """A colour."""

    RED = enum.auto()
    GREEN = enum.auto()


class Crossed(enum.Enum):
    # One member's value spells the other's name: an exact value must win.
    A = "b"
    B = "a"


class Verdict(BaseModel):
    sentiment: str
    score: float
    label: int


class Annotated3(BaseModel):
    sentiment: Sentiment = Field(description="overall tone")
    note: str | None = None


class WithDefault(BaseModel):
    name: str
    language: str = "en"


class Open(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str


class Node(BaseModel):
    name: str
    children: list[Node] = Field(default_factory=list)


class Tree(BaseModel):
    label: str
    child: Tree | None = None


T = TypeVar("T")


class Page(BaseModel, Generic[T]):
    items: list[T]


@dataclasses.dataclass
class Point:
    x: int
    y: int


@dataclasses.dataclass
class Labelled:
    label: str
    tags: list[str] = dataclasses.field(default_factory=list)


class Address(typing.TypedDict):
    city: str


class Person(typing.TypedDict, total=False):
    name: typing.Required[str]
    age: int
    home: Address
    others: list[Person]


class Counted(typing.TypedDict):
    word: str
    count: typing.NotRequired[int]


class ModernTD(typing_extensions.TypedDict):
    city: str


class Plain:
    pass


def parse(annotation: Any, text: str | None) -> Any:
    return plan_output(annotation).parse(text)


def schema_of(annotation: Any) -> dict[str, Any]:
    response_format = plan_output(annotation).response_format
    assert response_format is not None
    return dict(response_format.schema)


def strict_of(annotation: Any) -> bool:
    response_format = plan_output(annotation).response_format
    assert response_format is not None
    return response_format.strict


def wrapped(inner: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"value": inner},
        "required": ["value"],
        "additionalProperties": False,
    }


# --- text and AiMessage ------------------------------------------------------------------


def test_str_is_free_text_returned_as_is() -> None:
    plan = plan_output(str)
    assert plan.response_format is None
    assert not plan.returns_ai_message
    assert plan.parse("  Hello, {world} ```x``` ") == "  Hello, {world} ```x``` "
    assert plan.parse(None) == ""


def test_ai_message_asks_for_no_format_and_is_flagged() -> None:
    plan = plan_output(AiMessage)
    assert plan.annotation is AiMessage
    assert plan.response_format is None
    assert plan.returns_ai_message


def test_plans_are_frozen_and_shared_per_type() -> None:
    plan = plan_output(Verdict)
    assert isinstance(plan, OutputPlan)
    assert plan_output(Verdict) is plan
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.annotation = int  # type: ignore[misc]


class FrozenTags(BaseModel):
    model_config = ConfigDict(frozen=True)
    tags: list[str]


class Cat(BaseModel):
    name: str


class Dog(BaseModel):
    name: str


def test_types_equal_in_another_order_have_plans_of_their_own() -> None:
    # Python says Cat | Dog == Dog | Cat, but pydantic tries a union's members in order.
    cats_first = plan_output(Cat | Dog)
    dogs_first = plan_output(Dog | Cat)
    assert type(cats_first.parse('{"name": "Rex"}')) is Cat
    assert type(dogs_first.parse('{"name": "Rex"}')) is Dog
    assert dogs_first.response_format is not None
    assert dogs_first.response_format.name == "Dog_or_Cat"
    b_first = plan_output(Literal["b", "a"])
    assert plan_output(Literal["a", "b"]) is not b_first
    assert b_first.response_format is not None
    assert b_first.response_format.name == "Literal_b_a"
    # And Literal[1] is not Literal[True], although 1 == True.
    assert plan_output(Literal[1]).parse("1") is not True
    assert plan_output(Literal[True]).parse("true") is True


def test_unhashable_annotation_metadata_is_planned_without_the_cache() -> None:
    plan = plan_output(Annotated[int, {"unhashable": []}])
    assert plan.parse("7") == 7


# --- happy paths, one row per accepted form ------------------------------------------------

HAPPY: list[tuple[Any, str, Any]] = [
    # bool: JSON, any case, yes/no, wrapped
    (bool, "true", True),
    (bool, "False", False),
    (bool, "YES", True),
    (bool, "no", False),
    (bool, '{"value": true}', True),
    # int: bare, string, integral float, wrapped, fenced, prose, padded, one-key object
    (int, "42", 42),
    (int, '"42"', 42),
    (int, "42.0", 42),
    (int, '{"value": 42}', 42),
    (int, "```json\n42\n```", 42),
    (int, 'The answer is {"value": 7}.', 7),
    (int, "  42\n", 42),
    (int, '{"answer": 3}', 3),
    # float
    (float, "0.25", 0.25),
    (float, '{"value": 1}', 1.0),
    (float, '"2.5"', 2.5),
    # Decimal keeps the digits as written
    (Decimal, "0.1", Decimal("0.1")),
    (Decimal, '"3.14"', Decimal("3.14")),
    (Decimal, '{"value": "19.99"}', Decimal("19.99")),
    (Decimal, "3.14.", Decimal("3.14")),
    # date and datetime: JSON string, bare token, wrapped, quoted in backticks
    (date, '"2024-05-01"', date(2024, 5, 1)),
    (date, "2024-05-01", date(2024, 5, 1)),
    (date, '{"value": "2024-05-01"}', date(2024, 5, 1)),
    (date, "`2024-05-01`", date(2024, 5, 1)),
    (datetime, "2024-05-01T10:30:00Z", datetime(2024, 5, 1, 10, 30, tzinfo=UTC)),
    (datetime, '{"value": "2024-05-01T10:30:00"}', datetime(2024, 5, 1, 10, 30)),
    # enums: value or name in any case, bare or in JSON
    (Sentiment, '"positive"', Sentiment.POSITIVE),
    (Sentiment, "POSITIVE", Sentiment.POSITIVE),
    (Sentiment, "positive", Sentiment.POSITIVE),
    (Sentiment, "Positive", Sentiment.POSITIVE),
    (Sentiment, '{"value": "NEGATIVE"}', Sentiment.NEGATIVE),
    (Sentiment, "**Negative**", Sentiment.NEGATIVE),
    (Sentiment, "**Negative**.", Sentiment.NEGATIVE),
    (bool, "**Yes**.", True),
    (bool, '"No".', False),
    (int, "`42`.", 42),
    (float, "3.14.", 3.14),
    (Size, '{"value": [2, "large"]}', Size.LARGE),
    (Size, "large", Size.LARGE),
    (Sentiment, "```\nPOSITIVE\n```", Sentiment.POSITIVE),
    (Level, "1", Level.LOW),
    (Level, '"2"', Level.HIGH),
    (Level, "high", Level.HIGH),
    (Level, '{"value": "LOW"}', Level.LOW),
    (Crossed, "a", Crossed.B),
    (Crossed, "A", Crossed.A),
    # Literal: exact values, unambiguous case-insensitive strings, ints from strings
    (Literal["yes", "no"], "yes", "yes"),
    (Literal["yes", "no"], "NO", "no"),
    (Literal["yes", "no"], '{"value": "Yes"}', "yes"),
    (Literal[1, 2], "2", 2),
    (Literal[1, 2], '"1"', 1),
    (Literal["a", 1], "1", 1),
    # optional values
    (int | None, "null", None),
    (int | None, '{"value": null}', None),
    (int | None, "5", 5),
    (int | None, "", None),
    (str | None, "just some text", "just some text"),
    (str | None, '{"value": "x"}', "x"),
    # containers
    (list[int], "[1, 2, 3]", [1, 2, 3]),
    (list[int], '{"value": [1, 2]}', [1, 2]),
    (list[int], "Numbers: [1, 2, 3].", [1, 2, 3]),
    (list[int], "```\n[4]\n```", [4]),
    (list[int], "see [note] then [5, 6]", [5, 6]),
    (set[str], '["a", "b", "a"]', {"a", "b"}),
    (set[Sentiment], '["positive", "NEGATIVE"]', {Sentiment.POSITIVE, Sentiment.NEGATIVE}),
    (frozenset[int], "[3, 3]", frozenset({3})),
    (tuple[int, ...], "[1, 2]", (1, 2)),
    (tuple[int, str], '[1, "a"]', (1, "a")),
    (dict[str, int], '{"a": 1}', {"a": 1}),
    (dict[str, int], '```json\n{"a": 1}\n```', {"a": 1}),
    (dict[str, list[int]], 'Here: {"a": [1], "b": []} done', {"a": [1], "b": []}),
    (dict[str, int], '{"value": {"a": 1}}', {"a": 1}),
    (list[Sentiment], '["Positive"]', [Sentiment.POSITIVE]),
    (Annotated[int, Field(ge=0)], "3", 3),
]


@pytest.mark.parametrize(("annotation", "text", "expected"), HAPPY)
def test_accepted_forms(annotation: Any, text: str, expected: Any) -> None:
    value = parse(annotation, text)
    assert value == expected
    assert type(value) is type(expected)


VERDICT = '{"sentiment": "positive", "score": 0.9, "label": 3}'
VERDICT_VALUE = Verdict(sentiment="positive", score=0.9, label=3)


@pytest.mark.parametrize(
    "text",
    [
        VERDICT,
        f"  {VERDICT}\n",
        f"```json\n{VERDICT}\n```",
        f"Sure! Here it is:\n```\n{VERDICT}\n```\nAnything else?",
        f"The result is {VERDICT}. Hope that helps.",
        f'{{"value": {VERDICT}}}',
        f"```json\n{VERDICT}",  # a fence the model never closed
        f"I think [this] is it: {VERDICT}",
    ],
)
def test_pydantic_model_forms(text: str) -> None:
    assert parse(Verdict, text) == VERDICT_VALUE


def test_pydantic_model_fields_validate_in_lax_mode() -> None:
    value = parse(Verdict, '{"sentiment": "positive", "score": "0.5", "label": "3"}')
    assert value == Verdict(sentiment="positive", score=0.5, label=3)


def test_optional_model_accepts_the_bare_object_the_wrapper_and_null() -> None:
    assert parse(Verdict | None, VERDICT) == VERDICT_VALUE
    assert parse(Verdict | None, f'{{"value": {VERDICT}}}') == VERDICT_VALUE
    assert parse(Verdict | None, "null") is None


def test_a_union_with_str_takes_prose_whole_never_a_piece_of_json_inside_it() -> None:
    prose = 'Set the header to {"Accept": "application/json"} and retry.'
    fenced = 'Run this:\n```\n"hello"\n```\nthen check the output.'
    for shape in (str | None, int | str):
        assert parse(shape, prose) == prose
        assert parse(shape, fenced) == fenced
    assert parse(str | None, '{"value": "hi"}') == "hi"  # the structured answer
    # A fenced block may hold the JSON of the union's other members.
    verdict = f"Here it is:\n```json\n{VERDICT}\n```"
    assert parse(Verdict | str, verdict) == VERDICT_VALUE
    assert parse(list[int] | str, "```\n[1, 2]\n```") == [1, 2]
    assert parse(Verdict | str, prose) == prose
    assert parse(str | None, "") is None
    assert parse(int | str, "42") == 42


def test_a_union_with_str_reads_a_whole_answer_of_another_members_json_as_that() -> None:
    # As `Verdict | None` reads it: the answer is JSON of the type, so it is not the str.
    assert parse(Verdict | str, VERDICT) == VERDICT_VALUE
    assert parse(Verdict | str, f"  {VERDICT}\n") == VERDICT_VALUE
    assert parse(list[int] | str, "[1, 2]") == [1, 2]
    assert parse(Verdict | str, '{"other": 1}') == '{"other": 1}'  # JSON of no member: text
    assert parse(Verdict | str, f"It is {VERDICT}") == f"It is {VERDICT}"


def test_decimals_keep_every_digit_as_written() -> None:
    class Invoice(BaseModel):
        total: Decimal
        weight: float

    exact = "12345678901234567.89"
    assert parse(Decimal, exact) == Decimal(exact)
    assert str(parse(Decimal, "1.10")) == "1.10"
    assert parse(Decimal, f'{{"value": {exact}}}') == Decimal(exact)
    assert parse(Decimal, f'{{"answer": {exact}}}') == Decimal(exact)
    assert parse(list[Decimal], f"[{exact}, 0.10]") == [Decimal(exact), Decimal("0.10")]
    assert parse(dict[str, Decimal | None], '{"a": 0.10, "b": null}') == {
        "a": Decimal("0.10"),
        "b": None,
    }
    # Inside a model, pydantic's JSON mode reads the number (as a float first): the model's
    # other fields keep their JSON readings; an amount sent as a string keeps every digit.
    invoice = parse(Invoice, f'Here: {{"total": "{exact}", "weight": 1.5}}')
    assert invoice == Invoice(total=Decimal(exact), weight=1.5)


Money = typing.NewType("Money", Decimal)
Feeling = typing.NewType("Feeling", Sentiment)
Mood = typing_extensions.TypeAliasType("Mood", Sentiment)
Choice = typing_extensions.TypeAliasType("Choice", Literal["yes", "no"])
Prices = typing_extensions.TypeAliasType("Prices", list[Money])


def test_new_types_and_aliases_read_as_the_types_they_stand_for() -> None:
    exact = "12345678901234567.89"
    assert str(parse(Money, "1.10")) == "1.10"
    assert parse(list[Money], f"[1.10, {exact}]") == [Decimal("1.10"), Decimal(exact)]
    assert parse(Prices, f"[{exact}]") == [Decimal(exact)]
    assert parse(Feeling, '"POSITIVE"') is Sentiment.POSITIVE
    assert parse(Mood, "POSITIVE") is Sentiment.POSITIVE
    assert parse(Choice, "yes") == "yes"


class Found(BaseModel):
    name: str | None = None
    age: int | None = None


@dataclasses.dataclass
class FoundPoint:
    x: int = 0
    y: int = 0


class FoundPrefs(typing_extensions.TypedDict, total=False):
    theme: str


@pytest.mark.parametrize(
    ("annotation", "inner", "expected"),
    [
        (Found, '{"name": "Bob", "age": 42}', Found(name="Bob", age=42)),
        (FoundPoint, '{"x": 1, "y": 2}', FoundPoint(1, 2)),
        (FoundPrefs, '{"theme": "dark"}', {"theme": "dark"}),
    ],
)
def test_an_object_type_without_required_fields_unwraps_its_answer(
    annotation: Any, inner: str, expected: Any
) -> None:
    # Any object validates as such a type (unknown keys ignored, defaults for the rest):
    # read as one, {"value": {...}} would come out as the defaults, its data lost.
    assert parse(annotation, f'{{"value": {inner}}}') == expected
    assert parse(annotation, f'Here it is: {{"value": {inner}}}') == expected
    assert parse(annotation, inner) == expected
    assert parse(annotation, "{}") == annotation()  # nothing found is an answer


@dataclasses.dataclass
class AliasedBox:
    width: Annotated[int, Field(alias="w")] = 0


class AliasedOptions(typing_extensions.TypedDict, total=False):
    color: Annotated[str, Field(alias="colour")]


class Counts(RootModel[dict[str, int]]):
    root: dict[str, int] = {}


class Renamed(BaseModel):
    name: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _full_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and "fullName" in data:
            return {"name": data["fullName"]}
        return data


@pytest.mark.parametrize(
    ("annotation", "text", "expected"),
    [
        (AliasedBox, '{"w": 5}', AliasedBox(5)),
        (AliasedOptions, '{"colour": "red"}', {"color": "red"}),
        (Counts, '{"apples": 3}', Counts({"apples": 3})),
        (Renamed, '{"fullName": "Ada"}', Renamed(name="Ada")),
    ],
)
def test_types_without_required_fields_take_the_keys_they_read(
    annotation: Any, text: str, expected: Any
) -> None:
    # Aliases as the schema asks for them, a root model's own keys, a model validator's.
    assert parse(annotation, text) == expected


def test_an_object_with_none_of_the_fields_of_a_type_without_required_ones_is_refused() -> None:
    with pytest.raises(ValueError, match="none of the fields age, name"):
        parse(Found, '{"person": "Bob", "years": 42}')


@pytest.mark.parametrize(
    ("annotation", "text"),
    [
        (Found | None, '{"person": "Bob", "years": 42}'),
        (Found | None, '{"value": {"person": "Bob"}}'),
        (Found, '{"value": {"person": "Bob"}}'),
        (list[Found], '[{"name": "Ada"}, {"person": "Bob"}]'),
        (list[Found], '{"value": [{"person": "Bob"}]}'),
        (dict[str, Found], '{"a": {"person": "Bob"}}'),
        (tuple[FoundPoint, ...], '[{"z": 1}]'),
        (list[FoundPrefs] | None, '[{"colour": "red"}]'),
    ],
)
def test_objects_with_none_of_the_fields_are_refused_wherever_the_type_stands(
    annotation: Any, text: str
) -> None:
    # Beside None, as items, as values, and inside the {"value": ...} wrapper: each would
    # otherwise be read as the defaults, losing what the model answered.
    with pytest.raises(ValueError, match="none of the fields"):
        parse(annotation, text)


class Sparse(typing.TypedDict):
    # typing.TypedDict, keys NotRequired as strings (this module postpones annotations):
    # Python 3.11 counts them as required; the plan reads them as written.
    name: typing.NotRequired[str]
    age: typing.NotRequired[int]


def test_a_typeddict_of_not_required_keys_written_as_strings_refuses_other_objects() -> None:
    assert parse(Sparse, '{"value": {"name": "Bob", "age": 42}}') == {"name": "Bob", "age": 42}
    with pytest.raises(ValueError, match="none of the fields age, name"):
        parse(Sparse, '{"person": {"name": "Bob"}}')


class OpenTags(typing_extensions.TypedDict, total=False):
    __pydantic_config__ = ConfigDict(extra="allow")  # type: ignore[misc]
    color: str


def test_a_typeddict_that_allows_extra_keys_takes_any_object() -> None:
    assert parse(list[OpenTags], '[{"size": "XL"}]') == [{"size": "XL"}]


def test_objects_with_their_fields_are_read_wherever_the_type_stands() -> None:
    assert parse(Found | None, '{"name": "Ada"}') == Found(name="Ada")
    assert parse(Found | None, "null") is None
    assert parse(list[Found], '[{"name": "Ada"}, {}]') == [Found(name="Ada"), Found()]
    assert parse(dict[str, Found], '{"a": {"age": 3}}') == {"a": Found(age=3)}


def test_a_strict_model_without_required_fields_keeps_its_json_readings() -> None:
    class StrictFound(BaseModel):
        model_config = ConfigDict(strict=True)
        when: date | None = None

    assert parse(list[StrictFound], '[{"when": "2024-05-01"}]') == [
        StrictFound(when=date(2024, 5, 1))
    ]


def test_a_strict_model_with_a_decimal_keeps_its_json_readings() -> None:
    class Strict(BaseModel):
        model_config = ConfigDict(strict=True)
        amount: Decimal
        due: date
        when: datetime | str

    value = parse(Strict, '{"amount": 12, "due": "2024-05-01", "when": "2024-05-01T10:00:00"}')
    assert value.due == date(2024, 5, 1)
    assert value.amount == Decimal(12)
    assert isinstance(value.when, datetime)


def test_list_of_models() -> None:
    text = f'{{"value": [{VERDICT}, {VERDICT}]}}'
    assert parse(list[Verdict], text) == [VERDICT_VALUE, VERDICT_VALUE]


def test_dataclass() -> None:
    assert parse(Point, '{"x": 1, "y": "2"}') == Point(1, 2)
    assert parse(Labelled, 'Result:\n```json\n{"label": "a"}\n```') == Labelled("a")


def test_recursive_model() -> None:
    value = parse(Node, '{"name": "a", "children": [{"name": "b"}]}')
    assert value == Node(name="a", children=[Node(name="b")])


def test_generic_model() -> None:
    assert parse(Page[int], '{"items": [1, 2]}') == Page[int](items=[1, 2])


def test_typing_extensions_typeddict() -> None:
    assert parse(ModernTD, '{"city": "Oslo"}') == {"city": "Oslo"}


# --- typing.TypedDict (re-created for pydantic on Python < 3.12) --------------------------


def test_typing_typeddict_parses_with_required_and_optional_keys() -> None:
    assert parse(Counted, '{"word": "hi"}') == {"word": "hi"}
    assert parse(Counted, '{"word": "hi", "count": "2"}') == {"word": "hi", "count": 2}
    with pytest.raises(ValueError, match="word"):
        parse(Counted, '{"count": 2}')


def test_typing_typeddict_nested_and_recursive() -> None:
    text = '{"name": "Ann", "home": {"city": "Oslo"}, "others": [{"name": "Bo"}]}'
    assert parse(Person, text) == {
        "name": "Ann",
        "home": {"city": "Oslo"},
        "others": [{"name": "Bo"}],
    }
    with pytest.raises(ValueError, match="city"):
        parse(Person, '{"name": "Ann", "home": {}}')


def test_typing_typeddict_schema_keeps_names_and_required_keys() -> None:
    schema = schema_of(Person)
    assert schema["title"] == "Person"
    assert schema["required"] == ["name"]
    assert set(schema["properties"]) == {"name", "age", "home", "others"}
    assert schema["$defs"]["Address"]["required"] == ["city"]
    assert not strict_of(Person)  # optional keys cannot be said in strict mode
    assert schema_of(Counted)["required"] == ["word"]


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="pydantic reads these natively")
def test_generic_typing_typeddict_names_the_fix() -> None:
    class Box(typing.TypedDict, Generic[T]):
        item: T

    with pytest.raises(UnsupportedOutputType, match=r"typing_extensions\.TypedDict"):
        plan_output(Box[int])
    with pytest.raises(UnsupportedOutputType, match=r"typing_extensions\.TypedDict"):
        plan_output(Box)


def test_typeddict_with_unresolvable_annotation_is_rejected_at_plan_time() -> None:
    class Broken(typing.TypedDict):
        thing: Missing  # type: ignore[name-defined]  # noqa: F821

    with pytest.raises(UnsupportedOutputType, match="Broken"):
        plan_output(Broken)


# --- failures: a clear message fit to send back to the model -------------------------------

FAILURES: list[tuple[Any, str | None, str]] = [
    (int, "42.5", "fractional part"),
    (int, "forty-two", "valid integer"),
    (int, '{"value": "abc"}', "value: Input should be a valid integer"),
    (int, "", "The answer was empty; expected int"),
    (int, None, "The answer was empty"),
    (bool, "maybe", "valid boolean"),
    (float, "a lot", "valid number"),
    (Decimal, "about ten", "decimal"),
    (date, "May first", "valid date"),
    (datetime, "yesterday", "valid datetime"),
    (Sentiment, "neutral", "'positive' or 'negative'"),
    (Level, "3", "1 or 2"),
    (Literal["yes", "no"], "maybe", "'yes' or 'no'"),
    (Literal["yes", "Yes"], "YES", "'yes' or 'Yes'"),  # ambiguous in any case
    (list[int], '[1, "x"]', "1: Input should be a valid integer"),
    (list[int], "no list here", "not JSON for list[int]"),
    (set[int], '{"value": 3}', "valid set"),
    (tuple[int, str], "[1]", "Field required"),
    (dict[str, int], '{"a": "b"}', "a: Input should be a valid integer"),
    (Verdict, '{"sentiment": "positive"}', "score: Field required"),
    (Verdict, "I cannot answer that.", "not JSON for Verdict"),
    (Verdict | None, '{"sentiment": "x", "score": "high", "label": 1}', "score"),
    (Point, '{"x": 1}', "y: Field required"),
    (Annotated[int, Field(ge=0)], "-1", "greater than or equal to 0"),
]


@pytest.mark.parametrize(("annotation", "text", "fragment"), FAILURES)
def test_failures_say_what_failed_and_ask_again(
    annotation: Any, text: str | None, fragment: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(fragment)) as caught:
        parse(annotation, text)
    message = str(caught.value)
    assert message.endswith(RETRY_HINT)
    assert "errors.pydantic.dev" not in message


def test_failure_names_the_declared_type() -> None:
    with pytest.raises(ValueError, match=re.escape("not a valid list[Verdict]")):
        parse(list[Verdict], '[{"sentiment": "x"}]')


def test_failure_message_is_trimmed() -> None:
    with pytest.raises(ValueError) as caught:
        parse(list[int], '["' + '", "'.join("x" * 200 for _ in range(10)) + '"]')
    message = str(caught.value)
    assert "and 7 more errors" in message
    assert len(message) < 800


# --- unsupported types: refused when the service is built ----------------------------------

UNSUPPORTED: list[tuple[Any, str]] = [
    (list, "a bare list has no item type; declare one, e.g. list[str]"),
    (typing.List, "a bare list has no item type"),  # noqa: UP006
    (set, "a bare set"),
    (dict, "a bare dict has no key and value types"),
    (typing.Dict, "a bare dict"),  # noqa: UP006
    (tuple, "a bare tuple"),
    (dict[int, str], "must be str, because JSON object keys are strings"),
    (Any, "Any says nothing about the answer's shape"),
    (object, "object says nothing"),
    (None, "a method must return something"),
    (type(None), "a method must return something"),
    (Plain, "Plain is a plain class; make it a pydantic model, a dataclass or a TypedDict"),
    (complex, "complex is a plain class"),
    (list[Plain], "Plain is a plain class"),
    (dict[str, list[Plain]], "Plain is a plain class"),
    ("Verdict", "unresolved forward reference"),
    (list["Verdict"], "unresolved forward reference"),
    (Sequence[int], "Sequence is an abstract collection; declare list[T]"),
    (Mapping[str, int], "Mapping is an abstract collection; declare dict[str, T]"),
    (typing.Callable[[], int], "cannot be read from a JSON answer"),
    (Literal[1.5], "is not a str, int, bool, None or enum member"),
    (tuple[()], "an empty tuple"),
    (set[Verdict], "the items of a set must be hashable, and Verdict is not"),
    (frozenset[Point], "make it frozen"),
    (set[list[int]], "list[int] is not; declare list[list[int]]"),
    (set[dict[str, int] | None], "is not, as it holds a dict[str, int]"),
    (set[FrozenTags], "FrozenTags is not, as it holds a list[str]; declare list[FrozenTags]"),
    (set[tuple[list[int], ...]], "as it holds a list[int]"),
    (set[FoundPrefs], "FoundPrefs is not"),
    (Result[int] | None, "Result[T] wraps the whole return type"),
    (list[Result[int]], "declare Result[T | None]"),
]


@pytest.mark.parametrize(("annotation", "fragment"), UNSUPPORTED)
def test_unsupported_types_are_refused_at_plan_time(annotation: Any, fragment: str) -> None:
    with pytest.raises(UnsupportedOutputType, match=re.escape(fragment)) as caught:
        plan_output(annotation)
    message = str(caught.value)
    assert "is not a supported return type" in message
    assert "Supported: str, AiMessage, bool, int" in message
    assert isinstance(caught.value, TypeError)


def test_model_pydantic_cannot_describe_is_refused() -> None:
    class Holder(BaseModel):
        model_config = ConfigDict(arbitrary_types_allowed=True)
        thing: Plain

    with pytest.raises(UnsupportedOutputType, match="Holder is not a supported return type"):
        plan_output(Holder)


# --- schemas sent to the model ------------------------------------------------------------


@pytest.mark.parametrize(
    ("annotation", "inner"),
    [
        (int, {"type": "integer"}),
        (bool, {"type": "boolean"}),
        (list[int], {"type": "array", "items": {"type": "integer"}}),
        (set[int], {"type": "array", "items": {"type": "integer"}}),  # uniqueItems dropped
        (int | None, {"anyOf": [{"type": "integer"}, {"type": "null"}]}),
        (date, {"type": "string", "format": "date"}),
        (Literal["a", "b"], {"type": "string", "enum": ["a", "b"]}),
        (Sentiment, {"type": "string", "enum": ["positive", "negative"], "title": "Sentiment"}),
    ],
)
def test_non_objects_travel_wrapped_in_value(annotation: Any, inner: dict[str, Any]) -> None:
    assert schema_of(annotation) == wrapped(inner)
    assert strict_of(annotation)


def test_list_of_models_keeps_definitions_at_the_root() -> None:
    schema = schema_of(list[Verdict])
    assert schema["properties"]["value"]["items"] == {"$ref": "#/$defs/Verdict"}
    assert schema["$defs"]["Verdict"]["additionalProperties"] is False
    assert strict_of(list[Verdict])


def test_model_schema_is_the_object_itself_made_strict() -> None:
    assert schema_of(Verdict) == {
        "title": "Verdict",
        "type": "object",
        "properties": {
            "sentiment": {"title": "Sentiment", "type": "string"},
            "score": {"title": "Score", "type": "number"},
            "label": {"title": "Label", "type": "integer"},
        },
        "required": ["sentiment", "score", "label"],
        "additionalProperties": False,
    }
    assert strict_of(Verdict)
    assert strict_of(Point)


def test_enum_values_that_are_not_text_are_described_by_their_members_names() -> None:
    # A model answering under strict output can send only the values: the schema says
    # which member each one is.
    schema = _schema(Color)["properties"]["value"]
    assert schema["enum"] == [1, 2]
    assert schema["description"] == "A colour. (1 = RED, 2 = GREEN)"
    assert _schema(Size)["properties"]["value"]["description"] == (
        '[1,"small"] = SMALL, [2,"large"] = LARGE'
    )
    assert "description" not in _schema(Sentiment)["properties"]["value"]

    class Task(BaseModel):
        level: Level
        urgency: Level = Field(description="How soon")

    schema = _schema(Task)
    assert schema["$defs"]["Level"]["description"] == "1 = LOW, 2 = HIGH"
    # A field's own description would hide the enum's: the meanings go with it.
    assert schema["properties"]["urgency"]["description"] == "How soon (1 = LOW, 2 = HIGH)"


def _schema(annotation: Any) -> dict[str, Any]:
    response_format = plan_output(annotation).response_format
    assert response_format is not None
    return response_format.schema


def test_optional_none_field_becomes_required_nullable_and_enum_ref_is_inlined() -> None:
    schema = schema_of(Annotated3)
    assert schema["required"] == ["sentiment", "note"]
    assert "default" not in schema["properties"]["note"]
    sentiment = schema["properties"]["sentiment"]
    assert "$ref" not in sentiment
    assert sentiment["description"] == "overall tone"
    assert sentiment["enum"] == ["positive", "negative"]
    assert "$defs" not in schema  # nothing left to refer to
    assert strict_of(Annotated3)
    # A null for the promoted field gives the declared default.
    assert parse(Annotated3, '{"sentiment": "positive", "note": null}').note is None
    assert parse(Annotated3, '{"sentiment": "positive"}').note is None


def test_recursive_model_has_an_object_root_and_keeps_its_definition() -> None:
    schema = schema_of(Tree)
    assert schema["type"] == "object"
    assert schema["required"] == ["label", "child"]
    assert schema["properties"]["child"]["anyOf"][0] == {"$ref": "#/$defs/Tree"}
    assert schema["$defs"]["Tree"]["additionalProperties"] is False
    assert strict_of(Tree)
    value = parse(Tree, '{"label": "a", "child": {"label": "b", "child": null}}')
    assert value == Tree(label="a", child=Tree(label="b"))


@pytest.mark.parametrize(
    ("annotation", "why"),
    [
        (WithDefault, "a field with a non-None default is optional"),
        (dict[str, int], "a dict's keys are not known in advance"),
        (Open, "extra='allow' admits additional properties"),
        (tuple[int, str], "prefixItems"),
        (Literal[1, "a"], "an enum of mixed types has no type"),
        (Annotated[str, Field(max_length=5)], "maxLength"),
        (Person, "optional TypedDict keys"),
        (Node, "a field with a default factory is optional"),
    ],
)
def test_strict_is_false_when_strict_mode_would_reject_the_schema(
    annotation: Any, why: str
) -> None:
    assert not strict_of(annotation), why


def test_non_strict_objects_still_forbid_extra_keys_where_declared() -> None:
    schema = schema_of(WithDefault)
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["name"]
    assert schema["properties"]["language"]["default"] == "en"
    assert schema_of(Open)["additionalProperties"] is True


def test_dict_is_an_object_and_is_not_wrapped() -> None:
    assert schema_of(dict[str, list[int]]) == {
        "type": "object",
        "additionalProperties": {"type": "array", "items": {"type": "integer"}},
    }


def test_objects_nested_deeper_than_ten_levels_are_not_strict() -> None:
    model: type[BaseModel] = Verdict
    for depth in range(10):
        model = type(f"Level{depth}", (BaseModel,), {"__annotations__": {"inner": model}})
    assert not strict_of(model)  # 11 levels
    assert strict_of(model.model_fields["inner"].annotation)  # 10 levels


@pytest.mark.parametrize(
    ("annotation", "name"),
    [
        (Verdict, "Verdict"),
        (int, "int"),
        (list[int], "list_int"),
        (dict[str, list[int]], "dict_str_list_int"),
        (int | None, "int_or_None"),
        (Verdict | None, "Verdict_or_None"),
        (Literal["a", "b"], "Literal_a_b"),
        (Page[int], "Page_int"),
        (tuple[int, ...], "tuple_int"),
        (Annotated[int, Field(ge=0)], "int"),
        (Literal["débâcle!"], "Literal_d_b_cle"),
    ],
)
def test_response_format_name(annotation: Any, name: str) -> None:
    response_format = plan_output(annotation).response_format
    assert response_format is not None
    assert response_format.name == name
    assert NAME_RULE.match(name)


def test_long_names_are_cut_to_64_characters() -> None:
    long_type = Literal[tuple(f"choice_number_{i}" for i in range(20))]  # type: ignore[valid-type]
    response_format = plan_output(long_type).response_format
    assert response_format is not None
    assert NAME_RULE.match(response_format.name)


@pytest.mark.parametrize("text", ["[" * 50_000 + "]" * 50_000, "see " + "[" * 100_000])
def test_pathologically_nested_answers_fail_cleanly(text: str) -> None:
    with pytest.raises(ValueError, match=re.escape(RETRY_HINT)):
        parse(list[int], text)
    with pytest.raises(ValueError, match=re.escape(RETRY_HINT)):
        parse(Verdict, text)


@pytest.mark.parametrize("shape", [AiMessage | None, list[AiMessage], dict[str, UserMessage]])
def test_a_message_type_inside_another_type_is_refused(shape: Any) -> None:
    # It would be asked for as JSON of the message's own fields.
    with pytest.raises(UnsupportedOutputType, match=r"is returned alone \(`-> AiMessage`"):
        plan_output(shape)


def test_times_durations_and_uuids_are_read_as_values() -> None:
    import uuid
    from datetime import time, timedelta

    uid = "123e4567-e89b-12d3-a456-426614174000"
    assert parse(uuid.UUID, uid) == uuid.UUID(uid)
    assert parse(uuid.UUID, f'{{"value": "{uid}"}}') == uuid.UUID(uid)
    assert parse(timedelta, "PT1H30M") == timedelta(hours=1, minutes=30)
    assert parse(timedelta, '{"value": 90}') == timedelta(seconds=90)
    assert parse(time, "`14:30`") == time(14, 30)
    assert parse(list[timedelta], '["PT5M", 60]') == [timedelta(minutes=5), timedelta(minutes=1)]
    fmt = plan_output(uuid.UUID).response_format
    assert fmt is not None
    assert fmt.schema["properties"]["value"] == {"format": "uuid", "type": "string"}

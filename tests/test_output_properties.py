"""Invariants of typed-output parsing: what is dumped as JSON reads back, however wrapped."""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Callable
from datetime import date
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from aiservices._output import plan_output


class Mood(enum.Enum):
    CALM = "calm"
    ANGRY = "angry"
    SLEEPY = "sleepy"


class Rank(enum.IntEnum):
    FIRST = 1
    SECOND = 2


@dataclasses.dataclass
class Sample:
    name: str
    count: int
    tags: list[str]
    ok: bool
    ratio: float | None


class Item(BaseModel):
    title: str
    qty: int


class Order(BaseModel):
    customer: str
    total: float
    placed: date
    mood: Mood
    items: list[Item]
    note: str | None = None


RETRY_HINT = "Answer again with JSON matching the schema."

# Prose that cannot itself look like JSON or a fence.
prose = st.text(alphabet="abcdefghij XYZ.,:;!?-\n", max_size=40)
finite = st.floats(allow_nan=False, allow_infinity=False)

samples = st.builds(
    Sample,
    name=st.text(),
    count=st.integers(),
    tags=st.lists(st.text(), max_size=4),
    ok=st.booleans(),
    ratio=st.none() | finite,
)
items = st.builds(Item, title=st.text(), qty=st.integers(min_value=-(2**63), max_value=2**63 - 1))
orders = st.builds(
    Order,
    customer=st.text(),
    total=finite,
    placed=st.dates(),
    mood=st.sampled_from(Mood),
    items=st.lists(items, max_size=3),
    note=st.none() | st.text(),
)


Form = Callable[[str, str, str], str]

FORMS: dict[str, Form] = {
    "bare": lambda text, before, after: text,
    "fenced": lambda text, before, after: f"```json\n{text}\n```",
    "fenced without language, in prose": lambda text, before, after: (
        f"{before}\n```\n{text}\n```\n{after}"
    ),
    "in prose": lambda text, before, after: f"{before} {text} {after}",
    "wrapped in value": lambda text, before, after: f'{{"value": {text}}}',
    "wrapped in value, in prose": lambda text, before, after: (
        f'{before} {{"value": {text}}} {after}'
    ),
}


def check_round_trip(annotation: Any, value: Any, data: st.DataObject) -> None:
    plan = plan_output(annotation)
    indent = data.draw(st.sampled_from([None, 2]), label="indent")
    text = json.dumps(to_jsonable_python(value), indent=indent)
    before, after = data.draw(prose, label="before"), data.draw(prose, label="after")
    for name, form in FORMS.items():
        answer = form(text, before, after)
        assert plan.parse(answer) == value, name


@given(st.lists(st.integers()), st.data())
def test_list_of_int_round_trips(value: list[int], data: st.DataObject) -> None:
    check_round_trip(list[int], value, data)


@given(st.dictionaries(st.text(), finite), st.data())
def test_dict_of_float_round_trips(value: dict[str, float], data: st.DataObject) -> None:
    check_round_trip(dict[str, float], value, data)


@given(samples, st.data())
def test_dataclass_round_trips(value: Sample, data: st.DataObject) -> None:
    check_round_trip(Sample, value, data)


@given(orders, st.data())
def test_pydantic_model_round_trips(value: Order, data: st.DataObject) -> None:
    check_round_trip(Order, value, data)


@given(st.lists(orders, max_size=3), st.data())
def test_list_of_models_round_trips(value: list[Order], data: st.DataObject) -> None:
    check_round_trip(list[Order], value, data)


@given(st.sets(st.integers()) | st.none(), st.data())
def test_optional_set_round_trips(value: set[int] | None, data: st.DataObject) -> None:
    plan = plan_output(set[int] | None)
    dumped = json.dumps(sorted(value) if value is not None else None)
    assert plan.parse(dumped) == value
    assert plan.parse(f'{{"value": {dumped}}}') == value
    assert plan.parse(f"```json\n{dumped}\n```") == value


def random_case(word: str, flips: list[bool]) -> str:
    return "".join(c.upper() if flip else c.lower() for c, flip in zip(word, flips, strict=False))


@given(st.sampled_from(Mood), st.booleans(), st.lists(st.booleans(), min_size=6, max_size=6))
def test_enum_reads_name_or_value_in_any_case(
    member: Mood, by_name: bool, flips: list[bool]
) -> None:
    spelled = random_case(member.name if by_name else member.value, flips)
    plan = plan_output(Mood)
    assert plan.parse(spelled) is member
    assert plan.parse(json.dumps(spelled)) is member
    assert plan.parse(json.dumps({"value": spelled})) is member


@given(st.sampled_from(Rank), st.booleans())
def test_int_enum_reads_its_value_as_text_or_number(member: Rank, quoted: bool) -> None:
    text = f'"{member.value}"' if quoted else str(member.value)
    assert plan_output(Rank).parse(text) is member
    assert plan_output(Rank).parse(member.name.lower()) is member


# "{}.0" is a float literal: exact only up to 2**53.
@given(
    st.integers(min_value=-(2**53), max_value=2**53),
    st.sampled_from(["{}", '"{}"', "{}.0", '{{"value": {}}}', " {} \n"]),
)
def test_int_reads_integral_forms(value: int, template: str) -> None:
    assert plan_output(int).parse(template.format(value)) == value


def outcome(annotation: Any, text: str) -> tuple[Any, str]:
    try:
        return plan_output(annotation).parse(text), ""
    except ValueError as error:
        return None, str(error)


@given(st.text())
def test_any_text_gives_a_model_or_a_value_error_asking_again(text: str) -> None:
    value, error = outcome(Order, text)
    assert isinstance(value, Order) or error.endswith(RETRY_HINT)


@given(st.text())
def test_any_text_gives_an_int_or_a_value_error_asking_again(text: str) -> None:
    value, error = outcome(int, text)
    assert type(value) is int or error.endswith(RETRY_HINT)

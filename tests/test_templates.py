"""Templates: parsed once, rendered in one pass, values never rendered again."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from aiservices._templates import Template, render_value


def test_placeholders_are_found_in_order_with_spaces_allowed() -> None:
    template = Template.parse("Dear {{ name }}, about {{topic}}: {{name}}")
    assert template.names == ("name", "topic", "name")
    assert template.variables == {"name", "topic"}
    assert template.render({"name": "Ann", "topic": "tea"}) == "Dear Ann, about tea: Ann"


def test_text_without_placeholders_is_returned_as_is() -> None:
    assert Template.parse("just {text} and {{").render({}) == "just {text} and {{"


def test_a_placeholder_that_is_not_a_name_is_an_error() -> None:
    with pytest.raises(ValueError, match="must hold a name"):
        Template.parse("{{ not a name }}")


def test_unknown_names_exclude_known_and_builtin_variables() -> None:
    template = Template.parse("{{a}} {{b}} {{current_date}} {{b}}")
    assert template.unknown(["a"]) == ["b"]


def test_builtin_dates_render_when_no_value_is_given() -> None:
    text = Template.parse("{{current_date}}|{{current_date_time}}").render({})
    assert re.fullmatch(r"\d{4}-\d\d-\d\d\|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d", text)


class Item(BaseModel):
    name: str


@dataclass
class Point:
    x: int


def test_values_render_as_text_or_json() -> None:
    assert render_value("a") == "a"
    assert render_value(3) == "3"
    assert render_value(Item(name="pen")) == '{"name":"pen"}'
    assert render_value(Point(1)) == '{"x":1}'
    assert render_value({"k": [1, 2]}) == '{"k":[1,2]}'
    assert render_value(["a"]) == '["a"]'


def test_a_value_without_json_form_inside_a_structure_is_written_as_its_str() -> None:
    class Handle:
        def __str__(self) -> str:
            return "handle #7"

    assert render_value({"who": Handle(), "n": 1}) == '{"who":"handle #7","n":1}'


@given(st.text(), st.text())
def test_values_are_inserted_verbatim_never_rendered_again(a: str, b: str) -> None:
    template = Template.parse("<{{a}}|{{b}}>")
    assert template.render({"a": a, "b": b}) == f"<{a}|{b}>"


def test_a_prompt_decorator_given_twice_to_one_method_is_an_error() -> None:
    from aiservices import system_message, user_message

    with pytest.raises(TypeError, match=r"@system_message is given twice"):

        @system_message("Be brief")
        @system_message("Be kind")
        def chat(message: str) -> str: ...

    with pytest.raises(TypeError, match=r"@user_message is given twice"):

        @user_message("A {{x}}")
        @user_message("B {{x}}")
        def ask(x: str) -> str: ...


def test_values_json_cannot_hold_fall_back_to_their_text() -> None:
    @dataclass
    class Blob:
        data: bytes

    looped: list[object] = [1]
    looped.append(looped)
    assert render_value(Blob(b"\xff")).endswith("Blob(data=b'\\xff')")
    assert render_value([b"\xff"]) == "[b'\\xff']"
    assert render_value(looped) == "[1, [...]]"
    assert render_value({"ratio": float("nan")}) == '{"ratio":"NaN"}'  # valid JSON


def test_a_set_renders_in_the_same_order_in_every_process() -> None:
    names = {f"name{i}" for i in range(12)}
    assert render_value(names) == json.dumps(sorted(names), separators=(",", ":"))
    assert render_value({"tags": frozenset(names)}) == render_value({"tags": sorted(names)})
    assert render_value([{3, 1, 2}]) == "[[1,2,3]]"
    # Items that do not compare with each other are ordered by type and text.
    assert render_value({2, "b", 1, "a"}) == '[1,2,"a","b"]'

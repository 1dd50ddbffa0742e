"""The one plan every store's update_messages carries out (hypothesis)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from aiservices.messages import UserMessage, message_to_json
from aiservices.stores._common import plan_update

ids = st.lists(st.sampled_from("abcdefgh"), unique=True, max_size=8)
texts = st.sampled_from(["1", "2"])


@given(
    stored=ids.flatmap(
        lambda i: st.tuples(st.just(i), st.lists(texts, min_size=len(i), max_size=len(i)))
    ),
    wanted=ids.flatmap(
        lambda i: st.tuples(st.just(i), st.lists(texts, min_size=len(i), max_size=len(i)))
    ),
)
def test_carrying_out_the_plan_gives_the_wanted_window(
    stored: tuple[list[str], list[str]], wanted: tuple[list[str], list[str]]
) -> None:
    rows = list(zip(*stored, strict=True))
    want = list(zip(*wanted, strict=True))
    plan = plan_update(rows, want)
    leaving = [*plan.removed, *plan.changed]
    window = [row for row in rows if row[0] not in leaving]
    history = [row for row in rows if row[0] in leaving]
    if plan.rewrite:
        window = []
    window += want[plan.fresh :]
    assert window == want
    # Only what leaves or changes reaches history; a message wanted as it is never does.
    assert {mid for mid, _ in history} == {mid for mid, _ in rows} - set(plan.staying)
    assert all(dict(want).get(mid) != text for mid, text in history)
    # Nothing is written when nothing changed.
    if rows == want:
        assert not leaving
        assert not plan.rewrite
        assert plan.fresh == len(want)


def test_a_text_in_an_older_key_order_is_the_same_message() -> None:
    message = UserMessage("hi", message_id="m1")
    canonical = message_to_json(message)
    reordered = json.dumps(dict(reversed(list(json.loads(canonical).items()))))
    assert reordered != canonical
    plan = plan_update([("m1", reordered)], [("m1", canonical)])
    assert plan.staying == ["m1"]
    assert not plan.changed
    assert not plan.rewrite

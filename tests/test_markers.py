"""Markers: plain frozen data read from Annotated parameters."""

from __future__ import annotations

import pytest

from aiservices import MemoryId, UserName, V
from aiservices.markers import is_marker


def test_markers_match_their_class_and_instances() -> None:
    assert is_marker(MemoryId, MemoryId)
    assert is_marker(MemoryId(), MemoryId)
    assert not is_marker(UserName, MemoryId)
    assert not is_marker("MemoryId", MemoryId)


def test_v_needs_an_identifier() -> None:
    assert V("topic").name == "topic"
    with pytest.raises(ValueError, match="identifier"):
        V("not valid")


def test_markers_are_frozen() -> None:
    with pytest.raises(AttributeError):
        V("a").name = "b"  # type: ignore[misc]


def test_markers_compare_and_hash_by_value() -> None:
    assert MemoryId() == MemoryId()
    assert hash(MemoryId()) == hash(MemoryId())
    assert MemoryId() != UserName()
    assert V("a") == V("a")
    assert hash(V("a")) == hash(V("a"))
    assert V("a") != V("b")
    assert repr(V("a")) == "V(name='a')"
    assert repr(MemoryId()) == "MemoryId"
    with pytest.raises(AttributeError):
        del V("a").name

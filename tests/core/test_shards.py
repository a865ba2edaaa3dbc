"""The deployment's shard count: what an instance accepts from Redis, what the first one stores."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from outpost_core import DEFAULT_SHARDS, MAX_SHARDS, SHARDS_KEY, ConfigurationError, shards


@pytest.mark.parametrize("count", [1, 16, 64, MAX_SHARDS])
def test_a_count_in_range_is_taken(count: int) -> None:
    assert shards.checked(count) == count


@pytest.mark.parametrize(
    ("count", "said"),
    [
        (0, "shards must be from 1 to 1024, not 0"),
        (MAX_SHARDS + 1, "shards must be from 1 to 1024, not 1025"),
        (True, "shards must be an integer, not bool"),
        ("64", "shards must be an integer, not str"),
        (64.0, "shards must be an integer, not float"),
    ],
)
def test_a_count_out_of_range_is_a_configuration_error(count: Any, said: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        shards.checked(count)
    assert str(raised.value) == said


@pytest.mark.parametrize(("raw", "count"), [(b"16", 16), ("64", 64), (b"1024", 1024), (b"1", 1)])
def test_a_stored_count_is_read(raw: Any, count: int) -> None:
    assert shards.parse(raw) == count


@pytest.mark.parametrize(
    "raw",
    [None, b"", b"0", b"1025", b"-3", b"16.0", b" 16", b"\xff", b"\xd9\xa1\xd9\xa6", 16, b"9" * 99],
)
def test_an_unreadable_stored_count_is_none(raw: Any) -> None:
    assert shards.parse(raw) is None


def test_the_first_instance_stores_its_count_unless_instances_without_one_ran_there() -> None:
    assert shards.first_count(64, legacy=False) == 64
    assert shards.first_count(64, legacy=True) == DEFAULT_SHARDS
    assert shards.first_count(16, legacy=True) == 16


def test_an_instance_agrees_with_the_stored_count_it_was_configured_with() -> None:
    assert shards.disagreement(64, b"64") is None
    assert shards.disagreement(16, "16") is None


def test_another_count_is_refused_naming_both() -> None:
    why = shards.disagreement(64, b"16")
    assert why is not None
    assert why.startswith(
        f"this instance is configured for 64 shards but the deployment's Redis holds 16 shards "
        f"at {SHARDS_KEY}:"
    )
    assert "docs/redis-layout.md" in why


def test_an_unreadable_stored_count_is_refused_quoted_printably_and_briefly() -> None:
    why = shards.disagreement(16, b"\x1b[31m" + b"x" * 200)
    assert why is not None
    assert "an unreadable shard count (\\x1b[31mxxx" in why
    assert "\x1b" not in why and "more characters" in why
    why = shards.disagreement(16, b"\xff")
    assert why is not None and "an unreadable shard count (b'\\xff')" in why


@given(
    st.integers(min_value=1, max_value=MAX_SHARDS), st.integers(min_value=1, max_value=MAX_SHARDS)
)
def test_two_counts_agree_exactly_when_equal(configured: int, stored: int) -> None:
    agreed = shards.disagreement(configured, str(stored).encode()) is None
    assert agreed == (configured == stored)

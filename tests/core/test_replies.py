"""Redis replies read into plain Python, whatever the client library's shape, never raising."""

from __future__ import annotations

import pytest

from outpost_core import (
    RefreshClaim,
    claimed_entries,
    lost_its_data,
    published_data,
    stream_entries,
    text_of,
)

STREAM = "outpost:v2:{3}:outbox"
FIELDS = {b"e": b"{}", b"f": b"0:a", b"k": b"[]"}


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("a", "a"),
        (b"a", "a"),
        ("é".encode(), "é"),
        (b"\xff", None),
        (1, None),
        (None, None),
        (type("Raw", (bytes,), {})(b"a"), "a"),  # a subclass of bytes reads as its bytes
        (type("Raw", (bytes,), {})(b"\xff"), None),
    ],
)
def test_text_of_takes_text_and_utf8_bytes_only(value: object, text: str | None) -> None:
    assert text_of(value) == text


def test_resp2_and_resp3_reads_give_the_same_entries() -> None:
    resp2 = [[STREAM.encode(), [(b"1-0", FIELDS), (b"2-0", FIELDS)]]]
    resp3 = {STREAM.encode(): [[(b"1-0", FIELDS), (b"2-0", FIELDS)]]}
    expected = [(STREAM.encode(), b"1-0", FIELDS), (STREAM.encode(), b"2-0", FIELDS)]
    assert stream_entries(resp2) == expected
    assert stream_entries(resp3) == expected


def test_a_flat_field_list_becomes_a_mapping() -> None:
    reply = [[STREAM, [["1-0", ["e", "{}", "f", "0:a"]]]]]
    assert stream_entries(reply) == [(STREAM, "1-0", {"e": "{}", "f": "0:a"})]


def test_a_resp3_listing_with_nothing_in_it_is_no_entries() -> None:
    assert stream_entries({STREAM: [[]]}) == []


def test_deleted_and_unreadable_items_are_left_out() -> None:
    reply = [
        [STREAM, [("1-0", None), ("2-0", FIELDS), "junk", ("3-0", ["odd"]), ("4", "x", "y")]],
        "junk",
        [STREAM],
        [STREAM, "not a listing"],
    ]
    assert stream_entries(reply) == [(STREAM, "2-0", FIELDS)]


@pytest.mark.parametrize("reply", [None, 7, "text", b"bytes"])
def test_nothing_readable_is_no_entries(reply: object) -> None:
    assert stream_entries(reply) == []


def test_an_autoclaim_answer_gives_the_claimed_entries_of_its_stream() -> None:
    reply = [b"0-0", [(b"1-0", FIELDS), (b"2-0", None)], [b"3-0"]]
    assert claimed_entries(STREAM, reply) == [(STREAM, b"1-0", FIELDS)]
    assert claimed_entries(STREAM, [b"0-0"]) == []
    assert claimed_entries(STREAM, None) == []


@pytest.mark.parametrize(
    ("error", "lost"),
    [
        ("NOGROUP No such key 'outpost:v2:{0}:outbox' or consumer group 'outpost'", True),
        ("no such key", True),
        ("Connection refused", False),
        ("BUSYGROUP Consumer Group name already exists", False),
    ],
)
def test_a_lost_group_is_recognised_from_the_error(error: str, lost: bool) -> None:
    assert lost_its_data(error) is lost


def test_a_claim_refresh_names_each_stream_s_entries_once() -> None:
    other = "outpost:v2:{4}:outbox"
    claim = RefreshClaim(((STREAM, "1-0"), (other, "2-0"), (STREAM, "3-0")))
    assert claim.by_stream() == {STREAM: ["1-0", "3-0"], other: ["2-0"]}


def test_a_published_message_is_told_from_other_pubsub_replies() -> None:
    assert published_data([b"smessage", b"ch", b"change"]) == b"change"
    assert published_data(["smessage", "ch", "change"]) == "change"
    assert published_data([b"ssubscribe", b"ch", 1]) is None
    assert published_data([b"smessage", b"ch"]) is None
    assert published_data(None) is None

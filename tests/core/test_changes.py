"""Parsing the changes scripts reply with and publish (``_changes``)."""

from __future__ import annotations

import json

import pytest

from outpost_core._changes import (
    _KEY,
    _KEY_NAME,
    Change,
    MalformedChange,
    _none_wanted,
    parse_changes,
    published_of,
    reply_of,
)

DELTA = {"k": "s1", "r": 4, "s": ["a:0", "1 1 1 1", "n", "1"], "d": ["a:300"]}


def test_delta_change() -> None:
    assert parse_changes(json.dumps({"c": [DELTA]})) == [
        Change(
            key="s1",
            rev=4,
            set=(("a:0", "1 1 1 1"), ("n", "1")),
            deleted=("a:300",),
            full=False,
        )
    ]


def test_a_pair_reply_is_read_from_its_second_text() -> None:
    message = json.dumps({"c": [DELTA]}).encode()
    whole = json.dumps({"c": [{**DELTA, "s": ["n", "1", "rev", "4"], "full": 1}]}).encode()
    pair = [message, whole]
    assert published_of(pair) == message and reply_of(pair) == whole
    assert parse_changes(pair) == parse_changes(whole)
    assert published_of(message) is message and reply_of(message) is message
    with pytest.raises(MalformedChange):
        parse_changes([message])  # not a pair


def test_bytes_and_str_read_alike() -> None:
    text = json.dumps({"c": [DELTA]}, ensure_ascii=False)
    assert parse_changes(text.encode("utf-8")) == parse_changes(text)


def test_unicode_keys_and_values() -> None:
    raw = json.dumps({"c": [{"k": "s:✓", "r": 1, "s": ["c:m✓", "1"]}]}, ensure_ascii=False)
    parsed = parse_changes(raw.encode("utf-8"))
    assert parsed == [Change(key="s:✓", rev=1, set=(("c:m✓", "1"),))]


def test_full_change() -> None:
    raw = {"c": [{"k": "s1", "r": 9, "s": ["rev", "9", "cu", "0"], "full": 1}]}
    assert parse_changes(json.dumps(raw)) == [
        Change(key="s1", rev=9, set=(("rev", "9"), ("cu", "0")), deleted=(), full=True)
    ]


def test_full_is_one_as_json_writes_it() -> None:
    # 1.0 is the same number as 1 to a JavaScript reader: both cores take it.
    for text in (
        '{"c":[{"k":"s1","r":9,"s":[],"full":1}]}',
        '{"c":[{"k":"s1","r":9,"s":[],"full":1.0}]}',
    ):
        parsed = parse_changes(text)
        assert parsed is not None and parsed[0].full


def test_change_without_content_has_no_set() -> None:
    # A caller that did not follow the identity gets only the key and the revision.
    raw = {"c": [{"k": "s1", "r": 2, "d": "ignored", "full": 1}]}
    assert parse_changes(json.dumps(raw)) == [Change(key="s1", rev=2, set=None)]


def test_cjson_empty_lists_are_empty_objects() -> None:
    raw = '{"c":[{"k":"s1","r":3,"s":{},"d":{}}]}'
    assert parse_changes(raw) == [Change(key="s1", rev=3, set=(), deleted=())]
    assert parse_changes('{"c":{}}') == []
    assert parse_changes('{"c":[]}') == []


def test_missing_deleted_is_empty() -> None:
    assert parse_changes('{"c":[{"k":"s","r":0,"s":["a","b"]}]}') == [
        Change(key="s", rev=0, set=(("a", "b"),))
    ]


def test_several_changes_keep_their_order() -> None:
    raw = {"c": [{"k": "b", "r": 2, "s": []}, {"k": "a", "r": 1, "s": []}]}
    parsed = parse_changes(json.dumps(raw))
    assert parsed is not None
    assert [(c.key, c.rev) for c in parsed] == [("b", 2), ("a", 1)]


@pytest.mark.parametrize("raw", ['{"dup":1}', b'{"dup":1}', '{"dup":1,"c":"junk"}'])
def test_duplicate_track_reply(raw: str | bytes) -> None:
    assert parse_changes(raw) is None


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"\xff\xfe", "not UTF-8"),
        (None, "expected JSON text, got NoneType"),
        (3, "expected JSON text, got int"),
        ({"c": []}, "expected JSON text, got dict"),
        (["c"], "expected JSON text, got list"),
        ("", "not JSON"),
        ("{", "not JSON"),
        ("OK", "not JSON"),
        ("[]", "not a JSON object"),
        ('"c"', "not a JSON object"),
        ("null", "not a JSON object"),
        ("{}", "'c' is not a list"),
        ('{"dup":2}', "'c' is not a list"),
        ('{"c":null}', "'c' is not a list"),
        ('{"c":"x"}', "'c' is not a list"),
        ('{"c":{"k":"s"}}', "'c' is not a list"),
        ('{"c":[1]}', "a change is not an object"),
        ('{"c":[[]]}', "a change is not an object"),
        ('{"c":[{"r":1,"s":[]}]}', "needs a key and a revision"),
        ('{"c":[{"k":1,"r":1,"s":[]}]}', "needs a key and a revision"),
        ('{"c":[{"k":"s","s":[]}]}', "needs a key and a revision"),
        ('{"c":[{"k":"s","r":"1","s":[]}]}', "needs a key and a revision"),
        ('{"c":[{"k":"s","r":1.0,"s":[]}]}', "needs a key and a revision"),
        ('{"c":[{"k":"s","r":true,"s":[]}]}', "needs a key and a revision"),
        ('{"c":[{"k":"s","r":-1,"s":[]}]}', "needs a key and a revision"),
        ('{"c":[{"k":"s","r":1,"s":"a"}]}', "'s' is not a list"),
        ('{"c":[{"k":"s","r":1,"s":null}]}', "'s' is not a list"),
        ('{"c":[{"k":"s","r":1,"s":["a",1]}]}', "'s' holds a non-string"),
        ('{"c":[{"k":"s","r":1,"s":["a",null]}]}', "'s' holds a non-string"),
        ('{"c":[{"k":"s","r":1,"s":["a"]}]}', "odd number"),
        ('{"c":[{"k":"s","r":1,"s":[],"d":"a"}]}', "'d' is not a list"),
        ('{"c":[{"k":"s","r":1,"s":[],"d":[1]}]}', "'d' holds a non-string"),
        ('{"c":[{"k":"s","r":1,"s":[],"d":null}]}', "'d' is not a list"),
        ('{"c":[{"k":"s","r":1,"s":[],"full":true}]}', "'full' is not 1"),
        ('{"c":[{"k":"s","r":1,"s":[],"full":0}]}', "'full' is not 1"),
        ('{"c":[{"k":"s","r":1,"s":[],"full":"1"}]}', "'full' is not 1"),
        ('{"c":[{"k":"s","r":1,"s":[],"full":null}]}', "'full' is not 1"),
        ('{"c":[{"k":"s","r":1,"s":[]},{"k":"s"}]}', "needs a key and a revision"),
    ],
)
def test_garbage_is_malformed(raw: object, message: str) -> None:
    with pytest.raises(MalformedChange, match=message):
        parse_changes(raw)


def test_malformed_is_a_value_error() -> None:
    assert issubclass(MalformedChange, ValueError)


def test_a_change_of_keys_not_followed_is_left_unparsed() -> None:
    followed = {"mine", "a/b"}.__contains__
    # Broken after its keys: parsing it would raise, but none of its keys is followed.
    truncated = '{"c":[{"k":"theirs","r":1},{"k": "other","r":2'
    assert parse_changes(truncated, followed) == []
    with pytest.raises(MalformedChange):
        parse_changes(truncated)
    # A followed key among them: the message is parsed, and only its change is read.
    both = '{"c":[{"k":"theirs","r":1,"s":[]},{"k":"mine","r":2,"s":["u","1"]}]}'
    assert parse_changes(both, followed) == [Change("mine", 2, (("u", "1"),))]
    # A key written with an escape (cjson writes "/" as "\/") is left to the parse.
    escaped = '{"c":[{"k":"a\\/b","r":3}]}'
    assert parse_changes(escaped, followed) == [Change("a/b", 3, None)]
    # No key found: the parse says what it is.
    assert parse_changes('{"dup":1}', followed) is None


@pytest.mark.parametrize(
    "text",
    [
        '{"c":[{"k":"theirs","r":1}]}',
        '{"c":[{"k":"mine","r":1}]}',
        '{"c":[{"k" : "theirs","r":1}]}',  # spaced: not our scripts' spelling
        '{"c":[{"k":"the\\"irs","r":1}]}',
        '{"c":[{"k":"theirs',  # cut short
        '{"c":[{"k":"theirs","r":1},{"k":"other","r":2}]}',
        '{"c":[{"k":"theirs","r":1,"s":["k","1"]}]}',
        '{"dup":1}',
    ],
)
def test_the_look_at_one_key_agrees_with_the_full_look(text: str) -> None:
    """A text with one plain key is told by searching for it; the expressions find the same."""
    followed = {"mine"}.__contains__
    keys = _KEY.findall(text)
    full_look = (
        bool(keys) and len(keys) == len(_KEY_NAME.findall(text)) and not any(map(followed, keys))
    )
    assert _none_wanted(text, followed) is full_look

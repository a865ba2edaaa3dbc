"""What a peer sends is counted when it is unreadable, never raised: nested brackets, numbers past
``int()``'s 4,300-digit limit, and whatever a fuzzer makes of the core's parsers."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from outpost_core import (
    Balance,
    BytesReceived,
    ChangePublished,
    ConfigurationReceived,
    IdentityLoaded,
    Report,
    Session,
    Tick,
    UnknownMeter,
)
from outpost_core._aggregate import Aggregate
from outpost_core._changes import MalformedChange, parse_changes
from outpost_core._inspect import _iso, events_keys, parse_events
from outpost_core._link import _Unreadable
from outpost_core._mirror import derive_state
from outpost_core._peer import MAX_INT_DIGITS, Unreadable, decimal_int, peer_json
from tests.core._payloads import COUNT
from tests.core.test_remote import Polar
from tests.core.test_session import (
    C1,
    configured,
    load_asked,
    snapshot_fields,
    state,
    warm,
)

NESTED = "[" * 100_000
DIGITS = "9" * 5_000  # past int()'s 4,300-digit limit


def test_nested_brackets_and_long_numbers_are_unreadable_json() -> None:
    for text in (NESTED, DIGITS, f"[{DIGITS}]", NESTED.encode(), b"\xff"):
        with pytest.raises(Unreadable):
            peer_json(text)
    assert peer_json('{"a": [1]}') == {"a": [1]}


def test_decimal_int_takes_what_the_scripts_write_only() -> None:
    assert decimal_int("-12") == -12
    assert decimal_int("9" * MAX_INT_DIGITS) == int("9" * MAX_INT_DIGITS)
    for text in (None, "9" * (MAX_INT_DIGITS + 1), DIGITS, "\u00b2", "", "-", "+1", "1_0", " 1"):
        assert decimal_int(text) is None


def test_a_published_message_of_nested_brackets_is_counted() -> None:
    session = configured()
    warm(session)
    session.handle(ChangePublished(NESTED))
    assert session.rejections == {"change": 1}
    assert isinstance(session.read(COUNT, "c1"), Balance)


def test_a_cached_configuration_of_nested_brackets_is_counted() -> None:
    session = Session()
    session.handle(ConfigurationReceived(NESTED, from_cache=True))
    session.handle(ConfigurationReceived(NESTED.encode(), from_cache=True))
    assert session.rejections == {"configuration": 2}
    assert session.configuration is None


def test_a_cached_configuration_as_text_is_parsed() -> None:
    from tests.core._payloads import STANDARD

    session = Session()
    session.handle(ConfigurationReceived(json.dumps(STANDARD).encode(), from_cache=True))
    assert session.configuration is not None and session.rejections == {}


def test_a_websocket_frame_of_nested_brackets_is_counted_and_survived() -> None:
    polar = Polar().connect()
    frame = "[" * 200_000  # under the 1 MiB cap
    polar.session.handle(BytesReceived(polar.now, polar.peer.send_text(frame)))
    assert polar.effects() == []
    assert polar.session.rejections == {"frame": 1}
    assert polar.session.connected


@pytest.mark.parametrize("name", ["n", "rev", "cu", "u", "sa"])
def test_a_state_field_of_five_thousand_digits_is_counted(name: str) -> None:
    session = configured()
    assert session.read(COUNT, "c1") is None
    load_id = load_asked(session, state("r-count"))
    fields = snapshot_fields(extra={name: DIGITS})
    session.handle(IdentityLoaded(state("r-count"), fields, load_id))
    session.read(COUNT, "c1")  # a balance, or not ready: never a ValueError
    assert session.rejections == {"state": 1}


def test_an_aggregate_with_a_count_of_five_thousand_digits_is_unreadable() -> None:
    assert Aggregate.decode(f"{DIGITS} 1 1 1") is None
    assert derive_state({"a:1": f"{DIGITS} 1 1 1", "p": f"{DIGITS} 1 1 1"}).problems
    events, problems = parse_events({f"{DIGITS}:e1": "1", "1:e2": f"1 {DIGITS}"})
    assert events == [] and len(problems) == 2
    assert events_keys("s", {f"a:{DIGITS}": "x", "a:-1": "x", "a:5": "x"}) == ["s:ev:5"]
    assert _iso(10**19) == str(10**19)  # a bucket start past year 9999 is printed as it is


class _Exploding(Mapping[Any, Any]):
    """A reply no client library would give: its reading fails in a way no check foresaw."""

    def __getitem__(self, key: object) -> Any:
        raise RuntimeError("boom")

    def __iter__(self) -> Iterator[Any]:
        raise RuntimeError("boom")

    def __len__(self) -> int:
        return 1


def test_the_last_resort_drops_and_counts_what_a_peer_input_raised() -> None:
    session = configured()
    assert session.read(COUNT, "c1") is None
    load_id = load_asked(session, state("r-count"))
    session.reports()
    session.handle(IdentityLoaded(state("r-count"), _Exploding(), load_id))
    assert session.rejections == {"peer": 1}
    rejected, error = session.reports()
    assert rejected == Report(
        logging.WARNING, "outpost rejected peer: IdentityLoaded dropped: RuntimeError('boom')"
    )
    # The error of ours that dropped it, and where it was raised (innermost last), at debug.
    assert error.level == logging.DEBUG
    first, *frames = error.message.split("\n")
    assert first == "outpost: the dropped input's error: RuntimeError: boom"
    assert frames[0].startswith("  at ") and frames[0].endswith(" in handle")
    assert frames[-1].startswith(f"  at {__file__}:") and frames[-1].endswith(" in __iter__")


def test_the_last_resort_does_not_hide_a_bug_in_a_non_peer_input() -> None:
    session = Session()
    with pytest.raises(AttributeError):
        session.handle(Tick.__new__(Tick))  # a driver's bug: no fields at all


# -- fuzzing --------------------------------------------------------------------------------------

_FUZZ = settings(
    derandomize=True,
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

_digit_runs = st.sampled_from([1, 19, 20, 21, 4_300, 4_301, 5_000]).map(lambda n: "7" * n)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    _digit_runs,
    st.floats(allow_nan=False),
    st.text(max_size=8),
)
_json_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.sampled_from("kcrsdfp"), inner, max_size=4)
    ),
    max_leaves=12,
)
_nesting = st.integers(1, 200_000).map(lambda n: "[" * n)


def _with_numbers(value: Any, digits: str) -> str:
    """The JSON text of ``value`` with every ``null`` a number of ``digits``."""
    return json.dumps(value).replace("null", digits)


_texts = st.one_of(
    st.builds(_with_numbers, _json_values, _digit_runs),
    _nesting,
    _digit_runs,
    st.text(max_size=40),
    _digit_runs.map(lambda d: f'{{"c": [{{"k": "s", "r": {d}, "s": [], "d": []}}]}}'),
)


@_FUZZ
@given(_texts)
def test_fuzz_parse_changes_raises_only_malformed(text: str) -> None:
    try:
        parse_changes(text)
        parse_changes([text, text.encode()])
    except MalformedChange:
        pass


@_FUZZ
@given(st.dictionaries(st.sampled_from(["rev", "cu", "sa", "n", "u", "p", "a:1", "c:m"]), _texts))
def test_fuzz_state_hashes_never_raise(fields: dict[str, str]) -> None:
    derive_state(fields)
    parse_events(fields)
    session = configured()
    session.read(COUNT, "c1")
    load_id = load_asked(session, state("r-count"))
    session.handle(IdentityLoaded(state("r-count"), fields, load_id))
    session.read(COUNT, "c1")
    assert session.rejections["peer"] == 0


@_FUZZ
@given(_texts)
def test_fuzz_peer_inputs_are_counted_never_raised(text: str) -> None:
    session = configured()
    warm(session)
    session.handle(ChangePublished(text))
    session.handle(ChangePublished(text.encode()))
    session.handle(ConfigurationReceived(text, from_cache=True))
    assert session.rejections["peer"] == 0


@_FUZZ
@given(_texts)
def test_fuzz_websocket_frames_are_counted_never_raised(text: str) -> None:
    polar = Polar().connect()
    polar.session.handle(BytesReceived(polar.now, polar.peer.send_text(text[:900_000])))
    polar.effects()
    assert polar.session.rejections["peer"] == 0
    assert polar.session.connected


def test_an_unreadable_frame_keeps_only_an_excerpt() -> None:
    assert _Unreadable("x").excerpt == "x"


_ = C1


def test_printable_escapes_control_characters_and_cuts_long_text() -> None:
    from outpost_core._peer import printable

    assert printable("e1\x1b[2J\nFORGED") == "e1\\x1b[2J\\nFORGED"
    assert printable("héllo") == "héllo"
    assert printable("x" * 10, 4) == "xxxx... (6 more characters)"


def test_a_rejection_log_line_escapes_and_cuts_the_peers_text() -> None:
    session = configured()
    warm(session)
    session.handle(ChangePublished("\x1b[31m\nWARNING forged" + "x" * 5_000))
    [line] = [r.message for r in session.reports() if "rejected" in r.message]
    assert "\n" not in line and "\x1b" not in line and len(line) < 500


_snapshot_fields = st.sampled_from(["as_of", "cold_until", "snapshot_id", "reducers", "credited"])


@_FUZZ
@given(st.dictionaries(_snapshot_fields, _json_values, max_size=5), _digit_runs)
def test_fuzz_snapshots_and_counted_answers_are_counted_never_raised(
    fields: dict[str, Any], digits: str
) -> None:
    polar = Polar().connect()
    polar.follow()
    for kind in ("snapshot", "counted", "configuration"):
        payload = {"request_id": None, "external_customer_id": "c1", **fields}
        frame = _with_numbers({"type": kind, "payload": payload}, digits)
        polar.session.handle(BytesReceived(polar.now, polar.peer.send_text(frame)))
        polar.effects()
    with contextlib.suppress(UnknownMeter):  # a configuration without the meter: a clear error
        polar.session.read(COUNT, "c1")
    assert polar.session.rejections["peer"] == 0
    assert polar.session.connected

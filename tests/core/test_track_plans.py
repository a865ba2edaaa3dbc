"""A repeated ``track()`` builds from a plan (``_track_plans``): the same call, the same checks."""

from __future__ import annotations

from typing import Any

import pytest

from outpost_core import InvalidEvent, Session
from outpost_core import _track_plans as plans
from outpost_core._inputs import ConfigurationReceived, SubscriberRestarted
from tests.core._payloads import STANDARD, configuration, reducer
from tests.core.test_session import NOW, UUID, configured, snapshot_fields, track, warm

PLAIN = {"metadata": None}
ONE_GROUP = configuration(
    reducer(
        "r-count",
        ["m-count"],
        clauses=[
            {"property": "name", "operator": "eq", "value": "api_call"},
            {
                "conjunction": "or",
                "clauses": [{"property": "source", "operator": "eq", "value": "user"}],
            },
        ],
    )
)


def fresh(payload: Any = STANDARD) -> Session:
    """A session that never tracked: it builds every call in full."""
    return configured(payload)


def same_calls(payload: Any = STANDARD, **arguments: Any) -> None:
    session = configured(payload)
    first = track(session, **arguments)
    for n in range(3):
        again = dict(arguments, event_id=f"e-{n}", timestamp_us=NOW - n * 400_000_000)
        assert track(session, **again) == track(fresh(payload), **again)
    assert track(fresh(payload), **arguments) == first


@pytest.mark.parametrize(
    "arguments",
    [
        PLAIN,
        dict(PLAIN, name="other_call"),  # counts in no reducer
        dict(PLAIN, external_customer_id="ü:{x} ✓", event_id='a"b\\c ✓'),
        dict(PLAIN, external_customer_id=None, customer_id=UUID.upper()),
    ],
)
def test_a_planned_call_is_the_call_built_in_full(arguments: dict[str, Any]) -> None:
    same_calls(**arguments)


def test_a_plan_under_nested_filters() -> None:
    same_calls(ONE_GROUP, **PLAIN)


def test_the_plan_fills_in_the_revisions_held() -> None:
    session = configured()
    track(session, **PLAIN)
    warm(session, fields=snapshot_fields(rev=12))
    assert track(session, **PLAIN).args[5:7] == ("12", "1")
    session.handle(SubscriberRestarted())
    assert track(session, **PLAIN).args[5:7] == ("-1", "1")


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"timestamp_us": NOW + 1}, "future"),
        ({"timestamp_us": -1}, "before 1970"),
        ({"event_id": ""}, "event_id must be 1 to"),
        ({"event_id": "x" * 257}, "event_id must be 1 to"),
        ({"event_id": "a\x00"}, "NUL"),
    ],
)
def test_a_planned_call_checks_what_changes(arguments: dict[str, Any], message: str) -> None:
    session = configured()
    track(session, **PLAIN)
    assert len(session._plans) == 1
    with pytest.raises(InvalidEvent, match=message):
        track(session, **PLAIN, **arguments)


def test_metadata_and_other_arguments_go_without_a_plan() -> None:
    session = configured()
    track(session)  # metadata
    with pytest.raises(InvalidEvent):
        track(session, **PLAIN, external_customer_id="c1", customer_id=UUID)
    with pytest.raises(InvalidEvent):
        track(session, **PLAIN, name=7)
    assert len(session._plans) == 0
    assert plans.key_of("n", "c", None) == ("n", "c", None)
    assert plans.key_of("n", None, "u") == ("n", None, "u")
    assert plans.key_of("n", None, None) is None
    assert plans.key_of(b"n", "c", None) is None


@pytest.mark.parametrize(
    "payload",
    [
        configuration(reducer("r-sum", ["m"], func="sum", prop="timestamp")),
        configuration(
            reducer(
                "r-count",
                ["m"],
                clauses=[
                    {
                        "conjunction": "and",
                        "clauses": [{"property": "timestamp", "operator": "gt", "value": 1}],
                    }
                ],
            )
        ),
    ],
)
def test_no_plan_when_a_reducer_reads_the_timestamp(payload: Any) -> None:
    session = configured(payload)
    track(session, **PLAIN)
    track(session, **PLAIN)
    assert len(session._plans) == 0


def test_a_new_configuration_drops_the_plans() -> None:
    session = configured()
    track(session, **PLAIN)
    session.handle(ConfigurationReceived(ONE_GROUP))
    session.effects()
    assert track(session, **PLAIN) == track(fresh(ONE_GROUP), **PLAIN)
    assert len(session._plans) == 1
    assert track(session, **PLAIN) == track(fresh(ONE_GROUP), **PLAIN)


def test_plans_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plans, "MOST", 3)
    session = configured()
    for n in range(4):
        track(session, **PLAIN, external_customer_id=f"c{n}")
    assert len(session._plans) == 1

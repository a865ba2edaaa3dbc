"""The public mode written into the state hash: configuration, mode choice, the ledger's
persistent part, and what ``apply_anchor.lua`` is asked to write."""

from __future__ import annotations

import json

import attrs
import pytest

from outpost_core import Customer, UsageError, parse_configuration
from outpost_core._balance import compute_balance
from outpost_core._mirror import derive_state
from outpost_core._public_anchoring import (
    PUBLIC_SID,
    anchor,
    asked_meters,
    cached_mode,
    check_mode,
    choose_mode,
    customer_of_reading,
    decode_pub,
    encode_pub,
    is_anchored,
    ledger_of,
    missing_rows,
    mode_conflict,
    no_row,
    parse_meters_page,
    polar_aggregate,
    public_configuration,
    reducer_id,
    urgent_requests,
)
from outpost_core._public_ledger import Entry, MeterLedger, Outcome, Probe
from outpost_core._public_polls import CustomerMetersRequest
from outpost_core._public_readings import PolarReading

SEC = 1_000_000
MARGIN = 10 * SEC
T0 = 1_800_000_000 * SEC


def reading(
    consumed: float, credited: int, modified_at: int | None, meter: str = "m"
) -> PolarReading:
    return PolarReading("c1", None, meter, consumed, credited, credited - consumed, modified_at)


# -- configuration ---------------------------------------------------------------------------


def meter(meter_id: str, func: str = "count") -> dict[str, object]:
    return {
        "id": meter_id,
        "name": meter_id,
        "filter": {"conjunction": "and", "clauses": []},
        "aggregation": {"func": func} if func == "count" else {"func": func, "property": "n"},
    }


def test_a_meters_page_and_the_configuration_it_gives() -> None:
    body = json.dumps(
        {
            "items": [meter("b", "sum"), meter("a"), {"name": "no id"}, 3],
            "pagination": {"max_page": 2},
        }
    ).encode()
    page = parse_meters_page(body)
    assert [m["id"] for m in page.meters] == ["b", "a"] and page.max_page == 2
    assert page.problems == ("a meter without an id", "a meter without an id")
    payload = public_configuration(list(page.meters))
    assert payload["mode"] == "public"
    assert [r["id"] for r in payload["reducers"]] == ["a", "b"]  # sorted: one text everywhere
    configuration = parse_configuration(payload)
    assert configuration.reducer_for("b") is not None
    assert configuration.meter_reducers == {"a": reducer_id("a"), "b": "b"}
    assert cached_mode(json.dumps(payload)) == "public"


@pytest.mark.parametrize(
    "body",
    [b"{", b"[]", b'{"items": 1}'],
)
def test_a_meters_page_that_is_not_one(body: bytes) -> None:
    page = parse_meters_page(body)
    assert page.meters == () and page.max_page == 0 and len(page.problems) == 1


def test_a_page_without_pagination_is_the_last() -> None:
    assert parse_meters_page(b'{"items": [], "pagination": {"max_page": true}}').max_page == 1
    assert parse_meters_page(b'{"items": []}').max_page == 1


def test_cached_mode() -> None:
    assert cached_mode('{"reducers": []}') == "snapshots"
    assert cached_mode(b"{") is None
    assert cached_mode("[1]") is None


# -- the mode --------------------------------------------------------------------------------


def test_choose_mode() -> None:
    assert choose_mode("public", 101, None)[0] == "public"
    assert choose_mode("snapshots", 404, "public")[0] == "snapshots"
    mode, reason = choose_mode("auto", 404, None)
    assert mode == "public" and "404" in reason
    assert choose_mode("auto", 101, None)[0] == "snapshots"
    assert choose_mode("auto", 401, "public")[0] == "snapshots"  # a refused token: it is served
    mode, reason = choose_mode("auto", None, "public")
    assert mode == "public" and "cached" in reason
    assert choose_mode("auto", None, None)[0] == "snapshots"
    with pytest.raises(UsageError):
        choose_mode("other", None, None)
    with pytest.raises(UsageError):
        check_mode(3)
    assert check_mode("auto") == "auto"


def test_mode_conflict() -> None:
    assert mode_conflict("public", None) is None
    assert mode_conflict("public", "public") is None
    conflict = mode_conflict("public", "snapshots")
    assert conflict is not None and "snapshots mode" in conflict


# -- the ledger's persistent part ------------------------------------------------------------


def test_pub_round_trip() -> None:
    ledger = MeterLedger("sum", MARGIN)
    ledger.entries["1:e1"] = Entry(2.0, None, 5)
    ledger.anchor = reading(3, 10, T0)
    ledger.baseline = 3.0
    ledger.reset_hint_us = T0 - 5
    ledger.rejections = 2
    ledger.probe = Probe(4.5, T0 + 1, 7)
    ledger.carried = {"1:e1"}
    ledger.cap = 2.5
    text = encode_pub(ledger)
    assert '"u":2.5' in text
    problems: list[str] = []
    again = ledger_of("sum", MARGIN, {"pub": text}, {"1:e1": "2 5"}, problems)
    assert problems == []
    assert again.anchor is not None and again.anchor.consumed == 3 and again.anchor.credited == 10
    assert again.anchor.modified_at_us == T0
    assert (again.baseline, again.reset_hint_us, again.rejections) == (3.0, T0 - 5, 2)
    assert again.probe == Probe(4.5, T0 + 1, 7)
    assert again.carried == {"1:e1"} and again.cap == 2.5
    assert encode_pub(again) == text


def test_an_empty_ledger_round_trips() -> None:
    ledger = MeterLedger("count", MARGIN)
    again = MeterLedger("count", MARGIN)
    text = encode_pub(ledger)
    assert '"u"' not in text  # written only when a cap holds: what older readers wrote
    decode_pub(text, again, [])
    assert again.anchor is None and again.probe is None and again.cap is None


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{", "pub: "),
        ("[]", "pub: not a version 1 object"),
        ('{"v": 2}', "pub: not a version 1 object"),
        ('{"v": 1, "a": [1, 2, "x", null]}', "pub: an unreadable anchor"),
        ('{"v": 1, "a": [1, 2, 3, "x"]}', "pub: an unreadable anchor"),
        ('{"v": 1, "a": "x"}', "pub: an unreadable anchor"),
    ],
)
def test_an_unreadable_pub_is_a_problem_never_an_error(text: str, problem: str) -> None:
    problems: list[str] = []
    ledger = MeterLedger("sum", MARGIN)
    decode_pub(text, ledger, problems)
    assert ledger.anchor is None
    assert problems and problems[0].startswith(problem)


def test_odd_fields_of_pub_read_as_nothing() -> None:
    ledger = MeterLedger("sum", MARGIN)
    text = '{"v": 1, "a": null, "b": "x", "h": 1.5, "r": true, "q": [1, "x", 2], "k": "x"}'
    decode_pub(text, ledger, [])
    assert (ledger.baseline, ledger.reset_hint_us, ledger.rejections) == (0.0, None, 0)
    assert ledger.probe is None and ledger.carried == set()
    decode_pub('{"v": 1, "q": 3, "k": [1, "gone"]}', ledger, [])
    assert ledger.probe is None and ledger.carried == set()  # carried only what is pending


def test_a_cap_from_redis_never_lifts_the_balance_above_polars() -> None:
    anchor = f'"a": [10, 100, 90, {T0}]'
    events = {"1:e1": "2 5", "1:e2": "3"}  # e1 acknowledged, e2 in flight
    problems: list[str] = []
    hostile = {"pub": f'{{"v": 1, {anchor}, "u": -1e300}}'}
    low = ledger_of("count", MARGIN, hostile, events, problems)
    assert low.cap == 8  # Polar's 10 less the acknowledged e1
    assert problems == ["pub: a cap below Polar's consumed less the acknowledged events"]
    assert low.balance().balance == 100 - 8 - 5
    fine = ledger_of("count", MARGIN, {"pub": f'{{"v": 1, {anchor}, "u": 9}}'}, events, problems)
    assert fine.cap == 9 and len(problems) == 1
    for odd in ('"x"', "true", "null", "1e999"):
        text = f'{{"v": 1, {anchor}, "u": {odd}}}'
        assert ledger_of("count", MARGIN, {"pub": text}, events, problems).cap is None
    assert ledger_of("count", MARGIN, {"pub": '{"v": 1, "u": 3}'}, events, problems).cap is None


def test_unreadable_events_stay_out_of_the_ledger() -> None:
    problems: list[str] = []
    ledger = ledger_of(
        "sum",
        MARGIN,
        {},
        {"1:a": "x", "1:b": "1 2 3", "1:c": "inf", "1:d": "1 x", "1:e": "-4", "1:f": "2 9"},
        problems,
    )
    assert set(ledger.entries) == {"1:e", "1:f"}
    assert ledger.entries["1:e"].value == 0.0 and ledger.entries["1:f"].acked_at_us == 9
    assert len(problems) == 4


# -- p ---------------------------------------------------------------------------------------


def test_polar_aggregate() -> None:
    assert polar_aggregate("count", 0) == "0 0 - -"
    assert polar_aggregate("count", 3) == "3 3 3 3"
    assert polar_aggregate("count", 2.5) == "3 2.5 2.5 2.5"
    assert polar_aggregate("sum", 7.5) == "1 7.5 7.5 7.5"
    assert polar_aggregate("max", 9) == "1 9 9 9"


# -- anchoring -------------------------------------------------------------------------------


def test_first_anchor_of_nothing() -> None:
    decided = anchor("count", MARGIN, {}, {}, no_row("c1", None, "m"))
    assert decided.outcome is Outcome.NO_WATERMARK
    write = decided.write
    assert write is not None
    assert write.expected_rev == "" and write.as_of == "0" and write.removed == ()
    args = write.args("chan", -1)
    assert args[:10] == ("chan", "", "-1", "m", "0", "0 0 - -", "0", "0", PUBLIC_SID, write.pub)
    assert args[10:] == ("0",)


def test_anchor_prunes_what_the_figure_includes() -> None:
    events = {"1:e1": f"5 {T0 - 30 * SEC}", "1:e2": f"3 {T0 - 20 * SEC}", "1:e3": "4"}
    decided = anchor("sum", MARGIN, {"rev": "7"}, events, reading(8, 50, T0))
    assert decided.outcome is Outcome.FIRST
    assert decided.write is not None and decided.write.removed == ("1:e1", "1:e2")
    assert decided.write.expected_rev == "7" and decided.write.polar == "1 8 8 8"
    pub = json.loads(decided.write.pub)
    assert pub["a"] == [8, 50, 42, T0] and pub["b"] == 8


def test_a_second_figure_checks_from_the_baseline() -> None:
    first = anchor("sum", MARGIN, {}, {"1:e1": f"5 {T0 - 30 * SEC}"}, reading(5, 50, T0))
    assert first.write is not None
    fields = {"rev": "2", "pub": first.write.pub}
    events = {"1:e2": f"3 {T0 + 5 * SEC}"}
    later = reading(6, 50, T0 + 60 * SEC)  # rose by 1 only: e2 (3) cannot be included
    decided = anchor("sum", MARGIN, fields, events, later)
    assert decided.outcome is Outcome.REJECTED and decided.rejections == 1
    assert decided.write is not None and decided.write.removed == ()
    stale = anchor("sum", MARGIN, fields, events, reading(9, 50, T0))
    assert stale.outcome is Outcome.STALE and stale.write is None


def test_relayed_meters_drop_what_the_figure_should_include() -> None:
    events = {"1:e1": f"5 {T0 - 30 * SEC}", "1:e2": "3", "1:e3": f"3 {T0}"}
    decided = anchor("avg", MARGIN, {}, events, reading(4, 0, T0))
    assert decided.write is not None and decided.write.removed == ("1:e1",)
    nothing = anchor("min", MARGIN, {}, events, reading(4, 0, None))
    assert nothing.write is not None and nothing.write.removed == ()


def test_unique_meters_cannot_be_anchored() -> None:
    with pytest.raises(UsageError):
        anchor("unique", MARGIN, {}, {}, reading(0, 0, None))


def test_is_anchored() -> None:
    assert is_anchored({"sid": "public", "cu": "0"})
    assert not is_anchored({"sid": "s-1", "cu": "5"})
    assert not is_anchored({"sid": "public"})


def test_urgent_requests_keep_each_page_within_100_rows() -> None:
    customers = [f"c{i}" for i in range(7)]
    requests = urgent_requests(customers, 30)  # 3 customers of 30 meters a request
    assert [r.external_customer_ids for r in requests] == [
        ("c0", "c1", "c2"),
        ("c3", "c4", "c5"),
        ("c6",),
    ]
    assert requests[0].meter_ids == () and ("limit", "100") in requests[0].params()
    assert len(urgent_requests(customers, 0)) == 1
    assert len(urgent_requests(["a", "b"], 500)) == 2


def test_missing_rows() -> None:
    found = [reading(1, 1, T0, "m1")]
    asked = {"c1": ["m1", "m2"], "c2": ["m1"]}
    assert missing_rows(asked, found) == [("c1", "m2"), ("c2", "m1")]


def test_customers_named_by_polars_id() -> None:
    [request] = urgent_requests(["u1", "u2"], 3, kind="customer")
    assert (request.customer_ids, request.external_customer_ids, request.kind) == (
        ("u1", "u2"),
        (),
        "customer",
    )
    uid = "0b1d7c3e-8d2a-4a61-9a4e-6f1f2f8a7c10"
    row = PolarReading(None, uid.upper(), "m1", 1, 1, 0, T0)
    assert customer_of_reading(row, "customer") == uid  # one spelling, as reads name it
    assert customer_of_reading(attrs.evolve(row, customer_id="odd"), "customer") == "odd"
    assert customer_of_reading(row, "external") is None
    asked = asked_meters(request, {"u1": ["m1"], "u2": ["m1"]})
    assert missing_rows({uid: ["m1"], "u2": ["m1"]}, [row], "customer") == [("u2", "m1")]
    assert asked == {"u1": ["m1"], "u2": ["m1"]}


def test_asked_meters_are_those_the_request_covers() -> None:
    followed = {"c1": ["m1", "m2"], "c2": ["m2"]}
    every = CustomerMetersRequest(("c1", "c3"), ())
    assert asked_meters(every, followed) == {"c1": ["m1", "m2"], "c3": []}
    one = CustomerMetersRequest(("c1", "c2"), ("m1",))
    assert asked_meters(one, followed) == {"c1": ["m1"], "c2": []}  # m2 was not asked about


@pytest.mark.parametrize(
    ("func", "sid", "approximate"),
    [("avg", PUBLIC_SID, True), ("min", PUBLIC_SID, True), ("count", PUBLIC_SID, False),
     ("sum", PUBLIC_SID, False), ("max", PUBLIC_SID, False), ("avg", "snap-1", False)],
)  # fmt: skip
def test_avg_and_min_balances_of_the_public_mode_are_approximate(
    func: str, sid: str, approximate: bool
) -> None:
    decided = anchor(func, MARGIN, {}, {}, reading(4, 10, T0))
    assert decided.write is not None
    fields = {"p": decided.write.polar, "c:m": "10", "cu": "0", "sid": sid, "rev": "1"}
    balance = compute_balance("m", Customer("external", "c1"), func, derive_state(fields))
    assert (balance.balance, balance.approximate) == (6, approximate)

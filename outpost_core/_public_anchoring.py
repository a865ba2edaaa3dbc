"""The public-API mode written into the existing Redis layout, sans I/O.

In the public mode, Polar's figure for a (customer, meter) is the **anchor** of the identity's
state hash, and the identity's pending events are the **ledger** (``_public_ledger.py``). This
module turns what a driver read from Redis (the state hash's fields and the identity's pending
events) plus a Polar reading into the arguments of ``lua/apply_anchor.lua``:

- ``p``: Polar's consumed as the aggregate the reducer's aggregation reads (a count reads the
  count, a sum the sum, a max the max; avg and min relay it as one value);
- ``c:<meter>``: credited units; ``cu`` = 0 (every local event stays pending until pruned);
  ``sa``: the reading's ``modified_at`` (µs, 0 when null); ``sid`` = ``public``;
- ``pub``: the MeterLedger's persistent part as compact JSON, so any instance rebuilds it;
- the events fields the prune rule drops.

The reducer id of a meter is the meter id itself: every instance and every SDK derive it alike
(the layout percent-encodes it in keys). Nothing here raises because of what Redis or Polar
held: an unreadable ``pub`` or event is counted in ``problems`` and left aside (an unreadable
event is never pruned, so it keeps counting: the safe side).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import attrs

from ._aggregate import Aggregate
from ._event import UUID_PATTERN, canonical_uuid
from ._keys import CustomerKind
from ._peer import peer_json
from ._public_ledger import BOUNDED, RELAYED, Entry, MeterLedger, Outcome, Probe
from ._public_polls import MAX_ROWS, CustomerMetersRequest, request_for
from ._public_readings import PolarReading
from .errors import UsageError

PUBLIC_SID = "public"
"""``sid`` of a state hash the public mode anchored."""
MODE_FIELD = "mode"
"""The field of a cached configuration payload that names the mode it was built for."""
PUB_VERSION = 1
_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def reducer_id(meter_id: str) -> str:
    """The public mode's reducer of a meter: one per meter, named by the meter id."""
    return meter_id


# -- configuration from GET /v1/meters/ ------------------------------------------------------


@attrs.frozen(slots=True)
class MetersPage:
    meters: tuple[Mapping[str, Any], ...]
    max_page: int
    problems: tuple[str, ...] = ()


def parse_meters_page(body: bytes) -> MetersPage:
    """One page of ``GET /v1/meters/``; a body that is not one gives no meter and a problem."""
    try:
        data = peer_json(body)
    except ValueError as exc:
        return MetersPage((), 0, (f"meters page: {exc}",))
    if not isinstance(data, Mapping) or not isinstance(data.get("items"), list):
        return MetersPage((), 0, ("meters page without items",))
    items = data["items"]
    pagination = data.get("pagination")
    max_page = pagination.get("max_page") if isinstance(pagination, Mapping) else None
    if isinstance(max_page, bool) or not isinstance(max_page, int):
        max_page = 1
    meters = []
    problems = []
    for item in items:
        if isinstance(item, Mapping) and isinstance(item.get("id"), str) and item["id"]:
            meters.append(item)
        else:
            problems.append("a meter without an id")
    return MetersPage(tuple(meters), max_page, tuple(problems))


def public_configuration(meters: list[Mapping[str, Any]]) -> dict[str, Any]:
    """The configuration payload of the public mode: one reducer per meter (its id the meter
    id), sorted so that every instance builds the same text. Marked with the mode, so an
    instance of the other mode refuses to mix layouts (:func:`cached_mode`)."""
    reducers = {}
    for meter in meters:
        meter_id = meter["id"]
        reducers[meter_id] = {
            "id": reducer_id(meter_id),
            "filter": meter.get("filter"),
            "aggregation": meter.get("aggregation"),
            "meter_ids": [meter_id],
        }
    return {MODE_FIELD: "public", "reducers": [reducers[m] for m in sorted(reducers)]}


def cached_mode(text: str | bytes) -> str | None:
    """The mode a cached configuration was built for (``None``: unreadable)."""
    try:
        payload = peer_json(text)
    except ValueError:
        return None
    if not isinstance(payload, Mapping):
        return None
    return "public" if payload.get(MODE_FIELD) == "public" else "snapshots"


# -- choosing the mode -----------------------------------------------------------------------

MODES = ("auto", "snapshots", "public")


def check_mode(mode: object) -> str:
    if mode not in MODES:
        raise UsageError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    assert isinstance(mode, str)
    return mode


def choose_mode(requested: str, upgrade_status: int | None, cached: str | None) -> tuple[str, str]:
    """The mode to run and why. ``upgrade_status``: what Polar answered the WebSocket upgrade
    of ``/v1/outpost/`` (101 when it opened; ``None`` when Polar could not be reached);
    ``cached``: the mode of the configuration cached in Redis, if any."""
    check_mode(requested)
    if requested != "auto":
        return requested, f"mode={requested!r} was asked"
    if upgrade_status == 404:
        return "public", "Polar answers 404 on /v1/outpost/: it serves only its public API"
    if upgrade_status is not None:
        return "snapshots", f"Polar serves /v1/outpost/ (HTTP {upgrade_status})"
    if cached is not None:
        return cached, "Polar is unreachable: the mode of the configuration cached in Redis"
    return "snapshots", "Polar is unreachable and Redis caches no configuration"


def mode_conflict(mode: str, cached: str | None) -> str | None:
    """Why this instance cannot share the Redis (another mode's configuration is cached)."""
    if cached is None or cached == mode:
        return None
    return (
        f"this instance runs the {mode} mode but the configuration cached in Redis was built "
        f"by an instance of the {cached} mode: both cannot share one Redis (set mode= alike)"
    )


# -- the ledger in the state hash ------------------------------------------------------------


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _instant(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _plain(x: float) -> float | int:
    """A number as JSON writes it in every SDK: a whole value without a decimal point."""
    return int(x) if x == int(x) and abs(x) < 2**53 else x


def encode_pub(ledger: MeterLedger) -> str:
    """The ledger's persistent part (its entries are the identity's pending events)."""
    anchor = ledger.anchor
    probe = ledger.probe
    data = {
        "v": PUB_VERSION,
        "a": None
        if anchor is None
        else [
            _plain(anchor.consumed),
            anchor.credited,
            _plain(anchor.balance),
            anchor.modified_at_us,
        ],
        "b": _plain(ledger.baseline),
        "h": ledger.reset_hint_us,
        "r": ledger.rejections,
        "q": None if probe is None else [_plain(probe.consumed), probe.sent_at_us, probe.lag_us],
        "k": sorted(ledger.carried),
    }
    if ledger.cap is not None:  # (written only when it holds: older readers ignore it)
        data["u"] = _plain(ledger.cap)
    return _JSON.encode(data)


def decode_pub(text: str | None, ledger: MeterLedger, problems: list[str]) -> None:
    """Restore the persistent part into ``ledger`` (a fresh one); what is unreadable is left
    out and named in ``problems``."""
    if text is None:
        return
    try:
        data = peer_json(text)
    except ValueError as exc:
        problems.append(f"pub: {exc}")
        return
    if not isinstance(data, Mapping) or data.get("v") != PUB_VERSION:
        problems.append("pub: not a version 1 object")
        return
    anchor = data.get("a")
    if isinstance(anchor, list) and len(anchor) == 4:
        consumed, credited, balance = (_number(x) for x in anchor[:3])
        modified = anchor[3]
        if (
            consumed is not None
            and credited is not None
            and balance is not None
            and (modified is None or _instant(modified) is not None)
        ):
            ledger.anchor = PolarReading(
                None, None, "", consumed, int(credited), balance, _instant(modified)
            )
        else:
            problems.append("pub: an unreadable anchor")
    elif anchor is not None:
        problems.append("pub: an unreadable anchor")
    ledger.baseline = _number(data.get("b")) or 0.0
    ledger.reset_hint_us = _instant(data.get("h"))
    ledger.rejections = _instant(data.get("r")) or 0
    probe = data.get("q")
    if isinstance(probe, list) and len(probe) == 3:
        consumed = _number(probe[0])
        sent, lag = _instant(probe[1]), _instant(probe[2])
        if consumed is not None and sent is not None and lag is not None:
            ledger.probe = Probe(consumed, sent, lag)
    ledger.cap = _cap_of(data.get("u"), ledger, problems)
    carried = data.get("k")
    if isinstance(carried, list):
        ledger.carried = {f for f in carried if isinstance(f, str) and f in ledger.entries}


def _cap_of(value: object, ledger: MeterLedger, problems: list[str]) -> float | None:
    """The cap a state hash holds, never below the anchor's consumed less the acknowledged
    events (a cap written by Outpost never is: below it, the balance would read above Polar's)."""
    cap = _number(value)
    if cap is None or ledger.anchor is None:
        return None
    acked = sum(e.value for e in ledger.entries.values() if e.acked_at_us is not None)
    floor = ledger.anchor.consumed - acked
    if cap < floor:
        problems.append("pub: a cap below Polar's consumed less the acknowledged events")
        return floor
    return cap


def _event(text: str) -> tuple[float, int | None] | None:
    """An events-hash value: ``"<value>"`` or ``"<value> <acknowledged at µs>"``."""
    parts = text.split(" ")
    if len(parts) > 2:
        return None
    try:
        value = float(parts[0])
        acked = int(parts[1]) if len(parts) == 2 else None
    except ValueError:
        return None
    if not math.isfinite(value):
        return None
    return value, acked


def ledger_of(
    aggregation: str,
    margin_us: int,
    fields: Mapping[str, str],
    events: Mapping[str, str],
    problems: list[str],
) -> MeterLedger:
    """The MeterLedger a state hash and its pending events hold."""
    ledger = MeterLedger(aggregation, margin_us)
    for field, text in events.items():
        parsed = _event(text)
        if parsed is None:
            problems.append(f"event {field[:80]}: unreadable value")
            continue
        value, acked = parsed
        ledger.entries[field] = Entry(max(0.0, value), None, acked)
    decode_pub(fields.get("pub"), ledger, problems)
    return ledger


def polar_aggregate(aggregation: str, consumed: float) -> str:
    """``p``: Polar's consumed as the aggregate the reducer's aggregation reads."""
    if consumed == 0:
        return Aggregate().encode()
    if aggregation == "count":
        count = max(0, math.ceil(consumed))  # a count is whole: round up, the safe side
        return Aggregate(count=count, sum=consumed, min=consumed, max=consumed).encode()
    return Aggregate(count=1, sum=consumed, min=consumed, max=consumed).encode()


@attrs.frozen(slots=True)
class AnchorWrite:
    """The arguments of ``apply_anchor.lua`` (see its header)."""

    expected_rev: str
    """The revision read (``""``: the hash did not exist): compare-and-set."""
    meter_id: str
    credited: str
    polar: str
    as_of: str
    pub: str
    removed: tuple[str, ...]

    def args(self, channel: str, known: int) -> tuple[str, ...]:
        return (
            channel,
            self.expected_rev,
            str(known),
            self.meter_id,
            self.credited,
            self.polar,
            "0",
            self.as_of,
            PUBLIC_SID,
            self.pub,
            str(len(self.removed)),
            *self.removed,
        )


@attrs.frozen(slots=True)
class Anchoring:
    outcome: Outcome
    write: AnchorWrite | None
    """``None``: nothing to write (a stale reading)."""
    problems: tuple[str, ...] = ()
    rejections: int = 0
    """The ledger's count of readings whose check failed, after this one."""


def anchor(
    aggregation: str,
    margin_us: int,
    fields: Mapping[str, str],
    events: Mapping[str, str],
    reading: PolarReading,
) -> Anchoring:
    """Observe ``reading`` on the ledger the state hash (``fields``) and its pending events
    (``events``: events field → value) hold, and say what to write."""
    if aggregation not in BOUNDED | RELAYED or aggregation == "unique":
        raise UsageError(f"the public mode cannot anchor a {aggregation!r} meter")
    problems: list[str] = []
    ledger = ledger_of(aggregation, margin_us, fields, events, problems)
    before = set(ledger.entries)
    outcome = ledger.observe(reading)
    if outcome is Outcome.STALE:
        return Anchoring(outcome, None, tuple(problems), ledger.rejections)
    # (avg and min: the ledger drops what the reading should include, with no check possible.)
    write = anchor_write(aggregation, fields, ledger, before, reading.meter_id, reading)
    return Anchoring(outcome, write, tuple(problems), ledger.rejections)


def anchor_write(
    aggregation: str,
    fields: Mapping[str, str],
    ledger: MeterLedger,
    before: set[str],
    meter_id: str,
    reading: PolarReading,
) -> AnchorWrite:
    """What to write once ``ledger`` (read from the state hash ``fields``, its entries then
    ``before``) took ``reading`` as its anchor: the new basis, the entries it dropped, all on
    condition the hash's revision is still the one read."""
    return AnchorWrite(
        expected_rev=fields.get("rev", ""),
        meter_id=meter_id,
        credited=str(reading.credited),
        polar=polar_aggregate(aggregation, ledger.consumed_basis()),
        as_of=str(reading.modified_at_us or 0),
        pub=encode_pub(ledger),
        removed=tuple(sorted(before - set(ledger.entries))),
    )


def no_row(
    external_customer_id: str | None, customer_id: str | None, meter_id: str
) -> PolarReading:
    """What a customer meter Polar has no row for reads as: nothing credited, nothing consumed
    (the safe side), with no ``modified_at``: it anchors only where nothing else did."""
    return PolarReading(external_customer_id, customer_id, meter_id, 0.0, 0, 0.0, None)


def urgent_requests(
    customers: list[str], meters: int, kind: CustomerKind = "external"
) -> list[CustomerMetersRequest]:
    """Requests for every meter of these customers (a first read waits for them), all of one
    ``kind``: each names as many customers as keep its rows (customers × meters) within one page
    of 100."""
    per_request = max(1, MAX_ROWS // max(1, meters))
    return [
        request_for(kind, tuple(customers[i : i + per_request]), ())
        for i in range(0, len(customers), per_request)
    ]


def asked_meters(
    request: CustomerMetersRequest, followed: Mapping[str, list[str]]
) -> dict[str, list[str]]:
    """Per customer of the request, the followed meters its answer covers: every one when it
    names no meter, else only those it names (a meter not asked about is not missing)."""
    named = set(request.meter_ids)
    return {
        c: [m for m in followed.get(c, []) if not named or m in named] for c in request.customers
    }


def customer_of_reading(reading: PolarReading, kind: str) -> str | None:
    """The reading's customer as a request of ``kind`` named it (Polar's id in one spelling)."""
    if kind == "external":
        return reading.external_customer_id
    found = reading.customer_id
    return canonical_uuid(found) if found and UUID_PATTERN.fullmatch(found) else found


def missing_rows(
    asked: Mapping[str, list[str]], readings: list[PolarReading], kind: str = "external"
) -> list[tuple[str, str]]:
    """(customer, meter) asked for (customer → its followed meters, customers of ``kind``) that
    no reading answered: Polar has no row for them yet, they read as :func:`no_row`."""
    answered = {(customer_of_reading(r, kind), r.meter_id) for r in readings}
    return [(c, m) for c, meters in asked.items() for m in meters if (c, m) not in answered]


def is_anchored(fields: Mapping[str, str]) -> bool:
    """Whether a state hash holds a public anchor (a read of it is ready)."""
    return fields.get("sid") == PUBLIC_SID and "cu" in fields


__all__ = [
    "AnchorWrite",
    "Anchoring",
    "MetersPage",
    "anchor",
    "anchor_write",
    "asked_meters",
    "cached_mode",
    "check_mode",
    "choose_mode",
    "customer_of_reading",
    "decode_pub",
    "encode_pub",
    "is_anchored",
    "ledger_of",
    "missing_rows",
    "mode_conflict",
    "no_row",
    "parse_meters_page",
    "polar_aggregate",
    "public_configuration",
    "reducer_id",
    "urgent_requests",
]

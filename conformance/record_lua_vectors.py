"""Record the Lua vectors: run every case below against a real redis-server, write the results.

    python -m conformance.record_lua_vectors           # rewrite conformance/lua/*.jsonl
    python -m conformance.record_lua_vectors --check   # exit 1 if a file would change

It also sets the SHA1 table of ``conformance/README.md`` to the current scripts.

Each case names the Redis state before, KEYS and ARGV; the recorder adds what the script does
(reply, state after, published messages) by running it, so re-recording after a script change is
this command, never a hand edit. The cases follow the header comment of each script in ``lua/``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, NamedTuple

from outpost_core import SCRIPT_SHA1, SCRIPT_TEXT, Customer
from outpost_core import _keys as keys
from tests.support.redis_server import running

from .lua_vectors import SCHEMA, SCRIPTS, execute, subscribe

ROOT = Path(__file__).resolve().parent
README = ROOT / "README.md"
SHA1_ROW = re.compile(r"^\| `(\w+)` \| `[0-9a-f]{40}` \|$", re.MULTILINE)

BUCKET = 300_000_000
HOUR = 3_600_000_000
B0 = 1_764_680_400_000_000  # 2025-12-02T13:00:00Z, a bucket start
B1, B2, B3 = B0 + BUCKET, B0 + 2 * BUCKET, B0 + 3 * BUCKET
NOW = B3 + 123_456  # the caller's clock in the settle and snapshot cases
GROUP = "outpost"

Case = dict[str, Any]


class Row(NamedTuple):
    """One line of a script's table: the case's name, what it shows, the state before, and
    KEYS and ARGV as built by the script's argv helper."""

    name: str
    description: str
    before: dict[str, Any]
    keys_argv: tuple[list[str], list[str]]


class Ident:
    """One identity (customer × reducer): its state hash, acknowledged set and bucket hashes, its
    shard's channel and outbox."""

    def __init__(self, customer: str, reducer: str) -> None:
        self.customer = Customer("external", customer)
        self.st = keys.state_key(self.customer, reducer)
        self.acked = keys.acked_key(self.st)
        self.channel = keys.channel(keys.shard_of(self.customer))
        self.outbox = keys.outbox_key(keys.shard_of(self.customer))

    def ev(self, bucket: int) -> str:
        """The events hash of one bucket."""
        return keys.bucket_key(self.st, bucket)

    def events(self, events: dict[str, str]) -> dict[str, dict[str, str]]:
        """Events fields → value, as the bucket hashes that hold them."""
        out: dict[str, dict[str, str]] = {}
        for name, value in events.items():
            out.setdefault(self.ev(int(name.split(":")[0])), {})[name] = value
        return out


COUNT = Ident("c1", "r-count")
TOKENS = Ident("c1", "r-tokens")
LARGEST = Ident("c1", "r-largest")
ODD = Ident("acme:{eu} 1", "r-count")  # an external id that needs percent-encoding


def f(bucket: int, event_id: str) -> str:
    """An events-hash field."""
    return f"{bucket}:{event_id}"


def item(customer: Customer, event_id: str, timestamp: str, tokens: int | None = None) -> str:
    """The outbox field ``e``: the event as an item of Polar's ingestion body."""
    metadata = {} if tokens is None else {"tokens": tokens}
    body = {
        "name": "api_call",
        **customer.wire(),
        "external_id": event_id,
        "timestamp": timestamp,
        "metadata": metadata,
    }
    return json.dumps(body, separators=(",", ":"))


def states(*idents: Ident) -> str:
    return json.dumps([i.st for i in idents], separators=(",", ":"))


def snapshot_state(rev: int, cu: int, sa: int, p: str = "0 0 - -", **more: str) -> dict[str, str]:
    state = {
        "rev": str(rev),
        "cu": str(cu),
        "sa": str(sa),
        "sid": "s-1",
        "p": p,
        "n": "0",
        "u": "0",
    }
    state.update(more)
    return state


def outbox(ident: Ident, entries: dict[str, dict[str, str]], pending: list[str]) -> dict[str, Any]:
    """A stream with its group; ``pending`` (the first entries) were read by consumer w1."""
    return {
        ident.outbox: {
            "entries": [{"id": i, "fields": fields} for i, fields in entries.items()],
            "groups": {GROUP: {"pending": {"w1": pending} if pending else {}}},
        }
    }


def entry(ident: Ident, event_id: str, bucket: int, *targets: Ident) -> dict[str, str]:
    return {
        "e": item(ident.customer, event_id, "2025-12-02T13:00:00.000000Z"),
        "f": f(bucket, event_id),
        "k": states(*(targets or (ident,))),
    }


def number(value: float) -> str:
    """A number as lib.lua's fmt writes it: integral without a point, others in the shortest
    text that reads back exactly (Python's repr)."""
    return str(int(value)) if value == int(value) else repr(value)


def holding(
    ident: Ident,
    rev: int,
    cold: int,
    events: dict[str, str],
    *,
    sa: int | None = None,
    p: str = "0 0 - -",
    credited: dict[str, str] | None = None,
) -> dict[str, Any]:
    """An identity's hashes: a snapshot at ``cold`` (as of ``sa``, by default 5 µs later) with
    ``credited`` (meter → units), and the pending ``events`` (events field → value, then the
    acknowledgement time once acknowledged) in their buckets' hashes. n, u and each bucket's
    aggregate are computed from the events, as the scripts keep them (and the acknowledged set,
    by :func:`indexed`, for every case)."""
    values: dict[int, list[float]] = {}
    for name, value in events.items():
        values.setdefault(int(name.split(":")[0]), []).append(float(value.split(" ")[0]))
    aggregates = {
        f"a:{bucket}": " ".join(number(x) for x in (len(v), sum(v), min(v), max(v)))
        for bucket, v in sorted(values.items())
    }
    undelivered = sum(1 for value in events.values() if " " not in value)
    state = snapshot_state(
        rev,
        cold,
        cold + 5 if sa is None else sa,
        p,
        n=str(len(events)),
        u=str(undelivered),
        **aggregates,
        **{f"c:{meter}": units for meter, units in (credited or {}).items()},
    )
    return {ident.st: state, **ident.events(events)}


def queued(entry_id: str, event_id: str, bucket: int, *, read: bool) -> dict[str, Any]:
    """COUNT's outbox holding one event; ``read``: consumer w1 has read it."""
    return outbox(COUNT, {entry_id: entry(COUNT, event_id, bucket)}, [entry_id] if read else [])


# -- track ----------------------------------------------------------------------------------------


def track_argv(
    ident: Ident, event_id: str, bucket: int, targets: list[tuple[Ident, str, str]]
) -> tuple[list[str], list[str]]:
    """KEYS and ARGV of track.lua; ``targets`` are (identity, known revision, value)."""
    k = [ident.outbox]
    argv = [
        ident.channel,
        f(bucket, event_id),
        str(bucket),
        item(ident.customer, event_id, "2025-12-02T13:00:01.000000Z"),
        states(*(t[0] for t in targets)),
    ]
    for target, known, value in targets:
        k += [target.st, target.ev(bucket)]
        argv += [known, value]
    return k, argv


TRACK_REVISION_3: dict[str, Any] = {"hashes": holding(COUNT, 3, B0, {f(B0, "e0"): "1"})}
TRACK_COUNT_AND_TOKENS: dict[str, Any] = {
    "hashes": {
        COUNT.st: snapshot_state(7, B0, B0 + 5),
        **holding(TOKENS, 2, B0, {f(B1, "e0"): f"4 {B1 + 9}"}),
    }
}
TRACK_E1_PENDING_AND_QUEUED: dict[str, Any] = {
    "hashes": holding(COUNT, 4, B0, {f(B0, "e1"): "1"}),
    "streams": queued("5-0", "e1", B0, read=False),
}
TRACK_E1_PENDING_IN_COUNT_ONLY: dict[str, Any] = {
    "hashes": {
        **holding(COUNT, 4, B0, {f(B0, "e1"): "1"}),
        TOKENS.st: snapshot_state(2, B0, B0 + 5),
    },
    "streams": queued("5-0", "e1", B0, read=False),
}
TRACK_E1_PENDING_IN_BOTH: dict[str, Any] = {
    "hashes": {
        **holding(COUNT, 4, B0, {f(B0, "e1"): "1"}),
        **holding(TOKENS, 2, B0, {f(B0, "e1"): f"3 {B0 + 9}"}),
    },
}
TRACK_TWO_EVENTS_IN_B1: dict[str, Any] = {
    "hashes": holding(TOKENS, 5, B0, {f(B1, "e1"): "3", f(B1, "e2"): "4"})
}
TRACK_COLD_UNTIL_B2: dict[str, Any] = {
    "hashes": {
        TOKENS.st: snapshot_state(5, B2, B2 + 5, n="0", u="0"),
    }
}
TRACK_HOLDS_0_1: dict[str, Any] = {"hashes": holding(TOKENS, 1, B0, {f(B0, "e1"): "0.1"})}
TRACK_ANOTHER_ENTRY_QUEUED: dict[str, Any] = {"streams": queued("1-0", "e0", B0, read=True)}
TRACK: list[Row] = [
    Row(
        "first_event_of_a_new_identity",
        "No state yet: the identity is created at a fresh revision (Redis's clock) with the "
        "event pending and undelivered, the event is queued in the outbox (created), the "
        "reply carries only the revision (the caller does not follow the identity) and the "
        "delta is published.",
        {},
        track_argv(COUNT, "e1", B0, [(COUNT, "-1", "1")]),
    ),
    Row(
        "customer_id_needing_encoding",
        "An external id with a colon, braces and a space: percent-encoded in the keys, hash tag "
        "of its shard; the outbox item keeps the raw id.",
        {},
        track_argv(ODD, "e1", B0, [(ODD, "-1", "1")]),
    ),
    Row(
        "known_revision_gets_the_delta",
        "The caller holds revision 3, the previous one: the reply is the delta (a:, n, u).",
        TRACK_REVISION_3,
        track_argv(COUNT, "e1", B0, [(COUNT, "3", "1")]),
    ),
    Row(
        "older_revision_gets_the_whole_state",
        "The caller holds revision 1 (it missed one): the reply is the whole state hash "
        "(full: 1); the published message is still the delta.",
        TRACK_REVISION_3,
        track_argv(COUNT, "e1", B0, [(COUNT, "1", "1")]),
    ),
    Row(
        "one_event_three_identities",
        "An event counting in three reducers of one customer: one script updates the three "
        "identities (one of them new), replies per identity according to its known revision, "
        "publishes one message with the three deltas and queues the event once.",
        TRACK_COUNT_AND_TOKENS,
        track_argv(
            COUNT, "e1", B1, [(COUNT, "7", "1"), (TOKENS, "2", "12"), (LARGEST, "-1", "12")]
        ),
    ),
    Row(
        "duplicate_track_changes_nothing",
        'The event is already pending in the first identity (a retried track): {"dup":1}, '
        "no write, no revision, no message, no outbox entry.",
        TRACK_E1_PENDING_AND_QUEUED,
        track_argv(COUNT, "e1", B0, [(COUNT, "4", "1")]),
    ),
    Row(
        "retry_writes_only_the_identities_new_to_the_event",
        "A retried track after a reducer appeared: the first identity already holds the event "
        "and is left alone; the second is written; the event is queued again (Polar "
        "de-duplicates it by external_id).",
        TRACK_E1_PENDING_IN_COUNT_ONLY,
        track_argv(COUNT, "e1", B0, [(COUNT, "4", "1"), (TOKENS, "2", "3")]),
    ),
    Row(
        "duplicate_in_every_identity",
        'Every identity holds the events field (acknowledged or not): {"dup":1}, nothing '
        "written or queued.",
        TRACK_E1_PENDING_IN_BOTH,
        track_argv(COUNT, "e1", B0, [(COUNT, "4", "1"), (TOKENS, "2", "3")]),
    ),
    Row(
        "bucket_aggregate_count_sum_min_max",
        "A third event in a bucket: count and sum grow, a lower value becomes the min.",
        TRACK_TWO_EVENTS_IN_B1,
        track_argv(TOKENS, "e3", B1, [(TOKENS, "5", "-1.5")]),
    ),
    Row(
        "event_into_a_cold_bucket_counts_whole",
        "The event's bucket is before cold_until (a late event): it is added to that bucket's "
        "local aggregate and stays pending like any other.",
        TRACK_COLD_UNTIL_B2,
        track_argv(TOKENS, "e1", B0, [(TOKENS, "5", "2")]),
    ),
    Row(
        "number_formatting_shortest_exact",
        "0.1 + 0.2 is written 0.30000000000000004: the shortest text that reads back exactly.",
        TRACK_HOLDS_0_1,
        track_argv(TOKENS, "e2", B0, [(TOKENS, "1", "0.2")]),
    ),
    Row(
        "number_formatting_large_values",
        "The raw value text is stored as given in the events hash; the aggregate is written by "
        "lib.lua's fmt: an integral value below 2^53 with %d, others with the first of %.15g, "
        "%.16g, %.17g that reads back exactly (here 12345678901234568, without an exponent).",
        {"hashes": {TOKENS.st: snapshot_state(1, B0, B0 + 5)}},
        track_argv(TOKENS, "e2", B0, [(TOKENS, "-1", "1.2345678901234568e+16")]),
    ),
    Row(
        "no_identity_only_queues_the_event",
        "An event no reducer counts: nothing to reduce, the event is still queued for Polar; "
        "the existing entry and its group are untouched.",
        TRACK_ANOTHER_ENTRY_QUEUED,
        track_argv(COUNT, "e1", B0, []),
    ),
]


# -- acknowledge and confirm ----------------------------------------------------------------------


def settle_argv(
    ident: Ident, entry_ids: list[str], targets: list[tuple[Ident, str, list[str]]]
) -> tuple[list[str], list[str]]:
    """KEYS and ARGV of acknowledge.lua / confirm.lua; targets are (identity, known, fields)."""
    k = [ident.outbox]
    argv = [ident.channel, GROUP, str(NOW), str(len(entry_ids)), *entry_ids]
    for target, known, fields in targets:
        k += [target.st, target.acked]
        argv += [known, str(len(fields)), *fields]
    return k, argv


ACKNOWLEDGE_ONE: dict[str, Any] = {
    "hashes": holding(COUNT, 2, B0, {f(B1, "e1"): "1"}),
    "streams": queued("1-0", "e1", B1, read=True),
}
ACKNOWLEDGE_TWICE: dict[str, Any] = {
    "hashes": holding(COUNT, 3, B0, {f(B1, "e1"): f"1 {NOW - 10}"}),
    "streams": outbox(COUNT, {}, []),
}
ACKNOWLEDGE_GONE: dict[str, Any] = {
    "hashes": {COUNT.st: snapshot_state(3, B2, B2 + 5)},
    "streams": queued("1-0", "e1", B1, read=True),
}
ACKNOWLEDGE_COLD: dict[str, Any] = {
    "hashes": holding(COUNT, 6, B2, {f(B0, "e1"): "1"}),
    "streams": queued("1-0", "e1", B0, read=True),
}
ACKNOWLEDGE_SEVERAL: dict[str, Any] = {
    "hashes": {
        **holding(COUNT, 4, B0, {f(B0, "e1"): "1", f(B0, "e2"): f"1 {NOW - 50}", f(B1, "e3"): "1"}),
        **holding(TOKENS, 9, B0, {f(B0, "e1"): "5", f(B1, "e3"): "2"}),
    },
    "streams": outbox(
        COUNT,
        {
            "1-0": entry(COUNT, "e1", B0, COUNT, TOKENS),
            "2-0": entry(COUNT, "e2", B0),
            "3-0": entry(COUNT, "e3", B1, COUNT, TOKENS),
        },
        ["1-0", "2-0", "3-0"],
    ),
}
ACKNOWLEDGE: list[Row] = [
    Row(
        "acknowledges_one_event",
        "The event is marked acknowledged (value and acknowledgement time), stays pending and "
        "in its bucket's aggregate; u drops; the outbox entry is acknowledged and deleted.",
        ACKNOWLEDGE_ONE,
        settle_argv(COUNT, ["1-0"], [(COUNT, "-1", [f(B1, "e1")])]),
    ),
    Row(
        "acknowledges_one_event_known_revision",
        "The same with the caller holding the previous revision: the reply is the delta.",
        ACKNOWLEDGE_ONE,
        settle_argv(COUNT, ["1-0"], [(COUNT, "2", [f(B1, "e1")])]),
    ),
    Row(
        "acknowledging_twice_changes_nothing",
        "Already acknowledged: no write, no revision, no message; acknowledging and deleting "
        "an outbox entry that is gone is harmless.",
        ACKNOWLEDGE_TWICE,
        settle_argv(COUNT, ["1-0"], [(COUNT, "3", [f(B1, "e1")])]),
    ),
    Row(
        "event_no_longer_pending",
        "A snapshot already counted the event (or it was confirmed): nothing changes in the "
        "hashes; the outbox entry is still acknowledged and deleted.",
        ACKNOWLEDGE_GONE,
        settle_argv(COUNT, ["1-0"], [(COUNT, "3", [f(B1, "e1")])]),
    ),
    Row(
        "cold_bucket_event_stays_pending",
        "The event's bucket is before cold_until: acknowledged, it stays pending until a "
        "snapshot counts it (or its one-hour limit passes), exactly like a hot one.",
        ACKNOWLEDGE_COLD,
        settle_argv(COUNT, ["1-0"], [(COUNT, "6", [f(B0, "e1")])]),
    ),
    Row(
        "several_identities_and_events",
        "Three entries, two identities; one event was already acknowledged (not counted "
        "twice in u). The first identity's caller holds the previous revision (delta), the "
        "second's an older one (whole state).",
        ACKNOWLEDGE_SEVERAL,
        settle_argv(
            COUNT,
            ["1-0", "2-0", "3-0"],
            [
                (COUNT, "4", [f(B0, "e1"), f(B0, "e2"), f(B1, "e3")]),
                (TOKENS, "2", [f(B0, "e1"), f(B1, "e3")]),
            ],
        ),
    ),
    Row(
        "no_outbox_entries",
        "m = 0: only the hashes change; the stream is not touched.",
        ACKNOWLEDGE_ONE,
        settle_argv(COUNT, [], [(COUNT, "-1", [f(B1, "e1")])]),
    ),
]


CONFIRM_TWO: dict[str, Any] = {
    "hashes": holding(TOKENS, 2, B0, {f(B1, "e1"): "3", f(B1, "e2"): "5"}),
    "streams": outbox(
        TOKENS, {"1-0": entry(TOKENS, "e1", B1), "2-0": entry(TOKENS, "e2", B1)}, ["1-0"]
    ),
}
CONFIRM_THREE: dict[str, Any] = {
    "hashes": holding(TOKENS, 2, B0, {f(B1, "e1"): "1", f(B1, "e2"): "3", f(B1, "e3"): "5"}),
}
CONFIRM_FLOATS: dict[str, Any] = {
    "hashes": holding(TOKENS, 2, B0, {f(B1, "e1"): "0.1", f(B1, "e2"): "0.2", f(B1, "e3"): "0.7"}),
}
CONFIRM_FLAT: dict[str, Any] = {
    "hashes": holding(COUNT, 2, B0, {f(B1, "e1"): "1", f(B1, "e2"): "1", f(B1, "e3"): "1"}),
}
CONFIRM_COLD: dict[str, Any] = {
    "hashes": holding(COUNT, 5, B2, {f(B0, "e1"): f"1 {NOW - HOUR}", f(B2, "e2"): f"1 {NOW - 5}"}),
}
CONFIRM_GONE: dict[str, Any] = {
    "hashes": {COUNT.st: snapshot_state(5, B2, B2 + 5)},
}
CONFIRM_MALFORMED: dict[str, Any] = {
    "streams": outbox(COUNT, {"1-0": {"junk": "1"}, "2-0": {"e": "{"}}, ["1-0", "2-0"]),
}
CONFIRM_SEVERAL: dict[str, Any] = {
    "hashes": {
        **holding(COUNT, 4, B1, {f(B0, "e1"): "1", f(B1, "e2"): "1", f(B1, "e3"): "1"}),
        **holding(LARGEST, 8, B1, {f(B0, "e1"): "7", f(B1, "e2"): "9"}),
    },
}
CONFIRM: list[Row] = [
    Row(
        "drops_one_event",
        "The event leaves the events hash and its bucket's aggregate at once (rebuilt from "
        "the events that remain: count, sum, min and max); n and u are recounted; the outbox "
        "entry is acknowledged and deleted, the other entry stays.",
        CONFIRM_TWO,
        settle_argv(TOKENS, ["1-0"], [(TOKENS, "-1", [f(B1, "e1")])]),
    ),
    Row(
        "last_events_of_a_bucket_delete_its_aggregate",
        "No event left in the bucket: its a: field is deleted (listed in d).",
        CONFIRM_TWO,
        settle_argv(TOKENS, ["1-0", "2-0"], [(TOKENS, "2", [f(B1, "e1"), f(B1, "e2")])]),
    ),
    Row(
        "rebuilds_min_and_max",
        "Dropping the smallest and the largest event: min and max come from the events left.",
        CONFIRM_THREE,
        settle_argv(TOKENS, [], [(TOKENS, "2", [f(B1, "e1"), f(B1, "e3")])]),
    ),
    Row(
        "a_middle_value_moves_the_aggregate_in_place",
        "Dropping an event that is neither the smallest nor the largest of its bucket: count and "
        "sum move by its value, min and max stay (the bucket's events are not read).",
        CONFIRM_THREE,
        settle_argv(TOKENS, [], [(TOKENS, "2", [f(B1, "e2")])]),
    ),
    Row(
        "equal_values_move_the_aggregate_in_place",
        "A bucket whose values are all equal (a count meter's 1s) keeps its min and max whichever "
        "event goes: count and sum move, the events are not read.",
        CONFIRM_FLAT,
        settle_argv(COUNT, [], [(COUNT, "2", [f(B1, "e1")])]),
    ),
    Row(
        "fractional_sums_are_counted_again",
        "A sum that is not an exact integer is counted again from the events left (a subtraction "
        "could drift from it in the last digit).",
        CONFIRM_FLOATS,
        settle_argv(TOKENS, [], [(TOKENS, "2", [f(B1, "e2")])]),
    ),
    Row(
        "acknowledged_events_hot_and_cold",
        "Confirm removes events whatever their state: acknowledged, in a cold bucket or a hot one.",
        CONFIRM_COLD,
        settle_argv(COUNT, [], [(COUNT, "5", [f(B0, "e1"), f(B2, "e2")])]),
    ),
    Row(
        "confirming_twice_changes_nothing",
        "The event is gone already: no write, no revision, no message.",
        CONFIRM_GONE,
        settle_argv(COUNT, ["1-0"], [(COUNT, "5", [f(B0, "e1")])]),
    ),
    Row(
        "entries_without_identities",
        "Unreadable outbox entries are settled with confirm and no identity: they are "
        "acknowledged and deleted, nothing else.",
        CONFIRM_MALFORMED,
        settle_argv(COUNT, ["1-0", "2-0"], []),
    ),
    Row(
        "several_identities_and_buckets",
        "Two identities, two buckets each: every bucket touched is rebuilt, emptied ones are "
        "deleted; one caller holds the previous revision, the other does not follow.",
        CONFIRM_SEVERAL,
        settle_argv(
            COUNT,
            [],
            [
                (COUNT, "4", [f(B0, "e1"), f(B1, "e2")]),
                (LARGEST, "-1", [f(B0, "e1"), f(B1, "e2")]),
            ],
        ),
    ),
]


# -- apply_snapshot -------------------------------------------------------------------------------


def apply_argv(
    cold: int,
    as_of: int,
    credits: list[tuple[str, str]],
    targets: list[tuple[Ident, str, str, list[str]]],
    sid: str = "s-2",
    now: int = NOW,
) -> tuple[list[str], list[str]]:
    """KEYS and ARGV of apply_snapshot.lua; targets are (identity, known, Polar's aggregate,
    counted fields)."""
    k: list[str] = []
    argv = [COUNT.channel, str(now), str(HOUR), str(cold), str(as_of), sid, str(len(credits))]
    for meter, units in credits:
        argv += [meter, units]
    for target, known, polar, counted in targets:
        k += [target.st, target.acked]
        argv += [known, polar, str(len(counted)), *counted]
    return k, argv


APPLY_SNAPSHOT_MIXED: dict[str, Any] = {
    "hashes": holding(
        COUNT,
        3,
        B0,
        {
            f(B0, "e1"): f"1 {NOW - 600_000_000}",
            f(B0, "e2"): "1",
            f(B1, "e3"): f"1 {NOW - 60_000_000}",
            f(B3, "e4"): "1",
        },
        p="2 2 1 1",
        credited={"m-count": "100"},
    )
}
APPLY_SNAPSHOT_APPLIED: dict[str, Any] = {
    "hashes": holding(
        COUNT, 5, B2, {f(B3, "e4"): "1"}, sa=NOW - 1000, p="4 4 1 1", credited={"m-count": "100"}
    )
}
APPLY_SNAPSHOT_EXPIRING: dict[str, Any] = {
    "hashes": holding(
        COUNT,
        2,
        B0,
        {
            f(B0, "e1"): f"1 {NOW - HOUR - 1}",
            f(B0, "e2"): f"1 {NOW - HOUR}",
            f(B0, "e3"): "1",
            f(B1, "e4"): f"1 {NOW - 2 * HOUR}",
            f(B3, "e5"): f"1 {NOW - 2 * HOUR}",
        },
    )
}
APPLY_SNAPSHOT_TRICKY: dict[str, Any] = {
    "hashes": holding(COUNT, 2, B1, {f(B1, "e1"): f"1 {NOW - 30_000_000}"})
}
APPLY_SNAPSHOT_CREDITS: dict[str, Any] = {
    "hashes": {
        COUNT.st: snapshot_state(2, B0, B0 + 5) | {"c:m-count": "100", "c:m-old": "5"},
    }
}
APPLY_SNAPSHOT_HOT_COUNTED: dict[str, Any] = {
    "hashes": holding(COUNT, 2, B0, {f(B2, "e1"): f"1 {NOW - 5}"})
}
APPLY_SNAPSHOT_SEVERAL: dict[str, Any] = {
    "hashes": {
        **holding(TOKENS, 4, B0, {f(B0, "e1"): f"3 {NOW - 9}", f(B0, "e2"): f"7 {NOW - 9}"}),
        **holding(LARGEST, 6, B0, {f(B0, "e1"): f"3 {NOW - 9}", f(B0, "e2"): "7"}),
    }
}
APPLY_SNAPSHOT_FIRST_WITH_EVENTS: dict[str, Any] = {
    "hashes": {
        COUNT.st: {"rev": "2", "n": "2", "u": "2", f"a:{B0}": "1 1 1 1", f"a:{B2}": "1 1 1 1"},
        **COUNT.events({f(B0, "e1"): "1", f(B2, "e2"): "1"}),
    }
}
APPLY_SNAPSHOT: list[Row] = [
    Row(
        "first_snapshot_of_a_new_identity",
        "No state yet: cold_until, as_of, the snapshot id, Polar's aggregate and the credits "
        "are written, n and u are 0, at a fresh revision (Redis's clock).",
        {},
        apply_argv(B2, B2 + 77, [("m-count", "100")], [(COUNT, "-1", "0 0 - -", [])]),
    ),
    Row(
        "counted_events_leave_the_others_stay",
        "cold_until moves from B0 to B2. The snapshot counts e1 and e3: they leave pending and "
        "their buckets' aggregates. e2 (undelivered, B0) is not counted and stays; e4 is in a "
        "hot bucket and is not touched. Polar's aggregate and cold_until are replaced.",
        APPLY_SNAPSHOT_MIXED,
        apply_argv(
            B2,
            NOW - 1000,
            [("m-count", "100")],
            [(COUNT, "3", "4 4 1 1", [f(B0, "e1"), f(B1, "e3")])],
        ),
    ),
    Row(
        "nothing_counted_whole_state_reply",
        "The snapshot counts none of the pending events: they all stay; the caller holds an "
        "older revision and gets the whole state.",
        APPLY_SNAPSHOT_MIXED,
        apply_argv(B2, NOW - 1000, [("m-count", "100")], [(COUNT, "1", "4 4 1 1", [])]),
    ),
    Row(
        "stale_lower_cold_until_changes_nothing",
        "cold_until below the applied one: nothing is written, no revision, no message.",
        APPLY_SNAPSHOT_APPLIED,
        apply_argv(B1, NOW, [("m-count", "50")], [(COUNT, "5", "9 9 1 1", [])]),
    ),
    Row(
        "stale_same_cold_until_older_as_of_changes_nothing",
        "Same cold_until, older as_of: nothing changes.",
        APPLY_SNAPSHOT_APPLIED,
        apply_argv(B2, NOW - 2000, [("m-count", "50")], [(COUNT, "5", "9 9 1 1", [])]),
    ),
    Row(
        "reapplying_the_same_snapshot_changes_nothing",
        "Same cold_until and as_of (the same snapshot, delivered twice): nothing changes.",
        APPLY_SNAPSHOT_APPLIED,
        apply_argv(B2, NOW - 1000, [("m-count", "100")], [(COUNT, "5", "4 4 1 1", [])], sid="s-1"),
    ),
    Row(
        "same_cold_until_newer_as_of_applies",
        "Same cold_until, later as_of (a credit grant, a late event): applied.",
        APPLY_SNAPSHOT_APPLIED,
        apply_argv(B2, NOW - 10, [("m-count", "150")], [(COUNT, "5", "5 5 1 1", [])]),
    ),
    Row(
        "acknowledged_events_expire_after_the_pending_limit",
        "In buckets before the new cold_until, acknowledged events no snapshot counted leave "
        "once acknowledged more than ARGV[3] (1 h) ago: e1 (1 h + 1 µs) and e4 (2 h) go, e2 "
        "(exactly 1 h) stays; e3 (never acknowledged) stays; e5 (hot bucket) stays.",
        APPLY_SNAPSHOT_EXPIRING,
        apply_argv(B2, NOW - 1000, [], [(COUNT, "2", "0 0 - -", [])]),
    ),
    Row(
        "acknowledged_while_hot_made_cold_without_count",
        "e1 was acknowledged while its bucket B1 was hot; a snapshot computed "
        "before that acknowledgement makes B1 cold without counting it. e1 stays pending and "
        "keeps counting.",
        APPLY_SNAPSHOT_TRICKY,
        apply_argv(B2, NOW - 60_000_000, [], [(COUNT, "2", "0 0 - -", [])]),
    ),
    Row(
        "credits_are_replaced",
        "Every meter of the snapshot is written; a meter the snapshot no longer lists loses "
        "its c: field (listed in d).",
        APPLY_SNAPSHOT_CREDITS,
        apply_argv(
            B1,
            B1 + 7,
            [("m-count", "120.5"), ("m-new", "0")],
            [(COUNT, "2", "0 0 - -", [])],
        ),
    ),
    Row(
        "no_credits",
        "m = 0: every c: field is deleted.",
        APPLY_SNAPSHOT_CREDITS,
        apply_argv(B1, B1 + 7, [], [(COUNT, "2", "0 0 - -", [])]),
    ),
    Row(
        "counted_field_at_or_after_cold_until_is_ignored",
        "A counted field whose bucket is not before cold_until is left alone (Polar's totals "
        "do not include it).",
        APPLY_SNAPSHOT_HOT_COUNTED,
        apply_argv(B2, NOW - 1, [], [(COUNT, "2", "0 0 - -", [f(B2, "e1")])]),
    ),
    Row(
        "several_identities",
        "One snapshot, three reducers of the customer: e2 is counted in both identities that "
        "hold it; min and max of B0 come from e1 alone; the third identity is new. Replies: "
        "delta, whole state, revision only.",
        APPLY_SNAPSHOT_SEVERAL,
        apply_argv(
            B1,
            NOW - 100,
            [("m-tokens", "1000"), ("m-largest", "0")],
            [
                (TOKENS, "4", "1 7 7 7", [f(B0, "e2")]),
                (LARGEST, "3", "1 7 7 7", [f(B0, "e2")]),
                (COUNT, "-1", "1 1 1 1", []),
            ],
        ),
    ),
    Row(
        "first_snapshot_after_events_were_tracked",
        "Events were tracked before any snapshot (no cu yet): the first snapshot applies "
        "whatever its cold_until, counting e1; e2 is hot.",
        APPLY_SNAPSHOT_FIRST_WITH_EVENTS,
        apply_argv(B1, NOW - 100, [], [(COUNT, "2", "1 1 1 1", [f(B0, "e1")])]),
    ),
]


# -- reclaim --------------------------------------------------------------------------------------


def held(pending: dict[str, list[str]]) -> dict[str, Any]:
    """Four entries of COUNT's outbox, read in order by the consumers of ``pending``."""
    ids = ["1-0", "2-0", "3-0", "4-0"]
    return {
        "streams": {
            COUNT.outbox: {
                "entries": [{"id": i, "fields": entry(COUNT, f"e{i[0]}", B0)} for i in ids],
                "groups": {GROUP: {"pending": pending}},
            }
        }
    }


def reclaim_argv(taker: str, count: int, *consumers: str) -> tuple[list[str], list[str]]:
    return [COUNT.outbox], [GROUP, taker, str(count), *consumers]


RECLAIM: list[Row] = [
    Row(
        "takes_what_a_dead_consumer_holds_and_removes_it",
        "w1's heartbeat expired: w2 takes both entries it held (reply: their ids and fields) and "
        "w1, now holding nothing, leaves the group (reply d).",
        held({"w1": ["1-0", "2-0"]}),
        reclaim_argv("w2", 100, "w1"),
    ),
    Row(
        "count_bounds_what_is_taken",
        "At most ARGV[3] entries per consumer: w2 takes the oldest, w1 still holds one and stays.",
        held({"w1": ["1-0", "2-0"]}),
        reclaim_argv("w2", 1, "w1"),
    ),
    Row(
        "several_dead_consumers",
        "Two dead consumers: w3 takes what each holds, in the order given, and both leave.",
        held({"w1": ["1-0"], "w2": ["2-0", "3-0"]}),
        reclaim_argv("w3", 100, "w1", "w2"),
    ),
    Row(
        "closing_consumer_holding_entries_stays",
        "A closing instance (taker empty) holding entries takes nothing and stays in the group: "
        "others take its entries once they find its heartbeat gone.",
        held({"w1": ["1-0"]}),
        reclaim_argv("", 0, "w1"),
    ),
    Row(
        "consumer_holding_nothing_is_removed",
        "A consumer that holds nothing (or is unknown) is removed; nothing is taken.",
        held({"w1": ["1-0"]}),
        reclaim_argv("", 0, "w9"),
    ),
]


# -- budget ---------------------------------------------------------------------------------------

SECOND = 1_000_000


def budget_before(state: dict[str, str] | None) -> dict[str, Any]:
    """The budget hash as ``state`` says, or no budget yet."""
    return {"hashes": {keys.BUDGET_KEY: state}} if state else {}


# KEYS and ARGV of every budget case: 300 requests a minute, a bucket of 20, the caller's clock.
BUDGET_ARGV = ([keys.BUDGET_KEY], ["300", "20", str(NOW)])
BUDGET: list[Row] = [
    Row(
        "a_new_bucket_starts_full",
        "No budget yet: it starts with its capacity (20), one request is taken (reply 0), the "
        "hash expires once it would be full again.",
        budget_before(None),
        BUDGET_ARGV,
    ),
    Row(
        "the_bucket_fills_at_the_rate",
        "Empty one second ago: 300 a minute is 5 a second, so 5 are there; one is taken.",
        budget_before({"t": "0", "at": str(NOW - SECOND)}),
        BUDGET_ARGV,
    ),
    Row(
        "fill_stops_at_capacity",
        "An hour idle fills the bucket to its capacity, not beyond.",
        budget_before({"t": "3", "at": str(NOW - 3600 * SECOND)}),
        BUDGET_ARGV,
    ),
    Row(
        "an_empty_bucket_reserves_the_next_request",
        "Half a request left: the caller takes the next one (t goes to -0.5) and the reply is "
        "the µs until it comes (0.5 / 5 per second = 100 ms).",
        budget_before({"t": "0.5", "at": str(NOW)}),
        BUDGET_ARGV,
    ),
    Row(
        "callers_queue_behind_a_reservation",
        "Already overdrawn by one: the next caller waits for two requests' refill (400 ms).",
        budget_before({"t": "-1", "at": str(NOW)}),
        BUDGET_ARGV,
    ),
    Row(
        "a_clock_behind_fills_nothing",
        "The caller's clock is behind the last fill: nothing is added, `at` stays.",
        budget_before({"t": "1.25", "at": str(NOW + 5 * SECOND)}),
        BUDGET_ARGV,
    ),
]


# -- admission: reserve, release, admit --------------------------------------------------------

ALIAS = Ident("c1-alias", "r-count")  # another name of the customer (Polar's alias)
TTL_US = 60 * SECOND


def credited_state(rev: int, credited: str, p: str = "2 2 1 1", **more: str) -> dict[str, str]:
    """A state hash with a snapshot crediting ``credited`` units of m-count (Polar counts 2)."""
    return snapshot_state(rev, B0, B0 + 5, p, **{"c:m-count": credited, **more})


def reserve_argv(
    units: str, hold: str, *names: Ident, func: str = "count", known: str = "4"
) -> tuple[list[str], list[str]]:
    """KEYS and ARGV of reserve.lua: COUNT's state hash, then the other names'."""
    k = [COUNT.st, *(n.st for n in names)]
    argv = [COUNT.channel, str(NOW), f"h:{hold}", units, str(NOW + TTL_US), func, "c:m-count"]
    return k, [*argv, known]


RESERVE: list[Row] = [
    Row(
        "a_covered_reservation_holds",
        "Credited 10, Polar counts 2: 8 available; 5 are held until now + 60 s.",
        {"hashes": {COUNT.st: credited_state(4, "10")}},
        reserve_argv("5", "a"),
    ),
    Row(
        "a_reservation_beyond_the_available_balance_is_refused",
        "8 left, 5 held by another reservation: 4 are refused, with the balance and what is "
        "held; nothing is written.",
        {"hashes": {COUNT.st: credited_state(4, "10", **{"h:b": f"5 {NOW + 9}"})}},
        reserve_argv("4", "a"),
    ),
    Row(
        "a_hold_expiring_now_no_longer_counts_and_is_pruned",
        "A hold of 8 expiring at `now` neither counts nor stays: 8 are held, the old hold is "
        "deleted in the same change.",
        {"hashes": {COUNT.st: credited_state(4, "10", **{"h:old": f"8 {NOW}"})}},
        reserve_argv("8", "a"),
    ),
    Row(
        "a_retried_reservation_writes_nothing",
        "The hold's field is there already: {dup: 1}.",
        {"hashes": {COUNT.st: credited_state(4, "10", **{"h:a": f"1 {NOW + 9}"})}},
        reserve_argv("1", "a"),
    ),
    Row(
        "the_other_names_count",
        "The other name's snapshot is newer (credits 6, Polar counts 1); its pending event "
        "and its hold of 2 count too: 6 - 1 - 1 - 2 = 2 available, 3 are refused.",
        {
            "hashes": {
                COUNT.st: credited_state(4, "10"),
                ALIAS.st: snapshot_state(
                    3,
                    B1,
                    B1 + 5,
                    "1 1 1 1",
                    **{"c:m-count": "6", f"a:{B1}": "1 1 1 1", "h:x": f"2 {NOW + 9}"},
                ),
            }
        },
        reserve_argv("3", "a", ALIAS),
    ),
    Row(
        "a_sum_meter_holds_its_units",
        "Summed: credited 10, Polar's sum 4.5: 5.5 are held.",
        {"hashes": {COUNT.st: credited_state(4, "10", p="2 4.5 1 3.5")}},
        reserve_argv("5.5", "a", func="sum"),
    ),
]


def release_argv(hold: str, known: str = "4") -> tuple[list[str], list[str]]:
    return [COUNT.st], [COUNT.channel, str(NOW), f"h:{hold}", known]


RELEASE: list[Row] = [
    Row(
        "a_release_frees_its_own_hold",
        "Two holds: only `h:a` goes.",
        {
            "hashes": {
                COUNT.st: credited_state(4, "10", **{"h:a": f"1 {NOW + 9}", "h:b": f"2 {NOW + 9}"})
            }
        },
        release_argv("a"),
    ),
    Row(
        "a_release_prunes_expired_holds",
        "`h:old` expired: it goes with the released hold.",
        {
            "hashes": {
                COUNT.st: credited_state(
                    4, "10", **{"h:a": f"1 {NOW + 9}", "h:old": f"2 {NOW - 1}"}
                )
            }
        },
        release_argv("a"),
    ),
    Row(
        "an_expired_hold_is_released_by_its_pruning",
        "The hold expired at `now`: it is pruned, one deletion, whatever the caller asked.",
        {"hashes": {COUNT.st: credited_state(4, "10", **{"h:a": f"1 {NOW}"})}},
        release_argv("a"),
    ),
    Row(
        "a_caller_that_does_not_follow_the_hash_gets_the_revision_only",
        "Known revision -1: the reply names the key and its new revision; the message carries "
        "the deletion.",
        {"hashes": {COUNT.st: credited_state(4, "10", **{"h:a": f"1 {NOW + 9}"})}},
        release_argv("a", known="-1"),
    ),
    Row(
        "releasing_twice_changes_nothing",
        "No such hold: no change, nothing published.",
        {"hashes": {COUNT.st: credited_state(4, "10")}},
        release_argv("a"),
    ),
]


def admit_argv(
    event_id: str,
    value: str,
    check: str,
    *,
    hold: str = "",
    hold_in: Ident | None = None,
    names: tuple[Ident, ...] = (),
    known: str = "4",
) -> tuple[list[str], list[str]]:
    """KEYS and ARGV of admit.lua for one identity (COUNT) in bucket B3."""
    k, argv = track_argv(COUNT, event_id, B3, [(COUNT, known, value)])
    argv += [str(NOW), "1"]
    identity = [known, value, check]
    identity += ["1", "c:m-count"] if check else ["0"]
    extra: list[str] = []
    if hold_in is not None and hold_in is not COUNT:
        extra.append(hold_in.st)
    hold_at = "2" if hold_in is COUNT else str(len(k) + 1) if hold_in else "0"
    argv += [f"h:{hold}" if hold else "", hold_at, "-1" if hold_in is not COUNT else known]
    at = []
    for name in names:
        extra.append(name.st)
        at.append(str(len(k) + len(extra)))
    identity += [str(len(at)), *at]
    del argv[5:7]  # track's known revision and value move into the identity's arguments
    return [*k, *extra], [*argv, *identity]


ADMIT: list[Row] = [
    Row(
        "a_covered_event_is_recorded",
        "8 available: the count event (asks 1) is recorded as track.lua records it.",
        {"hashes": {COUNT.st: credited_state(4, "10")}},
        admit_argv("e1", "1", "count"),
    ),
    Row(
        "an_uncovered_event_is_refused",
        "2 left and 2 held: refused, nothing written.",
        {"hashes": {COUNT.st: credited_state(4, "4", **{"h:b": f"2 {NOW + 9}"})}},
        admit_argv("e1", "1", "count"),
    ),
    Row(
        "a_sum_check_asks_for_the_value",
        "Summed: 10 - 4.5 = 5.5 available, an event of 6 is refused.",
        {"hashes": {COUNT.st: credited_state(4, "10", p="2 4.5 1 3.5")}},
        admit_argv("e1", "6", "sum"),
    ),
    Row(
        "a_commit_records_and_releases_its_hold",
        "No check; the hold of the same hash is deleted in the event's change.",
        {"hashes": {COUNT.st: credited_state(4, "1", **{"h:a": f"5 {NOW + 9}"})}},
        admit_argv("e1", "7", "", hold="a", hold_in=COUNT),
    ),
    Row(
        "a_commit_releases_a_hold_in_another_hash",
        "The hold is in the tokens identity's hash, which the event does not count in: a second "
        "change deletes it.",
        {
            "hashes": {
                COUNT.st: credited_state(4, "10"),
                TOKENS.st: snapshot_state(2, B0, B0 + 5, **{"h:a": f"5 {NOW + 9}"}),
            }
        },
        admit_argv("e1", "1", "", hold="a", hold_in=TOKENS),
    ),
    Row(
        "the_other_names_count_in_a_check",
        "The other name holds 7 of 8: 1 left, 1 is admitted.",
        {
            "hashes": {
                COUNT.st: credited_state(4, "10"),
                ALIAS.st: snapshot_state(3, B0, B0 + 5, **{"h:x": f"7 {NOW + 9}"}),
            }
        },
        admit_argv("e1", "1", "count", names=(ALIAS,)),
    ),
    Row(
        "a_retried_admission_writes_nothing",
        "The event is pending already: {dup: 1}, nothing checked or written.",
        {
            "hashes": {
                COUNT.st: credited_state(4, "0"),
                COUNT.ev(B3): {f(B3, "e1"): "1"},
            }
        },
        admit_argv("e1", "1", "count"),
    ),
]


# -- recording ------------------------------------------------------------------------------------


def indexed(before: dict[str, Any]) -> dict[str, Any]:
    """``before`` with the acknowledged set of every identity that has acknowledged events (member:
    the events field, score: when it was acknowledged), as acknowledge.lua keeps it."""
    zsets: dict[str, dict[str, str]] = {}
    for key, fields in before.get("hashes", {}).items():
        state, found, _ = key.rpartition(":ev:")
        for name, value in fields.items() if found else ():
            if " " in value:
                zsets.setdefault(keys.acked_key(state), {})[name] = value.split(" ")[1]
    return {**before, "zsets": zsets} if zsets else before


def case(name: str, description: str, before: dict[str, Any], k: list[str], a: list[str]) -> Case:
    before = indexed(before)
    return {"name": name, "description": description, "before": before, "keys": k, "argv": a}


# -- apply_anchor (the public-API mode) ------------------------------------------------------------

METER = Ident("c1", "m-1")  # the public mode's reducer of a meter is the meter id


def anchor_argv(
    expected: str,
    known: str,
    removed: list[str],
    *,
    credited: str = "50",
    p: str = "1 8 8 8",
    sa: int = NOW,
    pub: str = '{"v":1,"a":[8,50,42,' + str(NOW) + '],"b":8,"h":null,"r":0,"q":null,"k":[]}',
) -> tuple[list[str], list[str]]:
    """KEYS and ARGV of apply_anchor.lua."""
    argv = [METER.channel, expected, known, "m-1", credited, p, "0", str(sa), "public", pub]
    return [METER.st, METER.acked], [*argv, str(len(removed)), *removed]


def public_state(rev: int, events: dict[str, str]) -> dict[str, Any]:
    hashes = holding(METER, rev, 0, events, sa=0, credited={"m-1": "40"})
    hashes[METER.st]["sid"] = "public"
    return hashes


APPLY_ANCHOR: list[Row] = [
    Row(
        "first_anchor_of_a_new_identity",
        "No state hash yet (expected revision empty): the anchor fields are written, n and u "
        "start at 0, the revision starts from Redis's clock.",
        {},
        anchor_argv("", "-1", [], credited="100", p="0 0 - -", sa=0),
    ),
    Row(
        "prunes_the_events_the_figure_includes",
        "e1 and e2 leave their bucket (deleted with its a: field), e3 stays pending; p, c:, sa "
        "and pub are written, the revision moves on, the caller at the previous revision gets "
        "the delta.",
        {
            "hashes": public_state(
                3,
                {f(B0, "e1"): f"5 {NOW - 90}", f(B0, "e2"): f"3 {NOW - 80}", f(B1, "e3"): "4"},
            )
        },
        anchor_argv("3", "3", [f(B0, "e1"), f(B0, "e2")]),
    ),
    Row(
        "part_of_a_bucket",
        "One event of two leaves its bucket: the bucket's aggregate moves by its value.",
        {"hashes": public_state(3, {f(B0, "e1"): f"5 {NOW - 90}", f(B0, "e2"): f"3 {NOW - 80}"})},
        anchor_argv("3", "-1", [f(B0, "e1")]),
    ),
    Row(
        "a_moved_revision_is_a_conflict",
        "The hash is at revision 4, the caller read 3: nothing is written or published.",
        {"hashes": public_state(4, {f(B0, "e1"): f"5 {NOW - 90}"})},
        anchor_argv("3", "3", [f(B0, "e1")]),
    ),
    Row(
        "a_hash_that_appeared_is_a_conflict",
        "The caller read no hash (expected empty) but one exists now: nothing is written.",
        {"hashes": public_state(2, {})},
        anchor_argv("", "-1", []),
    ),
]


def cases(rows: list[Row]) -> list[Case]:
    """One case per row, in the table's order."""
    return [case(row.name, row.description, row.before, *row.keys_argv) for row in rows]


CASES: dict[str, list[Case]] = {
    "track": cases(TRACK),
    "acknowledge": cases(ACKNOWLEDGE),
    "confirm": cases(CONFIRM),
    "apply_snapshot": cases(APPLY_SNAPSHOT),
    "reclaim": cases(RECLAIM),
    "budget": cases(BUDGET),
    "reserve": cases(RESERVE),
    "release": cases(RELEASE),
    "admit": cases(ADMIT),
    "apply_anchor": cases(APPLY_ANCHOR),
}


def header(script: str) -> dict[str, Any]:
    return {"schema": SCHEMA, "script": script, "sha1": SCRIPT_SHA1[script]}


def record() -> dict[str, str]:
    """Run every case; return file name → the JSON Lines text."""
    files: dict[str, str] = {}
    with running() as server:
        client = server.client()
        pubsub = subscribe(client)
        try:
            for script in SCRIPTS:
                lines = [header(script)]
                names: set[str] = set()
                for spec in CASES[script]:
                    if spec["name"] in names:
                        raise ValueError(f"{script}: two cases named {spec['name']}")
                    names.add(spec["name"])
                    result = execute(
                        client,
                        pubsub,
                        SCRIPT_TEXT[script],
                        spec["before"],
                        spec["keys"],
                        spec["argv"],
                    )
                    lines.append({**spec, **result})
                text = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)
                files[f"{script}.jsonl"] = text
        finally:
            pubsub.close()
    return files


def readme_with_sha1s(text: str) -> str:
    """README.md with its SHA1 table (``| `name` | `sha1` |`` rows) set to the current scripts."""

    def row(match: re.Match[str]) -> str:
        return f"| `{match[1]}` | `{SCRIPT_SHA1[match[1]]}` |"

    return SHA1_ROW.sub(row, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if a file would change")
    args = parser.parse_args(argv)
    files = {f"lua/{name}": text for name, text in record().items()}
    files["README.md"] = readme_with_sha1s(README.read_text(encoding="utf-8"))
    stale = []
    for name, text in files.items():
        path = ROOT / name
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        stale.append(name)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    if args.check and stale:
        sys.stdout.write(
            f"stale: {', '.join(stale)}: run python -m conformance.record_lua_vectors\n"
        )
        return 1
    for name in stale if not args.check else []:
        sys.stdout.write(f"wrote conformance/{name}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

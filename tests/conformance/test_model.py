"""The whole of Outpost against a reference model of Polar, as a hypothesis state machine: the
invariant of docs/invariant.md.

What runs for real: two ``outpost_core.Session`` instances driven the way the drivers drive them
(effects run in order, replies and published messages handed back; the only liberty is that the
loads of one batch of effects share a pipeline): instance A has the
WebSocket link (wsproto on both ends, Polar's end answered by the model in ``_polar.py``) and
applies the snapshots; instance B has no link and only follows Redis. A real
``outpost_core._delivery.Delivery`` decides batches, retries, splits and settlements. Every write
is one of the real Lua scripts (``lua/``) on a real redis-server; pub/sub messages come from
SSUBSCRIBE on the shard channels.

What the test decides (the rules): tracking events (count; ``tokens``, a non-negative number or
missing, for sum, max, min and avg; timestamps now or in the past; retried tracks); each delivery
attempt's fate (accepted, a 422 that names the bad events or not, a lost response or a reset
after Polar stored the batch, a timeout before it did, a refused connection, a 503, a 500 after
or before Polar stored the batch), one attempt or the same fate for every attempt until the
batch is dropped (so drops after uncertain attempts, which must be acknowledged and not
confirmed, are common), with the settlement (acknowledge or confirm) run at once or held and run
later; time passing, by some minutes or to the next *edge* (the exact moment one of Polar's or
the SDK's limits bites: see :meth:`OutpostModel.next_edge`), with Polar syncing its closed
buckets on time or late (a late sync moves ``cold_until``), and no earlier than its promise
forces it when late (in half the examples Polar is always that late:
:meth:`OutpostModel.polar_character`); a race at the one-hour pending limit's edge
(:meth:`OutpostModel.race_the_pending_limit`); Polar computing a snapshot at one moment, kept
aside and pushed later, any number of times, in any order (a snapshot older than ten minutes
gets ``snapshot_expired`` when its ``counted`` question comes, and the core asks for a fresh
one); credit grants; pub/sub messages delivered late, twice or out
of order, and lost with a re-subscription; the WebSocket dropping and reconnecting. Seals are not
modelled: a sealed bucket's later events start a new generation, and a snapshot's totals cover
every generation, so seals change nothing the SDK can see.

Invariants, after every step:

* **Redis is self-consistent**: each ``a:<bucket>`` is the aggregate of the events of that bucket
  in the events hash; ``n`` and ``u`` count them and the unacknowledged ones.
* **Never above Polar** (docs/design.md): for every customer and reducer, the local
  aggregate (Polar's totals before ``cold_until`` combined with every ``a:`` bucket) is at least
  Polar's *eventual* aggregate of the events it stored (every one of them will be counted once
  its bucket syncs), for **count**, **sum** (values are non-negative) and **max**. So the local
  balance of a count, sum or max meter is never higher than the balance Polar will bill.
* **Never counted twice** (docs/invariant.md, "What counted means"): no pending event of a
  bucket before ``cold_until`` is in the totals of the snapshot applied (an event leaves pending
  exactly when the totals include it), except one ``track()`` was called again for after it left.
* **Admission is exact** (docs/admission.md): a reservation is admitted exactly when the
  available balance the model computes from Redis (credited, less consumed, less the units of
  the holds it opened that have not expired, a hold expiring at ``now`` no longer counting) covers
  it; so at every admission what is committed and held never exceeds what was available. The
  holds in Redis that have not expired are exactly those the model holds open (a release frees
  its own hold only), and every read's ``held`` counts them.
* **Copies follow Redis**: once an instance has been handed every message published so far, its
  copies equal the state hashes field for field, and its ``read()`` (and the warm
  ``cached_balance()``, when set) equals what Redis says. Out-of-order messages make revision
  gaps; a copy that applied a change across one misses the skipped change's fields.

At quiescence (at the end of every example, :meth:`OutpostModel.quiesce`): every held settlement
run; time moves into the next bucket, Polar syncs and computes a snapshot of each customer,
everything is delivered after it, then it is applied (an acknowledgement racing a snapshot, and a
last cold bucket holding just-delivered events), with the invariants checked; time past every
bucket and the one-hour pending limit, Polar synced, and one final snapshot per customer computed
and applied. Then the local aggregates **equal** Polar's (count, sum, min and max), nothing is
pending, both instances read Polar's consumption and credits for every meter (count, sum, max, min
and avg), and every tracked event was either stored by Polar or reported to ``on_dropped``.

What min and avg can and cannot promise: the local aggregate covers a *superset* of the events
Polar will count (events Polar has not stored yet, events it never will: a batch whose fate is
unknown stays counted for up to an hour). A superset can only raise count, sum of non-negative
values, and max, so those are bounds. **min** over a superset can be *lower* than Polar's min,
so a min meter's local consumption can be lower, and its balance higher, than Polar's; **avg**
has no monotonicity at all (one more event moves it either way), so its local balance can be on
either side. Both are therefore only tested for convergence at quiescence, where the two sets
are equal.

The model's assumptions (what Polar must do for the bound to hold), exactly as loose as the SDK
allows, so that an off-by-one shows: Polar counts every event it stored within 50 minutes
(strictly: a snapshot computed more than 50 minutes after it stored an event counts it; one
computed at exactly 50 minutes need not), and a snapshot is applied within ten minutes of
``as_of`` (enforced by ``snapshot_expired``, which comes strictly after ten minutes). Together
they are why the one-hour pending limit holds: an acknowledged event leaves pending at a snapshot
applied *more than* an hour after its acknowledgement, computed more than 50 minutes after Polar
stored it. A sync later than that is a Polar failure mode. Polar never answers 422 for an event
it stored.

Run more examples (a few minutes)::

    OUTPOST_MODEL_EXAMPLES=5000 pytest tests/conformance/test_model.py

``OUTPOST_MODEL_STEPS`` sets the steps per example (default 40; 600 examples by default: enough
for every mutant of ``conformance/mutants/`` to be caught from any seed), ``OUTPOST_MODEL_SEED``
a fixed seed.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import sys
from collections.abc import Iterator, Mapping
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    get_state_machine_test,
    initialize,
    invariant,
    precondition,
    rule,
)

import outpost_core as oc
from outpost_core import _keys as keys
from outpost_core._aggregate import format_number
from outpost_core._link import LinkState
from tests.conformance._polar import (
    COUNT_WITHIN_US,
    HOUR_US,
    MINUTE_US,
    PENDING_LIMIT_US,
    Event,
    Polar,
    PolarSocket,
    Reducer,
    wire,
)
from tests.support.redis_server import RedisServer

EXAMPLES = int(os.environ.get("OUTPOST_MODEL_EXAMPLES", "600"))
STEPS = int(os.environ.get("OUTPOST_MODEL_STEPS", "40"))
SEED = os.environ.get("OUTPOST_MODEL_SEED")
"""A fixed seed for the run (by default hypothesis draws one)."""

T0 = 1_764_680_400_000_000 + 17_000_000  # 17 s into a bucket
CUSTOMERS = ("c1", "c:2 {x}")
REDUCERS = (
    Reducer("r-count", "m-count", "count"),
    Reducer("r-sum", "m-sum", "sum"),
    Reducer("r-max", "m-max", "max"),
    Reducer("r-min", "m-min", "min"),
    Reducer("r-avg", "m-avg", "avg"),
)
CONFIGURATION = {
    "organization_id": "org",
    "meters": [],
    "reducers": [
        {
            "id": r.id,
            "filter": {"conjunction": "and", "clauses": []},
            "aggregation": {"func": r.func}
            if r.func == "count"
            else {"func": r.func, "property": "tokens"},
            "meter_ids": [r.meter_id],
        }
        for r in REDUCERS
    ],
}
IDENTITIES = [
    (customer, reducer, keys.state_key(keys.Customer("external", customer), reducer.id))
    for customer in CUSTOMERS
    for reducer in REDUCERS
]
SENTINEL = "outpost:model:sentinel"
CONSUMER = "model"
OUTCOMES = (
    *["accept"] * 4,
    "accept_no_locs",
    "lost",
    "unsent",
    "refused",
    "unavailable",
    "failed",
    "failed_unstored",
)
"""What one delivery attempt meets (mostly success): Polar answers (200, or 422 with the bad
events' locations), Polar answers 422 without usable locations (the batch is bisected), Polar
stores the batch but the response is lost (a read timeout or a reset: maybe sent), the request
dies before Polar stores it (a write timeout: maybe sent), the connection is refused (not sent),
Polar answers 503 (unavailable: wait), Polar stores the batch then answers 500, Polar answers
500 without storing it."""
MAX_ATTEMPTS = 3
ATTEMPTS = (1, MAX_ATTEMPTS)
"""How many attempts in a row meet the same outcome: one, or enough to drop a batch whose
attempts all fail (so uncertain drops are common, not a three-in-a-row accident)."""
MINUTES: tuple[int | str, ...] = (0, 1, 3, 6, 6, 10, 12, 30, 70, "edge", "edge")
"""How far time moves in one step; ``"edge"``: to the next moment a promise bites exactly (see
:meth:`OutpostModel.next_edge`), where an off-by-one in the SDK shows."""
ADMITTING = tuple(r for r in REDUCERS if r.func in ("count", "sum"))
"""The reducers whose meters take reservations."""
HOLD_UNITS = (5.0, 30.0, 60.0, 100.0)
"""Units a reservation asks for, against credits of 100: a few of them exhaust the balance."""
HOLD_TTL_MINUTES = (1, 3, 6)
"""How long a hold lives: whole minutes, as time moves, so a step lands on an expiry exactly."""


Hashes = dict[tuple[str, Reducer], tuple[str, dict[bytes, bytes], dict[bytes, bytes]]]
"""(customer, reducer) → (state key, state hash, events hash)."""


class World:
    """What outlives one example: the Redis connections and the scripts to run."""

    def __init__(self, server: RedisServer, scripts: Mapping[str, str]) -> None:
        self.client = server.client()
        self.scripts = {name: self.client.register_script(text) for name, text in scripts.items()}
        self.pubsub = self.client.pubsub()  # type: ignore[no-untyped-call,unused-ignore]
        self.pubsub.ssubscribe(*keys.all_channels(), SENTINEL)
        self.writes = 0
        """Scripts run that changed an identity (each publishes one message)."""

    def messages(self) -> list[bytes]:
        """Every message published on the shard channels and not read yet, in order."""
        self.client.spublish(SENTINEL, "end")
        out: list[bytes] = []
        while True:
            data = self.next_message()
            if data is None:
                return out
            out.append(data)

    def next_message(self) -> bytes | None:
        """The next message of a shard channel (``None``: the sentinel)."""
        while True:
            message = self.pubsub.get_message(timeout=5.0)
            if message is None:
                raise AssertionError("a published message never arrived")
            if message["type"] != "smessage":
                continue
            if message["channel"] == SENTINEL.encode():
                return None
            data: bytes = message["data"]
            return data

    def run(
        self, name: str, keys_: tuple[str, ...], args: tuple[str, ...]
    ) -> tuple[Any, bytes | None]:
        """Run a script; return its reply and the message it published (each script that
        changes something publishes exactly one, before its reply)."""
        reply = self.scripts[name](keys=keys_, args=args)
        changes = json.loads(cast(bytes, oc.reply_of(reply))).get("c")
        if not changes:  # {"dup": 1}, or {"c": {}} (cjson's empty list): nothing written
            return reply, None
        self.writes += 1
        data = self.next_message()
        assert data is not None, f"{name} changed {len(changes)} identities but published nothing"
        if isinstance(reply, list):  # whole states, with the published text beside them
            assert reply[0] == data, f"{name} replied another text than it published"
        return reply, data

    def close(self) -> None:
        self.pubsub.close()


class Instance:
    """One SDK instance: a core session, and a driver loop that runs its effects at once."""

    def __init__(self, name: str, machine: OutpostModel, link: oc.Link | None) -> None:
        self.name = name
        self.machine = machine
        # The model's clock jumps by hours: customers are never let go here for being idle
        # (tests/core covers letting go).
        self.session = oc.Session(oc.Settings(idle_customer_ttl=1e12), link=link)
        self.session.handle(oc.SubscriberRestarted())  # the subscriber confirms, as at a start
        self.socket: PolarSocket | None = None
        self.inbound = bytearray()
        self.queue: list[bytes] = []
        """Messages published and not yet handed to this instance."""
        self.inputs = 0
        self.checked: tuple[int, int] | None = None
        """(Redis writes, inputs) when the copies were last compared with Redis."""

    def handle(self, event: oc.Input) -> None:
        self.inputs += 1
        self.session.handle(event)
        self.drive()

    def drive(self) -> None:
        """Run effects, and what their outcomes cause, until the core asks for nothing more."""
        for _ in range(10_000):
            effects = self.session.effects()
            if not effects and not self.inbound:
                return
            self.inputs += 1
            loads = [e for e in effects if isinstance(e, oc.LoadIdentity)]
            if loads:  # independent reads: one round trip (the drivers run them one by one)
                pipe = self.machine.client.pipeline(transaction=False)
                for load in loads:
                    pipe.hgetall(load.key)
                for load, fields in zip(loads, pipe.execute(), strict=True):
                    self.session.handle(oc.IdentityLoaded(load.key, fields, load.load_id))
            for effect in effects:
                if not isinstance(effect, oc.LoadIdentity):
                    self.run(effect)
            if self.inbound:
                data, self.inbound = bytes(self.inbound), bytearray()
                self.session.handle(oc.BytesReceived(self.machine.mono, data))
        raise AssertionError(f"{self.name}: the core never stopped asking")

    def run(self, effect: oc.Effect) -> None:
        client = self.machine.world.client
        if isinstance(effect, oc.StoreConfiguration):
            client.set(effect.key, effect.text)
        elif isinstance(effect, oc.RunScript):
            reply = self.machine.script(effect.script, effect.keys, effect.args)
            self.session.handle(oc.ScriptReplied(reply, effect.tag))
        elif isinstance(effect, oc.ListPending):
            pipe = client.pipeline(transaction=False)
            for key in effect.keys:
                pipe.hkeys(key)
            fields = dict(zip(effect.keys, pipe.execute(), strict=True))
            self.session.handle(oc.PendingListed(effect.tag, fields))
        elif isinstance(effect, oc.OpenConnection):
            self.socket = PolarSocket(self.machine.answer)
            self.session.handle(oc.ConnectionOpened(self.machine.mono))
        elif isinstance(effect, oc.SendBytes):
            if self.socket is not None:
                self.inbound += self.socket.receive(effect.data)
        elif isinstance(effect, oc.CloseConnection):
            self.socket = None
            self.inbound.clear()
        else:  # pragma: no cover - every effect is handled above
            raise AssertionError(f"unknown effect {effect!r}")

    def read(self, meter_id: str, customer: str) -> oc.Balance:
        for _ in range(100):
            balance = self.session.read(meter_id, external_customer_id=customer)
            if isinstance(balance, oc.Fetch):  # the copy does not follow Redis: read the hash
                fields = {k: self.machine.client.hgetall(k) for k in balance.keys}
                balance = self.session.read_fetched(meter_id, customer, None, fields)
            if balance is not None:
                return balance
            self.drive()
        raise AssertionError(f"{self.name} cannot read {meter_id} of {customer}")

    def overtaking(self) -> int:
        """The last queued message that changes an identity the next one changes too (the one
        after the next when none does): the revisions between are skipped, so the copy sees a
        gap as wide as the queue allows."""
        touched = _identities(self.queue[0])
        for index in range(len(self.queue) - 1, 0, -1):
            if touched & _identities(self.queue[index]):
                return index
        return min(1, len(self.queue) - 1)

    def deliver(self, index: int, keep: bool) -> None:
        data = self.queue[index] if keep else self.queue.pop(index)
        self.handle(oc.ChangePublished(data))


def _identities(message: bytes) -> set[str]:
    return {change["k"] for change in json.loads(message)["c"]}


def local_aggregate(state: Mapping[bytes, bytes]) -> oc.Aggregate:
    total = oc.Aggregate()
    for name, text in state.items():
        if name.startswith(b"a:") or name == b"p":
            agg = oc.Aggregate.decode(text.decode())
            assert agg is not None, f"unreadable {name!r}={text!r}"
            total = total.merge(agg)
    return total


class OutpostModel(RuleBasedStateMachine):
    world: World  # set on the class by the test (hypothesis builds the machine with no arguments)
    check_representation = True
    """Check that ``a:`` buckets are the aggregates of the events hash (the scripts' own books;
    a mutant with other books turns it off and is judged on the semantic invariants alone)."""
    drops = True
    """Whether events can be dropped (confirmed): whether some events are bad (Polar answers 422
    for them). Outages (refused connections, 503) only make delivery wait."""
    quiesce_at_teardown = True
    """Whether every example ends with the quiescence check."""

    def __init__(self) -> None:
        super().__init__()
        self.client = self.world.client
        self.client.flushall()
        self.world.writes += 1
        self._fetched: tuple[int, Hashes] | None = None
        self._acked: dict[str, dict[bytes, int]] = {}
        self._checked_bound: tuple[int, int] | None = None
        pipe = self.client.pipeline(transaction=False)
        for stream in keys.all_outboxes():
            pipe.xgroup_create(stream, oc.GROUP, id="0", mkstream=True)
        pipe.execute()
        self.world.messages()  # forget what an earlier (failed) example published
        self.polar = Polar(T0, REDUCERS, CUSTOMERS)
        self.mono_offset = 0.0
        self.tracked: dict[str, Event] = {}
        self.dropped: set[str] = set()
        self.lazy = False
        """Whether this Polar always syncs as late as its promise allows."""
        self.retracked: set[str] = set()
        """Events track() was called again for: one a snapshot already counted is pending again
        (a duplicate Polar ignores), counted twice until the next snapshot asks about it."""
        self.held: list[oc.SettleScript] = []
        self.holds: dict[str, tuple[str, Reducer, oc.admission.Hold]] = {}
        """The reservations the model holds open: hold id -> (customer, reducer, hold)."""
        self.serials = itertools.count(1)
        link = oc.Link(
            oc.Target.of("http://polar.test"),
            "polar_oat_model",
            random.Random(0),
            oc.LinkSettings(ping_interval=1e12, dead_after=1e12, connect_timeout=1e12),
        )
        self.a = Instance("A", self, link)
        self.b = Instance("B", self, None)
        self.delivery = oc.Delivery(
            oc.DeliverySettings(
                batch_size=3,
                linger=0.0,
                max_attempts=MAX_ATTEMPTS,
                backoff_base=0.01,
                claim_interval=1e12,
                claim_idle=1e9,
                read_block=0.0,
            ),
            random.Random(0),
            now=0.0,
        )
        self.delivery.handle(oc.Flushing(True))
        self.delivery_clock = 0.0
        self.waiting: oc.DeliveryEffect | None = None
        self.b.handle(oc.ConfigurationReceived(CONFIGURATION, from_cache=True))
        self.tick()
        assert self.a.session.connected, "the WebSocket did not open"
        assert self.a.session.configuration is not None
        for customer in CUSTOMERS:
            for reducer in REDUCERS:
                self.a.read(reducer.meter_id, customer)
                self.b.read(reducer.meter_id, customer)

    # -- plumbing -----------------------------------------------------------------------------

    @property
    def mono(self) -> float:
        return (self.polar.now - T0) / 1e6 + self.mono_offset

    def tick(self) -> None:
        self.a.handle(oc.Tick(self.mono, self.polar.now))
        self.b.handle(oc.Tick(self.mono, self.polar.now))

    def script(self, name: str, keys_: tuple[str, ...], args: tuple[str, ...]) -> Any:
        """Run a script; what it publishes waits in each instance's queue (the rules deliver)."""
        reply, published = self.world.run(name, keys_, args)
        if published is not None:
            self.a.queue.append(published)
            self.b.queue.append(published)
        return reply

    def answer(self, message: Any) -> list[Any]:
        """Polar's answers to one client message."""
        kind, payload = message.get("type"), message.get("payload") or {}
        if kind == "configuration":
            return [{"type": "configuration", "payload": CONFIGURATION}]
        if kind == "snapshot":
            customer = payload["external_customer_id"]
            snapshot = self.polar.snapshot(customer, payload["request_id"])
            return [{"type": "snapshot", "payload": snapshot}]
        if kind == "counted":
            ids = self.polar.counted(payload["snapshot_id"], payload["event_ids"])
            if ids is None:
                error = {"request_id": payload["request_id"], "code": "snapshot_expired"}
                return [{"type": "error", "payload": {**error, "message": "expired"}}]
            reply = {"request_id": payload["request_id"], "snapshot_id": payload["snapshot_id"]}
            return [{"type": "counted", "payload": {**reply, "event_ids": ids}}]
        return []

    # -- delivery, driven as the drivers drive it ---------------------------------------------

    def next_action(self) -> oc.DeliveryEffect:
        action, self.waiting = self.waiting, None
        if action is None:
            self.delivery_clock += 1000.0  # past any backoff: the rules decide what happens
            self.delivery.handle(oc.Tick(self.delivery_clock, self.polar.now))
            (action,) = self.delivery.effects()
        return action

    def report(self, outcome: oc.DeliveryAnswer) -> None:
        self.delivery.handle(oc.Tick(self.delivery_clock, self.polar.now))
        self.delivery.handle(outcome)

    def settle(self, action: oc.SettleScript) -> None:
        # A confirm may name an event Polar stored: a retried track() of an event a snapshot
        # already counted queues it again, and that delivery can fail for good. Whether that
        # matters is the invariants' business (the counted copy is in Polar's totals).
        reply = self.script(action.script, action.keys, action.args)
        self.a.handle(oc.ScriptReplied(reply))

    def pump(self, hold: bool, stop_at_post: bool) -> oc.PostBatch | None:
        """Run delivery actions: settlements (held when ``hold``) and reports always; reads
        when ``stop_at_post``, until a batch is ready to post. Returns that batch."""
        while True:
            action = self.next_action()
            if isinstance(action, oc.SettleScript):
                if hold:
                    self.held.append(action)
                else:
                    self.settle(action)
                self.report(oc.Settled())
            elif isinstance(action, oc.ReportDropped):
                self.dropped.update(e["external_id"] for e in action.events)
                self.report(oc.Reported())
            elif not stop_at_post:
                self.waiting = action
                return None
            elif isinstance(action, oc.PostBatch):
                return action
            elif isinstance(action, oc.ReadOutbox):
                reply: Any = self.client.xreadgroup(
                    oc.GROUP, CONSUMER, dict.fromkeys(keys.all_outboxes(), ">"), count=action.count
                )
                entries = [
                    (stream.decode(), entry_id.decode(), fields)
                    for stream, listing in reply or []
                    for entry_id, fields in listing
                ]
                self.report(oc.OutboxRead(entries))
                if not entries and self.delivery.idle:
                    return None
            elif isinstance(action, oc.ClaimStale):
                self.report(oc.OutboxRead([]))  # one consumer: nothing to claim
            elif isinstance(action, oc.RefreshClaim | oc.Sleep):
                self.report(oc.Done())
            else:  # pragma: no cover
                raise AssertionError(f"unknown delivery action {action!r}")

    def post(self, batch: oc.PostBatch, outcome: str) -> oc.DeliveryAnswer:
        """What Polar makes of one attempt: store (or not), and what the SDK hears."""
        items = json.loads(batch.body)["events"]
        events = [self.tracked[item["external_id"]] for item in items]
        bad = [i for i, event in enumerate(events) if event.bad]
        if outcome in ("accept", "accept_no_locs") and bad:
            if outcome == "accept_no_locs":
                return oc.BatchAnswered(422, b'{"detail": "invalid request"}')
            detail = [
                {"loc": ["body", "events", i, "customer_id"], "msg": "x", "type": "value_error"}
                for i in bad
            ]
            return oc.BatchAnswered(422, json.dumps({"detail": detail}).encode())
        if outcome in ("accept", "accept_no_locs", "lost", "failed"):
            if not bad:
                for event in events:
                    self.polar.store(event)
            if outcome == "lost":
                return oc.BatchFailed("read timeout", maybe_sent=True)
            if outcome == "failed":
                return oc.BatchAnswered(500, b'{"detail": "internal error"}')
            return oc.BatchAnswered(200, b"{}")
        if outcome == "unsent":
            return oc.BatchFailed("write timeout", maybe_sent=True)
        if outcome == "refused":
            return oc.BatchFailed("connection refused", maybe_sent=False)
        if outcome == "failed_unstored":
            return oc.BatchAnswered(500, b'{"detail": "internal error"}')
        return oc.BatchAnswered(503)

    def deliver_everything(self) -> None:
        for _ in range(1000):
            batch = self.pump(hold=False, stop_at_post=True)
            if batch is None:
                return
            self.report(self.post(batch, "accept"))
        raise AssertionError("delivery never ended")

    def push(self, snapshot: Mapping[str, Any]) -> None:
        assert self.a.socket is not None
        message = {"type": "snapshot", "payload": {**snapshot, "request_id": None}}
        self.a.session.handle(oc.BytesReceived(self.mono, self.a.socket.send(message)))
        self.a.drive()

    # -- rules: the merchant ------------------------------------------------------------------

    @initialize(lazy=st.booleans())
    def polar_character(self, lazy: bool) -> None:
        """This example's Polar syncs on time or late as each step says, or (``lazy``) always
        as late as it may: then an event stored a while after its bucket closed can sit in a
        bucket older than an hour, cold, and still uncounted, as at the pending limit's edge."""
        self.lazy = lazy

    @rule(
        customer=st.sampled_from([CUSTOMERS[0], *CUSTOMERS]),
        tokens=st.none() | st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.5, 7.0, 10.0]),
        lag=st.sampled_from([0, 0, 0, 3 * MINUTE_US, 7 * MINUTE_US, 40 * MINUTE_US]),
        bad=st.sampled_from([*[False] * 7, True]),
        again=st.sampled_from([None, None, None, None, 0, 1]),
    )
    def track(
        self, customer: str, tokens: float | None, lag: int, bad: bool, again: int | None
    ) -> None:
        """Track a new event; or (``again``) call track() again for one already tracked, with
        the same id (a retry after an error): the last one, or the one before."""
        if again is not None and self.tracked:
            events = list(self.tracked.values())
            event = events[max(0, len(events) - 1 - again)]
            self.retracked.add(event.event_id)
        else:
            bad = bad and self.drops
            moment = self.polar.now - lag
            event = Event(f"e{len(self.tracked) + 1}", customer, moment, tokens, bad)
            self.tracked[event.event_id] = event
        metadata = {} if event.tokens is None else {"tokens": event.tokens}
        run = self.a.session.track(
            name="api_call",
            external_customer_id=event.customer,
            metadata=metadata,
            timestamp_us=event.timestamp_us,
            now_us=self.polar.now,
            event_id=event.event_id,
        )
        self.a.handle(oc.ScriptReplied(self.script(run.script, run.keys, run.args)))

    # -- rules: admission ---------------------------------------------------------------------

    def available(self, customer: str, reducer: Reducer) -> tuple[float, float]:
        """(balance, held) as the model sees them in Redis: the meter's credits less the
        consumption of the state hash, and the units of the holds it opened that are live."""
        _, state, _ = self.fetch()[customer, reducer]
        credited = float(state.get(f"c:{reducer.meter_id}".encode(), b"0"))
        consumed = local_aggregate(state).quantity(reducer.func)
        held = sum(
            hold.units
            for c, r, hold in self.holds.values()
            if (c, r) == (customer, reducer) and hold.expires_us > self.polar.now
        )
        return credited - consumed, held

    @rule(
        customer=st.sampled_from(CUSTOMERS),
        reducer_id=st.sampled_from([r.id for r in ADMITTING]),  # plain values: programs replay
        units=st.sampled_from(HOLD_UNITS),
        ttl=st.sampled_from(HOLD_TTL_MINUTES),
        on_a=st.booleans(),
    )
    def reserve(self, customer: str, reducer_id: str, units: float, ttl: int, on_a: bool) -> None:
        """An instance reserves units; admitted exactly when the model's available covers them."""
        reducer = next(r for r in ADMITTING if r.id == reducer_id)
        instance = self.a if on_a else self.b
        balance, held = self.available(customer, reducer)
        run, hold = oc.admission.reserve(
            instance.session,
            reducer.meter_id,
            units,
            customer,
            None,
            ttl=ttl * 60,
            now_us=self.polar.now,
            hold_id=f"h{next(self.serials)}",
        )
        reply = self.script(run.script, run.keys, run.args)
        refusal = oc.admission.refusal_of(reply)
        where = f"{customer} {reducer.id}: {units} asked, balance {balance}, held {held}"
        if refusal is not None:
            assert units > balance - held, f"refused though covered: {where}"
            assert (refusal.balance, refusal.held) == (balance, held), f"{refusal}: {where}"
            return
        assert units <= balance - held, f"admitted beyond the available balance: {where}"
        self.holds[hold.field] = (customer, reducer, hold)
        instance.handle(oc.ScriptReplied(reply))

    @precondition(lambda self: self.holds)
    @rule(on_a=st.booleans())
    def reserve_as_a_hold_expires(self, on_a: bool) -> None:
        """Time moves to the soonest hold's expiry, when that is the next edge: at that very
        microsecond its units are free again, and a reservation of exactly what is then
        available must be admitted (an off-by-one in the scripts' expiry refuses it)."""
        customer, reducer, hold = min(self.holds.values(), key=lambda h: h[2].expires_us)
        if hold.expires_us != self.next_edge():
            return
        self.advance("edge", "on_time")
        balance, held = self.available(customer, reducer)
        if balance - held > 0:
            self.reserve(customer, reducer.id, balance - held, HOLD_TTL_MINUTES[0], on_a)

    @precondition(lambda self: self.holds)
    @rule(index=st.integers(0, 100), tokens=st.none() | st.sampled_from([0.0, 2.0, 40.0]))
    def commit(self, index: int, tokens: float | None) -> None:
        """A reservation's commit: the actual event recorded, its hold released, in one script
        (after the hold expired too)."""
        name = sorted(self.holds)[index % len(self.holds)]
        customer, _, hold = self.holds.pop(name)
        event = Event(f"e{len(self.tracked) + 1}", customer, self.polar.now, tokens, False)
        self.tracked[event.event_id] = event
        run = self.a.session.track(
            name="api_call",
            external_customer_id=customer,
            metadata={} if tokens is None else {"tokens": tokens},
            timestamp_us=event.timestamp_us,
            now_us=self.polar.now,
            event_id=event.event_id,
        )
        admit, _ = oc.admission.admit(
            self.a.session, run, hold.customer, now_us=self.polar.now, hold=hold
        )
        self.a.handle(oc.ScriptReplied(self.script(admit.script, admit.keys, admit.args)))

    @precondition(lambda self: self.holds)
    @rule(index=st.integers(0, 100), on_a=st.booleans())
    def release(self, index: int, on_a: bool) -> None:
        instance = self.a if on_a else self.b
        name = sorted(self.holds)[index % len(self.holds)]
        _, _, hold = self.holds.pop(name)
        run = oc.admission.release(instance.session, hold, self.polar.now)
        instance.handle(oc.ScriptReplied(self.script(run.script, run.keys, run.args)))

    # -- rules: delivery ----------------------------------------------------------------------

    @rule(
        outcome=st.sampled_from(OUTCOMES),
        hold=st.booleans(),
        attempts=st.sampled_from(ATTEMPTS),
    )
    def deliver(self, outcome: str, hold: bool, attempts: int = 1) -> None:
        """Delivery attempts that all meet ``outcome`` (the same batch again while it fails);
        each settlement runs now, or is held (a slow instance)."""
        for _ in range(attempts):
            batch = self.pump(hold, stop_at_post=True)
            if batch is None:
                return
            self.report(self.post(batch, outcome))
            self.pump(hold, stop_at_post=False)

    @precondition(lambda self: self.held)
    @rule(index=st.integers(0, 100))
    def run_held_settlement(self, index: int) -> None:
        self.settle(self.held.pop(index % len(self.held)))

    # -- rules: Polar and time ----------------------------------------------------------------

    @rule(
        minutes=st.sampled_from(MINUTES),
        sync=st.sampled_from(["on_time", "late", "late", "one_more"]),
    )
    def advance(self, minutes: int | str, sync: str) -> None:
        """Time passes (some minutes, or to the next edge). Polar syncs the closed buckets on
        time, or late (none, or one more bucket); whatever happens it counts every event it
        stored more than 50 minutes ago, and no sooner than that when late."""
        if minutes == "edge":
            self.polar.now = self.next_edge()
        else:
            assert isinstance(minutes, int)
            self.polar.now += minutes * MINUTE_US
        if self.lazy:
            pass
        elif sync == "on_time":
            self.polar.sync(oc.floor_bucket(self.polar.now))
        elif sync == "one_more":
            self.polar.sync(self.polar.synced_until + oc.BUCKET_US)
        self.polar.sync_overdue()
        self.tick()

    def next_edge(self) -> int:
        """The next moment a promise bites exactly: Polar's last moment to leave a stored event
        uncounted, a kept snapshot's last moment before ``snapshot_expired``, an acknowledged
        pending event's last moment before the one-hour limit. A minute on when there is none."""
        moments = self.polar.deadlines()
        moments += [hold.expires_us for _, _, hold in self.holds.values()]
        for _, _, events in self.fetch().values():
            for value in events.values():
                parts = value.split(b" ")
                if len(parts) == 2:
                    moments.append(int(parts[1]) + PENDING_LIMIT_US)
        now = self.polar.now
        return min((m for m in moments if m > now), default=now + MINUTE_US)

    @rule()
    def race_the_pending_limit(self) -> None:
        """The one-hour limit's edge: take the pending event Polar has not counted that was
        acknowledged last (at ``t``); Polar computes the customer's snapshot at ``t`` + 50
        minutes, the last moment it may leave an event stored at ``t`` uncounted (syncing no
        more than it must), and the snapshot is applied at ``t`` + 1 hour, ten minutes later,
        the oldest a snapshot may be. The event must still be pending when its hour is exactly
        over."""
        acked: list[tuple[int, str]] = []
        for (customer, _), (_, _, events) in self.fetch().items():
            for field, value in events.items():
                parts = value.split(b" ")
                bucket, _, event_id = field.decode().partition(":")
                stored = self.polar.stored.get(event_id)
                if len(parts) != 2 or stored is None or stored.counted_version is not None:
                    continue
                moment = int(parts[1])
                if moment + COUNT_WITHIN_US < self.polar.now:
                    continue  # too late for this race: time only moves forward
                if int(bucket) < oc.floor_bucket(moment + COUNT_WITHIN_US) - HOUR_US:
                    acked.append((moment, customer))  # its bucket is cold by then (one hour)
        if not acked:
            return
        moment, customer = max(acked)
        self.polar.now = moment + COUNT_WITHIN_US
        self.polar.sync_overdue()
        self.tick()
        snapshot = self.polar.snapshot(customer, None)
        self.polar.now = moment + PENDING_LIMIT_US
        self.polar.sync_overdue()
        self.tick()
        self.push(snapshot)

    snapshots = Bundle("snapshots")

    @rule(
        target=snapshots,
        customer=st.sampled_from([CUSTOMERS[0], *CUSTOMERS]),
        grant=st.sampled_from([0.0, 0.0, 5.0, -30.0]),
    )
    def compute_snapshot(self, customer: str, grant: float) -> Mapping[str, Any]:
        """Polar computes a snapshot now (after a credit grant, maybe); the test pushes it
        later, or never."""
        credits = self.polar.credits[customer]
        credits["m-count"] = max(0.0, credits["m-count"] + grant)
        return self.polar.snapshot(customer, None)

    @rule(snapshot=snapshots)
    def push_snapshot(self, snapshot: Mapping[str, Any]) -> None:
        """Push a snapshot Polar computed earlier: the newest or an older one, for the first
        time or again."""
        self.push(snapshot)

    # -- rules: Redis pub/sub and the WebSocket -----------------------------------------------

    @rule(
        to_a=st.booleans(),
        how=st.sampled_from(["all", "next", "skip_one", "skip_one", "twice", "lost", "reconnect"]),
    )
    def connections(self, to_a: bool, how: str) -> None:
        """Hand published messages over to an instance: all of them in order; the next one;
        a later one first (out of order: the last one that changes an identity the next one
        changes too, so the copy sees a revision gap); the next one, kept to come again (a
        duplicate); or none: the subscription broke, they are lost, and it comes back (copies
        reload). Or the WebSocket drops and reconnects (the link asks for every customer's
        snapshot again)."""
        instance = self.a if to_a else self.b
        if how == "reconnect":
            self.a.handle(oc.ConnectionFailed(self.mono, "connection reset"))
            self.a.socket = None
            self.mono_offset += 120.0
            self.tick()
            assert self.a.session.connected
        elif how == "lost":
            instance.handle(oc.SubscriberLost())
            instance.queue.clear()
            instance.handle(oc.SubscriberRestarted())
        elif how == "all":
            while instance.queue:
                instance.deliver(0, keep=False)
        elif instance.queue:
            index = instance.overtaking() if how == "skip_one" else 0
            instance.deliver(index, keep=how == "twice")

    def quiesce(self) -> None:
        """Everything settles; local and Polar must then agree exactly."""
        for action in self.held:
            self.settle(action)
        self.held.clear()
        self.pump(hold=False, stop_at_post=False)
        # On the way, the two races every example can still end in: Polar syncs and computes a
        # snapshot, the last events are delivered (and acknowledged) after it, then it is
        # applied (they must stay pending); and the snapshot's last cold bucket
        # holds events it counts (they must leave pending, not count twice).
        self.polar.now = oc.floor_bucket(self.polar.now) + oc.BUCKET_US + 17_000_000
        self.tick()  # the bucket the last events went into is now the last cold one
        self.polar.sync(oc.floor_bucket(self.polar.now))
        late = [self.polar.snapshot(customer, None) for customer in CUSTOMERS]
        self.deliver_everything()
        self.redis_consistent_never_below_polar_and_copies_follow()
        for snapshot in late:
            self.push(snapshot)
        self.redis_consistent_never_below_polar_and_copies_follow()
        self.polar.now += 2 * 60 * MINUTE_US  # past every bucket and the pending limit
        self.polar.sync(oc.floor_bucket(self.polar.now))
        self.tick()
        for customer in CUSTOMERS:
            self.push(self.polar.snapshot(customer, None))
        for instance in (self.a, self.b):
            while instance.queue:
                instance.deliver(0, False)
        for (customer, reducer), (_, state, events) in self.fetch().items():
            polar = self.polar.eventual(customer, reducer)
            local = local_aggregate(state)
            assert wire(local) == wire(polar), f"{customer} {reducer.id} did not converge"
            assert not events and state[b"n"] == b"0" and state[b"u"] == b"0", state
            want = polar.quantity(reducer.func)
            credited = self.polar.credits[customer][reducer.meter_id]
            for instance in (self.a, self.b):
                balance = instance.read(reducer.meter_id, customer)
                assert balance.consumed == want, (instance.name, reducer.func, balance)
                assert balance.credited == credited, (instance.name, balance)
                assert balance.balance == credited - want
        pipe = self.client.pipeline(transaction=False)
        for stream in keys.all_outboxes():
            pipe.xlen(stream)
        assert not any(pipe.execute()), "the outbox still holds events"
        lost = set(self.tracked) - set(self.polar.stored) - self.dropped
        assert not lost, f"neither delivered nor reported dropped: {sorted(lost)}"

    def teardown(self) -> None:
        if self.quiesce_at_teardown and sys.exc_info()[0] is None:  # not after a failure
            self.quiesce()

    # -- invariants ---------------------------------------------------------------------------

    def fetch(self) -> Hashes:
        """Every identity's state hash and events (its bucket hashes together), and its
        acknowledged set (kept in ``self._acked``), in three round trips (none when no script
        changed anything since the last time). The bucket hashes are found by SCAN, not through
        the state hash's index, so an event in a bucket the index lacks still counts here and
        fails the representation check."""
        if self._fetched is not None and self._fetched[0] == self.world.writes:
            return self._fetched[1]
        pipe = self.client.pipeline(transaction=False)
        for _, _, st_key in IDENTITIES:
            pipe.hgetall(st_key)
            pipe.zrange(keys.acked_key(st_key), 0, -1, withscores=True)
        replies = pipe.execute()
        states, acked = replies[0::2], replies[1::2]
        found: dict[str, list[str]] = {}
        for raw in self.client.scan_iter(match=f"{keys.PREFIX}*:ev:*", count=1000):
            key = raw.decode()
            found.setdefault(key.rpartition(":ev:")[0], []).append(key)
        wanted = [sorted(found.get(st_key, [])) for _, _, st_key in IDENTITIES]
        for names in wanted:
            for name in names:
                pipe.hgetall(name)
        events_replies = iter(pipe.execute())
        hashes = {}
        for (customer, reducer, st_key), state, names in zip(
            IDENTITIES, states, wanted, strict=True
        ):
            events: dict[bytes, bytes] = {}
            for _ in names:
                events.update(next(events_replies))
            hashes[customer, reducer] = (st_key, state, events)
        self._acked = {
            st_key: {member: int(score) for member, score in pairs}
            for (_, _, st_key), pairs in zip(IDENTITIES, acked, strict=True)
        }
        self._fetched = (self.world.writes, hashes)
        return hashes

    @invariant()
    def redis_consistent_never_below_polar_and_copies_follow(self) -> None:
        hashes = self.fetch()
        bound = (self.world.writes, len(self.polar.stored))
        if bound != self._checked_bound:
            self.never_below_polar(hashes)
            self._checked_bound = bound
        for instance in (self.a, self.b):
            if instance.queue:
                continue  # not caught up: its copies may lag, by design
            if instance.checked == (self.world.writes, instance.inputs):
                continue  # nothing changed since the last look
            self.copies_follow(instance, hashes)
            instance.checked = (self.world.writes, instance.inputs)
        self.holds_match(hashes)

    def holds_match(self, hashes: Hashes) -> None:
        """The live holds in Redis are exactly those the model holds open."""
        for (customer, reducer), (key, state, _) in hashes.items():
            live = {
                name.decode(): value.decode()
                for name, value in state.items()
                if name.startswith(b"h:") and int(value.split(b" ")[1]) > self.polar.now
            }
            want = {
                name: f"{format_number(hold.units)} {hold.expires_us}"
                for name, (c, r, hold) in self.holds.items()
                if (c, r) == (customer, reducer) and hold.expires_us > self.polar.now
            }
            assert live == want, f"{key}: live holds {live}, the model holds {want}"

    def never_below_polar(self, hashes: Hashes) -> None:
        for (customer, reducer), (st_key, state, events) in hashes.items():
            if self.check_representation:
                check_consistent(st_key, state, events)
                check_acked(st_key, events, self._acked[st_key])
            self.never_counted_twice(st_key, state, events)
            local = local_aggregate(state)
            polar = self.polar.eventual(customer, reducer)
            where = f"{customer} {reducer.id}: local {wire(local)}, Polar will count {wire(polar)}"
            assert local.count >= polar.count, where
            assert local.sum >= polar.sum, where
            if polar.max is not None:
                assert local.max is not None and local.max >= polar.max, where

    def never_counted_twice(
        self, key: str, state: Mapping[bytes, bytes], events: Mapping[bytes, bytes]
    ) -> None:
        """No event is both in the applied snapshot's totals and pending (docs/invariant.md: it
        leaves pending exactly when the totals include it), but one tracked again."""
        if b"sid" not in state:
            return
        kept = self.polar.kept[state[b"sid"].decode()]
        for field in events:
            bucket, _, event_id = field.decode().partition(":")
            if int(bucket) < kept.cold_until and event_id not in self.retracked:
                assert not self.polar.counts(kept, event_id), (
                    f"{key}: {event_id} is pending and in the totals of "
                    f"{kept.payload['snapshot_id']} (as_of {kept.as_of}, "
                    f"cold_until {kept.cold_until}): counted twice"
                )

    def copies_follow(self, instance: Instance, hashes: Hashes) -> None:
        mirrors = {mirror.key: mirror for mirror in instance.session.followed}
        for (customer, reducer), (key, state, _) in hashes.items():
            cached = instance.session.cached_balance(reducer.meter_id, customer, None)
            balance = instance.read(reducer.meter_id, customer)
            where = f"{instance.name} {customer} {reducer.id}"
            # Field for field (rev aside: a delta carries it as the change's revision only), for
            # a copy that answers from memory: one its restarted shard left behind does not (its
            # read goes to Redis and reloads it).
            mirror = mirrors[key]
            if mirror.loaded and mirror.following:
                fields = {k.decode(): v.decode() for k, v in state.items() if k != b"rev"}
                copy = {k: v for k, v in mirror.fields.items() if k != "rev"}
                assert (mirror.rev, copy) == (int(state[b"rev"]), fields), f"{where}: copy differs"
            local = local_aggregate(state)
            assert balance.revision == int(state[b"rev"]), where
            assert balance.consumed == local.quantity(reducer.func), where
            assert balance.pending == int(state[b"n"]), where
            assert balance.undelivered == int(state[b"u"]), where
            credited = float(state.get(f"c:{reducer.meter_id}".encode(), b"0"))
            assert balance.credited == credited, where
            wall = instance.session.wall_us
            held = sum(
                float(value.split(b" ")[0])
                for name, value in state.items()
                if name.startswith(b"h:") and int(value.split(b" ")[1]) > wall
            )
            assert balance.held == held, f"{where}: reads {balance.held} held, Redis {held}"
            if cached is not None:
                assert cached == balance, f"{where}: the warm path is stale"


def check_consistent(key: str, state: Mapping[bytes, bytes], events: Mapping[bytes, bytes]) -> None:
    """``a:`` buckets are the aggregates of the events hash; ``n`` and ``u`` count it."""
    buckets: dict[str, oc.Aggregate] = {}
    undelivered = 0
    for field, value in events.items():
        bucket = field.decode().split(":", 1)[0]
        parts = value.decode().split(" ")
        buckets[bucket] = buckets.get(bucket, oc.Aggregate()).add(float(parts[0]))
        undelivered += len(parts) == 1
    stored = {
        name.decode()[2:]: oc.Aggregate.decode(text.decode())
        for name, text in state.items()
        if name.startswith(b"a:")
    }
    assert stored == buckets, f"{key}: a: fields {stored} but events give {buckets}"
    assert int(state.get(b"n", b"0")) == len(events), f"{key}: n"
    assert int(state.get(b"u", b"0")) == undelivered, f"{key}: u"


def check_acked(key: str, events: Mapping[bytes, bytes], acked: Mapping[bytes, int]) -> None:
    """The acknowledged set holds exactly the acknowledged pending events, scored by when."""
    expected = {}
    for field, value in events.items():
        parts = value.split(b" ")
        if len(parts) == 2:
            expected[field] = int(parts[1])
    assert dict(acked) == expected, f"{key}: acknowledged set {acked} but events give {expected}"


@contextlib.contextmanager
def machine_for(
    server: RedisServer, scripts: Mapping[str, str], **attributes: object
) -> Iterator[type[OutpostModel]]:
    """The machine class bound to a Redis and a set of scripts (name → composed text)."""
    world = World(server, scripts)
    try:
        yield type("OutpostModel", (OutpostModel,), {"world": world, **attributes})
    finally:
        world.close()


@pytest.fixture
def model(redis_server: RedisServer) -> Iterator[type[OutpostModel]]:
    with machine_for(redis_server, oc.SCRIPT_TEXT) as machine:
        yield machine


def run_model(
    machine: type[OutpostModel],
    *,
    examples: int = EXAMPLES,
    steps: int = STEPS,
    seed_: int | None = None,
    shrink: bool = True,
) -> None:
    """Run the machine as the suite does: ``examples`` programs of up to ``steps`` steps, from
    ``seed_`` when given (then without the example database, so the seed alone decides)."""
    chosen = settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    if not shrink:
        chosen = settings(chosen, phases=[Phase.generate])
    if seed_ is not None:
        chosen = settings(chosen, database=None)
    test = get_state_machine_test(machine, settings=chosen)
    if seed_ is not None:
        test = seed(seed_)(test)
    test()


@pytest.mark.slow
@pytest.mark.timeout(900)  # a hang guard, not a limit: 600 examples take minutes on a busy machine
def test_outpost_against_a_model_of_polar(model: type[OutpostModel]) -> None:
    run_model(model, seed_=None if SEED is None else int(SEED))


def test_link_is_open_in_the_model(model: type[OutpostModel]) -> None:
    """The machine's setup: instance A's WebSocket opens and every copy is readable."""
    machine = model()
    assert machine.a.session.remote is not None
    assert machine.a.session.remote.link.state is LinkState.OPEN
    machine.teardown()

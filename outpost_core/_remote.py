"""Polar's side of the session: the WebSocket link, configuration, and snapshot flows."""

from __future__ import annotations

import collections
import itertools
from collections.abc import Mapping
from typing import Any, Protocol

from . import _keys
from ._aggregate import format_number
from ._backoff import backoff
from ._deadlines import Deadlines
from ._effects import CloseConnection, Effect, ListPending, OpenConnection, RunScript, SendBytes
from ._following import Pacer
from ._keys import Customer
from ._link import Link, LinkState, _Unreadable
from ._observations import LinkChanged, Observation, SnapshotApplied
from ._peer import decimal_int
from ._random import Random
from ._snapshots import (
    MAX_IDS_PER_QUESTION,
    CustomerFlow,
    MalformedSnapshot,
    Snapshot,
    Step,
    customer_in,
    parse_snapshot,
)

REQUEST_TIMEOUT = 5.0
"""Seconds before a snapshot request with no answer is sent again."""
STEP_TIMEOUT = 10.0
"""Seconds a snapshot flow may wait in one step (listing, asking, applying) before it gives the
snapshot up and asks for a fresh one, whatever lost the answer (Polar, Redis, or a driver)."""
RETRY_BASE = 0.25
RETRY_CAP = 10.0
"""The backoff of a flow that failed (Redis could not list or apply): from RETRY_BASE seconds,
doubling up to RETRY_CAP, with jitter."""


class SessionHooks(Protocol):
    """What Polar's side needs of the session that owns it: a place for its effects, rejections
    and observations, and the session's reads of its own state and settings."""

    def emit(self, effect: Effect) -> None: ...
    def configure(self, payload: object) -> None: ...
    def known_rev(self, state_key: str) -> int: ...
    def reject(self, kind: str, detail: str) -> None: ...
    def observe(self, observation: Observation) -> None: ...
    def consumed(self, customer: Customer, reducer_id: str) -> dict[str, float]: ...
    def aliases_changed(self, customer: Customer, aliases: tuple[Customer, ...]) -> None: ...
    def recently_read(self) -> list[Customer]: ...
    def unsettled(self, customer: Customer) -> tuple[int, int]: ...
    @property
    def refresh_after(self) -> float | None: ...
    @property
    def reload_rate(self) -> float: ...
    @property
    def pending_limit_us(self) -> int: ...
    @property
    def channel_namespace(self) -> str: ...
    @property
    def shards(self) -> int: ...
    def shard_of(self, customer: Customer) -> int: ...


class Remote:
    """Polar's side of a session: the link, and one snapshot flow per customer followed.

    Every wait of a flow has a deadline checked on :meth:`tick`: an unanswered snapshot request
    is sent again after ``REQUEST_TIMEOUT``, a step that waits longer than ``STEP_TIMEOUT`` gives
    its snapshot up and asks again, and a flow whose Redis work failed asks again after a
    backoff. So no lost answer can leave a customer without snapshots until the link reconnects.
    """

    def __init__(self, session: SessionHooks, link: Link, rng: Random) -> None:
        self._session = session
        self.link = link
        self._rng = rng
        self.flows: dict[Customer, CustomerFlow] = {}
        self._tags: dict[int, CustomerFlow] = {}
        self._questions: dict[str, CustomerFlow] = {}
        self.aliases: dict[Customer, tuple[Customer, ...]] = {}
        """Per customer, its other reference forms from its latest snapshot (kept across
        reconnects: they name the same customer)."""
        self._ids = itertools.count(1)
        self._deadlines: Deadlines[Customer] = Deadlines()
        """Each flow's next deadline (see :func:`_deadline`): a tick costs what is due."""
        self._asks: collections.deque[Customer] = collections.deque()
        """Customers read recently to ask again after a reconnect, at the pace below."""
        self._pace = Pacer(session.reload_rate)
        self.wall_us = 0
        self.now = 0.0
        self.snapshots_applied = 0
        self.snapshots_received = 0

    # -- link plumbing ------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        self.now = now
        before = self.link.state
        self.link.tick(now)
        self._after_link(before)
        if self.link.wants_connection(now):
            t = self.link.target
            timeout = self.link.settings.connect_timeout
            self._session.emit(OpenConnection(host=t.host, port=t.port, tls=t.tls, timeout=timeout))
        for customer in self._deadlines.pop_due(now):
            flow = self.flows[customer]  # (letting a customer go cancels its deadline)
            self._due(flow, now)
            self._schedule(flow)
        if self._asks:
            self._ask_paced()
        self._flush()

    def _due(self, flow: CustomerFlow, now: float) -> None:
        due = _deadline(flow)
        if due is None or due > now:  # pragma: no cover - every change of a flow reschedules it
            return
        if flow.step is not Step.IDLE:
            step = flow.step.value
            self._session.reject("stuck_flow", f"{flow.customer}: no answer while {step}")
            self._restart(flow)
        elif flow.retry_at is not None:
            flow.retry_at = None
            self._request(flow)
        elif not flow.applied and flow.request_id is not None:
            self._request(flow)  # unanswered
        else:
            self._refresh(flow)

    def _refresh(self, flow: CustomerFlow) -> None:
        """No snapshot for a while: ask for one if Polar has delivered events this instance
        still counts as pending; wait again while some are still on their way to Polar."""
        flow.refresh_at = None
        if flow.dormant:  # not asked since a reconnect: its next read asks
            return
        delivered, undelivered = self._session.unsettled(flow.customer)
        if delivered:
            self._request(flow)
        if delivered or undelivered:
            self._arm_refresh(flow)

    def _arm_refresh(self, flow: CustomerFlow) -> None:
        after = self._session.refresh_after
        flow.refresh_at = None if after is None else self.now + after

    def _schedule(self, flow: CustomerFlow) -> None:
        self._deadlines.set(flow.customer, _deadline(flow))

    def _await_answer(self, flow: CustomerFlow, step: Step) -> int:
        """Move ``flow`` on to ``step``, which waits (its deadline counted from now) for the
        answer to an effect: returns the tag that effect carries."""
        tag = next(self._ids)
        self._tags[tag] = flow
        flow.step, flow.since, flow.tag = step, self.now, tag
        self._schedule(flow)
        return tag

    def next_deadline(self) -> float | None:
        """The earliest time :meth:`tick` has work: the link's, a flow's, or the next paced
        request's."""
        deadlines = [
            d for d in (self.link.next_deadline(), self._deadlines.next()) if d is not None
        ]
        if self._asks:
            deadlines.append(self._pace.next_at(self.now))
        return min(deadlines, default=None)

    def close(self) -> None:
        self.link.close()
        self._flush()

    def opened(self, now: float) -> None:
        self.now = now
        self.link.opened(now)
        self._flush()

    def failed(self, now: float, reason: str) -> None:
        was_open = self.link.state is LinkState.OPEN
        self.link.failed(now, reason)
        self._abandon()
        if was_open:
            self._session.observe(LinkChanged("closed", reason, self.link.connections))

    def received(self, data: bytes, now: float) -> None:
        self.now = now
        before, connections = self.link.state, self.link.connections
        messages = self.link.receive(data, now)
        if self.link.connections > connections:  # the upgrade was accepted in these bytes
            self._on_open()
            before = LinkState.OPEN
        for message in messages:
            self._message(message)
        self._after_link(before)

    def _after_link(self, before: LinkState) -> None:
        """After the link ran: send what it queued; when it dropped its connection, have the
        driver close the socket and forget what was in flight on it."""
        self._flush()
        dropped = self.link.state is LinkState.DISCONNECTED
        if dropped and before in (LinkState.HANDSHAKING, LinkState.OPEN):
            self._session.emit(CloseConnection())
            self._abandon()
            if before is LinkState.OPEN:
                reason = self.link.last_error
                self._session.observe(LinkChanged("closed", reason, self.link.connections))

    def _flush(self) -> None:
        data = self.link.data_to_send()
        if data:
            self._session.emit(SendBytes(data))

    def _on_open(self) -> None:
        """Ask at once for the snapshots reads wait for; those of customers read within the
        session's ``recent_window`` at the reload pace, most recent first; the others when they
        are next read (until then Polar pushes nothing of them on this connection)."""
        self._session.observe(LinkChanged("open", None, self.link.connections))
        self.link.send({"type": "configuration"})
        for flow in self.flows.values():
            flow.reset()
            if flow.applied:
                flow.dormant = True
            else:
                self._request(flow)
        self._asks = collections.deque(self._session.recently_read())
        self._ask_paced()

    def _ask_paced(self) -> None:
        granted = self._pace.take(self.now, len(self._asks))
        while granted and self._asks:
            flow = self.flows.get(self._asks.popleft())
            if flow is not None and flow.dormant:
                self._wake(flow)
                granted -= 1

    def _wake(self, flow: CustomerFlow) -> None:
        flow.dormant = False
        self._request(flow)
        self._flush()

    def _abandon(self) -> None:
        for flow in list(self.flows.values()):
            flow.reset()
            if flow.pushed:
                self._let_go(flow)
            else:
                self._schedule(flow)
        self._tags.clear()
        self._questions.clear()
        self._asks.clear()

    # -- customers ----------------------------------------------------------------------------

    def follow(self, customer: Customer) -> CustomerFlow:
        flow = self.flows.get(customer)
        if flow is None:
            flow = self.flows[customer] = CustomerFlow(customer)
            self._request(flow)
            self._flush()
        elif flow.pushed:  # followed now: Polar pushes its snapshots only once asked
            flow.pushed = False
            self._request(flow)
            self._flush()
        elif flow.dormant:
            self._wake(flow)  # read: ask now, whatever the pace
        return flow

    def forget(self, customer: Customer) -> tuple[Customer, ...]:
        """The session let ``customer`` go: drop its flow (what is in flight is ignored when it
        answers), tell Polar to stop pushing its snapshots; return its aliases."""
        self._abandon_flow(self.flows.pop(customer))  # (every customer followed has a flow)
        self._deadlines.cancel(customer)
        self.link.send({"type": "forget", "payload": customer.wire()})  # dropped unless open
        self._flush()
        return self.aliases.pop(customer, ())

    def lost(self, customer: Customer) -> None:
        """The customer's state in Redis has no snapshot although this instance applied one (its
        keys expired, or Redis was wiped): ask Polar for one again."""
        flow = self.follow(customer)
        # At most one request per REQUEST_TIMEOUT: a Polar whose snapshots keep lacking one of
        # the customer's reducers must not get a request for every read.
        recent = flow.requested_at > 0 and self.now - flow.requested_at < REQUEST_TIMEOUT
        if flow.applied and flow.step is Step.IDLE and not recent:
            flow.applied = False
            self._request(flow)
            self._flush()

    def _request(self, flow: CustomerFlow) -> None:
        request_id = f"s{next(self._ids)}"
        payload = {"request_id": request_id, **flow.customer.wire()}
        if self.link.send({"type": "snapshot", "payload": payload}):
            flow.request_id = request_id
            flow.requested_at = self.now
            self._schedule(flow)

    # -- messages -----------------------------------------------------------------------------

    def _message(self, message: object) -> None:
        if isinstance(message, _Unreadable):
            self._session.reject("frame", f"text frame that is not JSON: {message.excerpt!r}")
            return
        if not isinstance(message, Mapping) or not isinstance(message.get("type"), str):
            self._session.reject("frame", "frame without a type")
            return
        kind, payload = message["type"], message.get("payload")
        if kind == "configuration":
            self._session.configure(payload)
        elif kind == "snapshot":
            self._snapshot(payload)
        elif kind == "counted":
            self._counted(payload)
        elif kind == "error":
            self._error(payload)
        else:
            self._session.reject("frame", f"unknown message type {kind!r}")

    def _snapshot(self, payload: object) -> None:
        try:
            snapshot = parse_snapshot(payload)
        except MalformedSnapshot as exc:
            self._session.reject("snapshot", str(exc))
            return
        self.snapshots_received += 1
        flow = self.flows.get(snapshot.customer)
        if flow is None:
            # Unasked-for (Polar pushes only what was asked; one may still be on its way after a
            # `forget`): apply it, never ask for more, and keep nothing once it is done.
            flow = CustomerFlow(snapshot.customer, applied=True, pushed=True)
            self.flows[snapshot.customer] = flow
        if self.aliases.get(snapshot.customer, ()) != snapshot.aliases:
            self.aliases[snapshot.customer] = snapshot.aliases
            self._session.aliases_changed(snapshot.customer, snapshot.aliases)
        if snapshot.request_id is not None and snapshot.request_id == flow.request_id:
            flow.request_id = None
        if flow.offer(snapshot):
            self._start(flow)

    def _start(self, flow: CustomerFlow) -> None:
        """List the fields of the customer's state hashes: their ``a:`` fields are the buckets
        that hold pending events (docs/redis-layout.md)."""
        assert flow.current is not None
        flow.retry_at = None
        tag = self._await_answer(flow, Step.BUCKETS)
        keys = tuple(
            _keys.state_key(flow.customer, r, self._session.shards) for r in flow.current.reducers
        )
        self._session.emit(ListPending(tag=tag, keys=keys))

    def listed(self, tag: int, fields: Mapping[str, list[Any]]) -> None:
        flow = self._tags.pop(tag, None)
        if flow is None or flow.current is None or flow.step not in (Step.BUCKETS, Step.LISTING):
            return
        if flow.step is Step.BUCKETS:
            self._list_events(flow, fields)
        else:
            self._listed_events(flow, fields)

    def _list_events(self, flow: CustomerFlow, fields: Mapping[str, list[Any]]) -> None:
        """List the events of the buckets before the snapshot's ``cold_until`` only: the hot
        buckets' events are none of its business, however many they are."""
        assert flow.current is not None
        cold_until = flow.current.cold_until
        keys: list[str] = []
        for state, names in fields.items():
            for raw in names:
                name = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
                bucket = name[2:] if name.startswith("a:") else ""
                start = decimal_int(bucket)
                if start is not None and start >= 0 and start < cold_until:
                    keys.append(_keys.bucket_key(state, bucket))
        if not keys:
            self._apply(flow)
            return
        tag = self._await_answer(flow, Step.LISTING)
        self._session.emit(ListPending(tag=tag, keys=tuple(sorted(keys))))

    def _listed_events(self, flow: CustomerFlow, fields: Mapping[str, list[Any]]) -> None:
        assert flow.current is not None
        cold_until = flow.current.cold_until
        for key, names in fields.items():
            state = key.rpartition(":ev:")[0]
            for raw in names:
                try:
                    name = raw.decode() if isinstance(raw, bytes) else str(raw)
                except UnicodeDecodeError:
                    self._session.reject("state", f"{key}: field that is not UTF-8 text: {raw!r}")
                    continue
                bucket, _, event_id = name.partition(":")
                start = decimal_int(bucket)
                if start is None or start < 0 or not event_id:
                    self._session.reject("state", f"{key}: unreadable field {name!r}")
                    continue
                if start < cold_until:
                    flow.candidates.setdefault(event_id, []).append(f"{state}\n{name}")
        if not flow.candidates:
            self._apply(flow)
            return
        flow.step, flow.since, flow.tag = Step.ASKING, self.now, None
        self._schedule(flow)
        ids = sorted(flow.candidates)
        for start in range(0, len(ids), MAX_IDS_PER_QUESTION):
            request_id = f"q{next(self._ids)}"
            chunk = ids[start : start + MAX_IDS_PER_QUESTION]
            payload = {
                "request_id": request_id,
                "snapshot_id": flow.current.snapshot_id,
                "event_ids": chunk,
            }
            if not self.link.send({"type": "counted", "payload": payload}):
                self._restart(flow)
                return
            flow.questions.add(request_id)
            self._questions[request_id] = flow
        self._flush()

    def list_failed(self, tag: int) -> None:
        flow = self._tags.pop(tag, None)
        if flow is not None:
            self._fail(flow)

    def _counted(self, payload: object) -> None:
        request_id = payload.get("request_id") if isinstance(payload, Mapping) else None
        flow = self._questions.pop(request_id, None) if isinstance(request_id, str) else None
        if flow is None or not isinstance(payload, Mapping):
            self._session.reject("counted", f"answer to no question: {request_id!r}")
            return
        ids = payload.get("event_ids")
        if not isinstance(ids, list):
            self._session.reject("counted", "event_ids is not a list")
            self._restart(flow)
            return
        flow.questions.discard(request_id)
        flow.counted.update(i for i in ids if isinstance(i, str) and i in flow.candidates)
        if not flow.questions and flow.step is Step.ASKING:
            self._apply(flow)

    def _error(self, payload: object) -> None:
        if not isinstance(payload, Mapping):
            self._session.reject("error", "error frame without a payload")
            return
        request_id, code = payload.get("request_id"), payload.get("code")
        flow = self._questions.pop(request_id, None) if isinstance(request_id, str) else None
        if flow is not None and code == "snapshot_expired":
            self._restart(flow)
            return
        self._session.reject("error", f"Polar answered {code!r}: {payload.get('message')!r}")
        if flow is not None:
            self._restart(flow)

    def _restart(self, flow: CustomerFlow) -> None:
        """Give up the snapshot in progress and ask for a fresh one."""
        self._abandon_flow(flow)
        if flow.pushed:  # nobody asked for it: asking Polar now would follow it
            self._let_go(flow)
            return
        self._request(flow)
        self._flush()

    def _fail(self, flow: CustomerFlow) -> None:
        """Redis could not do the flow's work: give the snapshot up and ask for a fresh one after
        a backoff (asking at once would loop as fast as Polar answers while Redis is down)."""
        self._abandon_flow(flow)
        if flow.pushed:  # nobody asked for it: no retry, which would ask Polar
            self._let_go(flow)
            return
        flow.failures += 1
        delay = backoff(flow.failures, RETRY_BASE, RETRY_CAP, self._rng.random())
        flow.retry_at = self.now + delay
        self._schedule(flow)

    def _abandon_flow(self, flow: CustomerFlow) -> None:
        for request_id in flow.questions:
            self._questions.pop(request_id, None)
        if flow.tag is not None:
            self._tags.pop(flow.tag, None)  # a late answer to it is ignored
        flow.reset()
        self._schedule(flow)

    # -- applying -----------------------------------------------------------------------------

    def _apply(self, flow: CustomerFlow) -> None:
        snapshot = flow.current
        assert snapshot is not None
        flow.before = {r: self._session.consumed(flow.customer, r) for r in snapshot.reducers}
        tag = self._await_answer(flow, Step.APPLYING)
        counted: dict[str, list[str]] = {}
        for event_id in sorted(flow.counted):  # a set: sort, so the effect is deterministic
            for pair in flow.candidates[event_id]:
                key, _, name = pair.partition("\n")
                counted.setdefault(key, []).append(name)
        self._session.emit(_apply_script(snapshot, counted, self._session, self.wall_us, tag))

    def applied(self, tag: int) -> None:
        flow = self._tags.pop(tag, None)
        if flow is None or flow.step is not Step.APPLYING:
            return
        flow.applied = True
        self.snapshots_applied += 1
        snapshot = flow.current
        assert snapshot is not None
        meters: list[str] = []
        before: list[float] = []
        after: list[float] = []
        for reducer_id, old in flow.before.items():
            new = self._session.consumed(flow.customer, reducer_id)
            for meter_id, value in new.items():
                meters.append(meter_id)
                before.append(old.get(meter_id, float("nan")))
                after.append(value)
        self._session.observe(
            SnapshotApplied(
                customer=flow.customer.tag,
                snapshot_id=snapshot.snapshot_id,
                cold_until=snapshot.cold_until,
                counted=len(flow.counted),
                meter_ids=tuple(meters),
                local_consumed=tuple(before),
                polar_consumed=tuple(after),
            )
        )
        if flow.finish() is not None:
            self._start(flow)
        elif flow.pushed:
            self._let_go(flow)
        else:
            self._arm_refresh(flow)
            self._schedule(flow)

    def _let_go(self, flow: CustomerFlow) -> None:
        """A flow nobody follows is done: keep nothing of it (its customer's aliases included)."""
        self.flows.pop(flow.customer, None)
        self._deadlines.cancel(flow.customer)
        self.aliases.pop(flow.customer, None)

    def apply_failed(self, tag: int) -> None:
        flow = self._tags.pop(tag, None)
        if flow is not None:
            self._fail(flow)


def _deadline(flow: CustomerFlow) -> float | None:
    """When a flow is due: its step gives up, its retry comes, its request is sent again, or
    it looks whether it should ask for a fresher snapshot."""
    if flow.step is not Step.IDLE:
        return flow.since + STEP_TIMEOUT
    if flow.retry_at is not None:
        return flow.retry_at
    if not flow.applied and flow.request_id is not None:
        return flow.requested_at + REQUEST_TIMEOUT
    return flow.refresh_at


def _apply_script(
    snapshot: Snapshot,
    counted: Mapping[str, list[str]],
    session: SessionHooks,
    wall_us: int,
    tag: int,
) -> RunScript:
    customer = snapshot.customer
    keys: list[str] = []
    args = [
        _keys.channel(session.shard_of(customer), session.channel_namespace),
        str(wall_us),
        str(session.pending_limit_us),
        str(snapshot.cold_until),
        str(snapshot.as_of),
        snapshot.snapshot_id,
        str(len(snapshot.credited)),
    ]
    for meter_id, units in snapshot.credited.items():
        args += (meter_id, format_number(units))
    for reducer_id, aggregate in snapshot.reducers.items():
        state = _keys.state_key(customer, reducer_id, session.shards)
        names = counted.get(state, [])
        keys += (state, _keys.acked_key(state))
        args += (str(session.known_rev(state)), aggregate.encode(), str(len(names)), *names)
    return RunScript(script="apply_snapshot", keys=tuple(keys), args=tuple(args), tag=tag)


__all__ = ["Remote", "customer_in"]

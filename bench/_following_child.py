"""One process of ``bench.following``: a session with a link and no Redis, N customers followed.

``python -m bench._following_child N BOUND`` prints one JSON line: the process's RSS before and
after following N customers (each read once: its load answered with a hash that holds a
snapshot, then Polar's snapshot applied, as a driver would), the cost of one ``Tick`` and of one
``next_deadline()`` with nothing due, and what one reconnect asks of Polar and one subscription
restart asks of Redis. ``BOUND`` 0 runs without ``max_customers`` (as large as N), anything else
with that bound. No I/O: every effect is answered in memory (the core alone).
"""

from __future__ import annotations

import gc
import json
import random
import sys
import time
from typing import Any

from wsproto import ConnectionType, WSConnection
from wsproto import events as ws

from outpost_core import (
    ConfigurationReceived,
    IdentityLoaded,
    LoadIdentity,
    RunScript,
    ScriptReplied,
    SendBytes,
    Session,
    Settings,
    SubscriberRestarted,
    Tick,
)
from outpost_core import _keys as keys
from outpost_core._effects import ListPending
from outpost_core._inputs import BytesReceived, ConnectionOpened, PendingListed
from outpost_core._link import Link, LinkSettings, Target

METER = "m-count"
REDUCER = "r-count"
CONFIGURATION = {
    "organization_id": "org",
    "meters": [],
    "reducers": [
        {
            "id": REDUCER,
            "filter": {
                "conjunction": "and",
                "clauses": [{"property": "name", "operator": "eq", "value": "call"}],
            },
            "aggregation": {"func": "count"},
            "meter_ids": [METER],
        }
    ],
}
COLD = 1_796_223_600_000_000
WALL = COLD + 400_000_000
FIELDS = {b"rev": b"7", b"cu": str(COLD).encode(), b"sa": str(COLD).encode(), b"sid": b"s-0"}
FIELDS.update({b"p": b"3 3 1 1", f"c:{METER}".encode(): b"100"})


QUIET = LinkSettings(ping_interval=1e9, dead_after=1e9)
"""The clock jumps here: no ping is due, and the link never looks dead."""


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


class Harness:
    def __init__(self, bound: int) -> None:
        has_bound = any(a.name == "max_customers" for a in Settings.__attrs_attrs__)
        if bound and not has_bound:
            raise SystemExit("this core has no max_customers")
        extra: dict[str, Any] = {"max_customers": bound or 10**9} if has_bound else {}
        self.session = Session(
            Settings(**extra),
            link=Link(
                Target(host="polar.test", port=443, tls=True), "tok", random.Random(7), QUIET
            ),
        )
        self.server = WSConnection(ConnectionType.SERVER)
        self.now = 1.0
        self.sent_snapshots = 0
        self.sent_forgets = 0
        self.loads = 0
        s = self.session
        s.handle(ConfigurationReceived(CONFIGURATION, from_cache=True))
        s.handle(SubscriberRestarted())
        s.handle(Tick(self.now, WALL))
        s.effects()
        self.connect()

    def connect(self) -> None:
        """The session's connection opens and Polar's side accepts the WebSocket."""
        self.session.handle(ConnectionOpened(self.now))
        self.pump()
        self.session.handle(BytesReceived(self.now, self.server.send(ws.AcceptConnection())))
        self.pump()

    def pump(self) -> list[Any]:
        """Run the session's effects: bytes go to Polar's side (counted), loads are answered
        with a hash that holds a snapshot; the rest is returned."""
        rest: list[Any] = []
        self.session.observations()  # (a driver hands them to telemetry)
        for effect in self.session.effects():
            if isinstance(effect, SendBytes):
                self.server.receive_data(effect.data)
                for event in self.server.events():
                    if isinstance(event, ws.TextMessage):
                        kind = json.loads(event.data)["type"]
                        self.sent_snapshots += kind == "snapshot"
                        self.sent_forgets += kind == "forget"
            elif isinstance(effect, LoadIdentity):
                self.loads += 1
                rest.append(effect)
            else:
                rest.append(effect)
        return rest

    def follow(self, i: int) -> None:
        s = self.session
        customer = f"c{i}"
        s.read(METER, customer)
        for effect in self.pump():
            if isinstance(effect, LoadIdentity):
                s.handle(IdentityLoaded(effect.key, FIELDS, effect.load_id))
        snapshot = {
            "snapshot_id": f"s-{i}",
            "external_customer_id": customer,
            "as_of": WALL,
            "cold_until": COLD,
            "reducers": {REDUCER: {"count": 3, "sum": 3, "min": 1, "max": 1}},
            "credited": {METER: 100},
        }
        data = self.server.send(
            ws.TextMessage(data=json.dumps({"type": "snapshot", "payload": snapshot}))
        )
        s.handle(BytesReceived(self.now, data))
        for effect in self.pump():
            if isinstance(effect, ListPending):
                s.handle(PendingListed(effect.tag, {}))
        for effect in self.pump():
            if isinstance(effect, RunScript) and effect.tag is not None:
                key = keys.state_key(keys.Customer("external", customer), REDUCER)
                reply = {"c": [{"k": key, "r": 8, "s": ["cu", str(COLD)], "d": {}}]}
                s.handle(ScriptReplied(json.dumps(reply), tag=effect.tag))
        self.pump()
        s.read(METER, customer)


def main(n: int, bound: int) -> dict[str, Any]:
    gc.collect()
    before = _rss()
    h = Harness(bound)
    started = time.perf_counter()
    recent = n - min(1000, n // 10)  # the last ones read recently, the others two minutes ago
    for i in range(n):
        if i == recent:
            h.session.handle(Tick(h.now, WALL))  # (a read dates from the tick after it)
            h.now += 120.0
            h.session.handle(Tick(h.now, WALL))
            h.pump()
        if i % 1000 == 0:
            h.now += 0.001  # reads spread over time, oldest first
            h.session.handle(Tick(h.now, WALL))
            h.pump()
        h.follow(i)
    follow_s = time.perf_counter() - started
    gc.collect()
    after = _rss()
    s = h.session
    # One Tick and one next_deadline() with nothing due.
    ticks: list[float] = []
    deadlines: list[float] = []
    for _ in range(20):
        h.now += 0.0001
        t0 = time.perf_counter_ns()
        s.handle(Tick(h.now, WALL))
        t1 = time.perf_counter_ns()
        s.next_deadline()
        t2 = time.perf_counter_ns()
        h.pump()
        ticks.append(t1 - t0)
        deadlines.append(t2 - t1)
    ticks.sort()
    deadlines.sort()
    followed = len({m.customer for m in s.followed})
    # A subscription restart, then a WebSocket reconnect: what each asks for at once.
    loads = h.loads
    s.handle(SubscriberRestarted())
    h.pump()
    restart_loads = h.loads - loads
    asked = h.sent_snapshots
    s.handle(BytesReceived(h.now, h.server.send(ws.CloseConnection(code=1011))))
    h.pump()
    h.server = WSConnection(ConnectionType.SERVER)
    assert s.remote is not None
    h.now = max(h.now, s.remote.link.retry_at)  # past the reconnect backoff
    s.handle(Tick(h.now, WALL))
    h.pump()
    h.connect()
    reconnect_requests = h.sent_snapshots - asked
    return {
        "n": n,
        "bound": bound,
        "followed": followed,
        "rss_before": before,
        "rss_after": after,
        "bytes_per_customer": (after - before) / max(followed, 1),
        "follow_s": follow_s,
        "tick_ns_p50": ticks[len(ticks) // 2],
        "next_deadline_ns_p50": deadlines[len(deadlines) // 2],
        "restart_loads": restart_loads,
        "reconnect_requests": reconnect_requests,
        "forgets": h.sent_forgets,
    }


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), int(sys.argv[2]))))

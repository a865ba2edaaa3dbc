"""`outpost demo`: the emulator, two SDK instances sharing one Redis, a live view and a verdict.

Everything runs in this process except Redis: the Polar emulator on a free loopback port with an
accelerated clock, and two `Outpost` instances (threads) that share that clock, a Redis, and the
emulator. Each instance plays an application serving requests for a few customers: it reads the
customer's balance first, refuses the request when it is exhausted (as an app answers 402), and
otherwise tracks one `api_call` event. Meanwhile the buckets close, Polar syncs them and pushes
snapshots, and billing seals them eleven minutes after they end. The demo ends with a verdict:
both instances must agree with each other and with Polar's own customer meters, with no event
left pending. Between the traffic and the verdict, a customer at zero gets 5 credits and both
instances race `reserve()` for them: exactly 5 must be admitted, and Polar must count 5.

Redis: `--redis-url` or `REDIS_URL` as given; else database 15 of the Redis on 127.0.0.1:6379
(never flushed: keys live under `outpost:v2:` and customer ids are fresh every run); else a
`redis-server` from PATH, started on a free port in a temporary directory and stopped at the end;
else the demo says how to install Redis and exits with status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import random
import shutil
import signal
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import FrameType
from typing import Any, TextIO

import redis

from outpost_core import DEFAULT_SHARDS, Balance, ConfigurationError, OutpostError, UnknownMeter
from outpost_emulator._clock import EmulatorClock
from outpost_emulator._server import Emulator
from outpost_emulator._timeutil import BUCKET_US, SEAL_AFTER_US, SECOND_US, floor_bucket, from_us
from outpost_emulator.redis_server import RedisServer
from outpost_sync import Outpost
from outpost_sync.cli import _demo_admission, _demo_public
from outpost_sync.cli._config import deployment_shards, redis_client_for

LOCAL_REDIS = ("127.0.0.1", 6379)
LOCAL_DB = 15
SYNC_DELAY = 10.0  # virtual seconds after a bucket ends before Polar syncs it (as the default)
SYNC_US = round(SYNC_DELAY * SECOND_US)
STEP_NOTES = {
    "closed": f"Polar syncs it {SYNC_DELAY:g} s later",
    "synced": "Polar pushes a snapshot per customer; what it counted stops being pending",
    "sealed": "billing takes it as it stands",
}
INSTALL_REDIS = """\
outpost demo needs Redis 7 or newer, and found none:
  - REDIS_URL is not set,
  - nothing answers on 127.0.0.1:6379,
  - `redis-server` is not on PATH.
Install Redis, then run the demo again (it starts its own redis-server from PATH):
  Debian/Ubuntu:  sudo apt-get install redis-server     (Ubuntu 22.04 ships 6.0: use the
                  packages.redis.io repository, https://redis.io/docs/install/)
  Fedora/RHEL:    sudo dnf install redis
  macOS:          brew install redis
  from source:    curl -O https://download.redis.io/redis-stable.tar.gz
                  tar xzf redis-stable.tar.gz && make -C redis-stable
                  export PATH="$PWD/redis-stable/src:$PATH"
Or point the demo at any Redis 7+: REDIS_URL=redis://host:6379/15 outpost demo
"""


# -- the script of the demo, in virtual seconds from the start of the first bucket ----------


@dataclass(frozen=True)
class Timeline:
    """When things happen, in seconds of Polar's clock after the first bucket starts, and how
    fast the clock runs meanwhile. Bucket 1 is [0, 300), bucket 2 is [300, 600)."""

    start: float = 220.0  # tracking starts 80 s before bucket 1 closes
    top_up: float = 320.0  # the customer with few credits buys more
    stop: float = 380.0  # tracking stops 80 s into bucket 2
    tracking_speed: float = 20.0
    settling_speed: float = 60.0  # until bucket 2 closes and syncs
    sealing_speed: float = 150.0  # until bucket 2 is sealed
    interval: float = 0.04  # wall seconds between two requests on one instance

    def faster(self, factor: float) -> Timeline:
        return Timeline(
            start=self.start,
            top_up=self.top_up,
            stop=self.stop,
            tracking_speed=self.tracking_speed * factor,
            settling_speed=self.settling_speed * factor,
            sealing_speed=self.sealing_speed * factor,
            interval=self.interval,
        )

    @property
    def last_bucket_end(self) -> float:
        return (self.stop // 300 + 1) * 300

    @property
    def sealed_at(self) -> float:
        return self.last_bucket_end + SEAL_AFTER_US / SECOND_US

    def wall_seconds(self) -> float:
        synced = self.last_bucket_end + SYNC_DELAY
        return (
            (self.stop - self.start) / self.tracking_speed
            + (synced - self.stop) / self.settling_speed
            + (self.sealed_at - synced) / self.sealing_speed
        )


@dataclass
class Customer:
    name: str
    external_id: str
    credits: int
    top_up: int = 0


@dataclass
class Row:
    """What the view shows of one customer."""

    balances: list[float | None]
    polar: float | None
    pending: int | None
    undelivered: int | None
    snapshots: int


@dataclass
class Stats:
    lock: threading.Lock = field(default_factory=threading.Lock)
    tracked: list[int] = field(default_factory=lambda: [0, 0])
    refused: list[int] = field(default_factory=lambda: [0, 0])
    errors: list[str] = field(default_factory=list)
    per_customer: dict[str, int] = field(default_factory=dict)
    snapshots: dict[str, set[datetime]] = field(default_factory=dict)

    def saw(self, customer: str, balance: Balance) -> None:
        if balance.snapshot_as_of is not None:
            with self.lock:
                self.snapshots.setdefault(customer, set()).add(balance.snapshot_as_of)


# -- Redis ------------------------------------------------------------------------------------


@dataclass
class RedisChoice:
    url: str
    description: str
    server: RedisServer | None = None
    """The redis-server the demo started (stopped at the end), if it started one."""

    def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None


class RedisNotFound(Exception):
    """No usable Redis; the message says what to do."""


def _version(client: redis.Redis) -> tuple[int, ...]:
    info: dict[str, Any] = client.info("server")
    text = str(info.get("redis_version", "0"))
    return tuple(int(part) for part in text.split(".") if part.isdigit())


def _probe(url: str, timeout: float = 0.5) -> tuple[int, ...]:
    """Redis's version at `url` (for a cluster, `redis+cluster://`, the node it names); raises
    redis.RedisError when it does not answer."""
    scheme, separator, rest = url.partition("://")
    if separator and scheme.endswith("+cluster"):
        url = f"{scheme.removesuffix('+cluster')}://{rest}"
    client = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=2)
    try:
        client.ping()
        return _version(client)
    finally:
        client.close()


def _deployment_shards(url: str) -> int:
    """The shard count of the deployment whose Redis the demo joins (16 where none is stored):
    its instances must use it. One it cannot read is left to the instances to refuse."""
    try:
        client = redis_client_for(url)
    except ValueError:
        return DEFAULT_SHARDS
    try:
        return deployment_shards(client)
    except (redis.RedisError, ConfigurationError):
        return DEFAULT_SHARDS
    finally:
        client.close()


def _start_redis_server(binary: str) -> RedisChoice:
    server = RedisServer(binary=binary)
    try:
        server.start()
    except RuntimeError as exc:
        server.close()
        raise RedisNotFound(f"{binary} did not start: {exc}") from None
    choice = RedisChoice(
        url=server.url,
        description=f"a redis-server started for the demo on 127.0.0.1:{server.port} "
        "(stopped at the end)",
        server=server,
    )
    version = _probe(choice.url, timeout=2.0)  # it answers: start() waited for a PING
    if version < (7,):
        choice.stop()
        raise RedisNotFound(
            f"{binary} is Redis {_dotted(version)}; Outpost needs Redis 7 or newer "
            "(sharded pub/sub).\n\n" + INSTALL_REDIS
        )
    return choice


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(str(part) for part in version) or "?"


def find_redis(explicit: str | None) -> RedisChoice:
    """The Redis the demo uses, in the order the module docstring gives."""
    url = explicit or os.environ.get("REDIS_URL")
    if url:
        source = "--redis-url" if explicit else "REDIS_URL"
        try:
            version = _probe(url, timeout=2)
        except (redis.RedisError, ValueError) as exc:
            raise RedisNotFound(f"{source}={url} does not answer: {exc}") from None
        if version < (7,):
            raise RedisNotFound(
                f"{source}={url} is Redis {_dotted(version)}; Outpost needs Redis 7 or newer."
            )
        return RedisChoice(url=url, description=f"{url} (from {source})")
    host, port = LOCAL_REDIS
    local = f"redis://{host}:{port}/{LOCAL_DB}"
    skipped = ""
    try:
        version = _probe(local)
    except redis.AuthenticationError:
        skipped = f"the Redis on {host}:{port} wants a password (set REDIS_URL to use it)"
    except (redis.ConnectionError, redis.TimeoutError):
        pass  # nothing there
    except redis.RedisError as exc:
        skipped = f"the Redis on {host}:{port} answered {exc}"
    else:
        if version >= (7,):
            return RedisChoice(
                url=local,
                description=(
                    f"database {LOCAL_DB} of the Redis on {host}:{port} (nothing is flushed; "
                    "keys under outpost:v2:, fresh customer ids)"
                ),
            )
        skipped = f"the Redis on {host}:{port} is {_dotted(version)}, older than 7"
    binary = shutil.which("redis-server")
    if binary is None:
        raise RedisNotFound((f"({skipped})\n" if skipped else "") + INSTALL_REDIS)
    choice = _start_redis_server(binary)
    if skipped:
        choice.description += f"; {skipped}"
    return choice


# -- logging: nothing may scribble over the live view -----------------------------------------


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: deque[str] = deque(maxlen=200)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        self.records.append(f"{record.name}: {record.getMessage()}")


@contextlib.contextmanager
def _collected_logs(path: str | None) -> Iterator[_Collect]:
    """Warnings go to the view; with `path`, everything from DEBUG up goes to that file too."""
    handler = _Collect()
    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    root.handlers = [handler]
    file_handler = None
    if path:
        file_handler = logging.FileHandler(path, encoding="utf-8")
        file_handler.setFormatter(
            logging.Formatter("%(asctime)s %(threadName)s %(levelname)s %(name)s: %(message)s")
        )
        root.addHandler(file_handler)
        root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.handlers, root.level = saved, level
        if file_handler is not None:
            file_handler.close()


# -- the view ---------------------------------------------------------------------------------


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    if value == int(value):
        return f"{int(value):,}"
    return f"{value:,.2f}"


def _clock_text(t_us: int) -> str:
    return from_us(t_us).strftime("%H:%M:%S")


def _minutes(t_us: int) -> str:
    return from_us(t_us).strftime("%H:%M")


class View:
    def __init__(self, out: TextIO, live: bool) -> None:
        self.out = out
        self.live = live
        self._lines = 0
        self._last_plain = 0.0

    def say(self, text: str) -> None:
        """A line that stays (above the live table)."""
        self._erase()
        self.out.write(text + "\n")
        self.out.flush()

    def frame(self, lines: Sequence[str], *, force: bool = False) -> None:
        if self.live:
            self._erase()
            width = shutil.get_terminal_size().columns - 1  # a wrapped line would break the redraw
            lines = [line[:width] for line in lines]
            self.out.write("\n".join(lines) + "\n")
            self._lines = len(lines)
            self.out.flush()
            return
        now = time.monotonic()
        if force or now - self._last_plain >= 2.0:
            self._last_plain = now
            self.out.write("\n".join(lines) + "\n\n")
            self.out.flush()

    def _erase(self) -> None:
        if self.live and self._lines:
            self.out.write(f"\x1b[{self._lines}F\x1b[J")
            self._lines = 0

    def keep(self) -> None:
        """Leave the last frame on screen."""
        self._lines = 0


# -- the demo ---------------------------------------------------------------------------------


NAMES = ("ada", "grace", "linus", "margaret", "ken", "barbara", "dennis", "frances")
CREDITS = (6000, 4000, 3000, 500, 5000, 3500, 2500, 4500)


class Demo:
    def __init__(self, options: argparse.Namespace, redis_choice: RedisChoice) -> None:
        self.options = options
        self.redis = redis_choice
        timeline = Timeline()
        self.timeline = timeline.faster(3.0) if options.fast else timeline
        run = uuid.uuid4().hex[:6]
        self.customers = [
            Customer(name, f"demo-{run}-{name}", CREDITS[i], top_up=2000 if i == 3 else 0)
            for i, name in enumerate(NAMES[: options.customers])
        ]
        self.stats = Stats()
        self.origin_us = floor_bucket(time.time_ns() // 1000) + BUCKET_US
        start = from_us(self.origin_us + round(self.timeline.start * SECOND_US))
        self.clock = EmulatorClock(start, speed=self.timeline.tracking_speed, frozen=True)
        self.phase = "starting"
        self.stop_tracking = threading.Event()
        self.view = View(sys.stdout, live=options.live)
        self.topped_up = False
        self.buckets: list[int] = [
            self.origin_us + k * BUCKET_US for k in range(int(self.timeline.stop // 300) + 1)
        ]
        self.shown: dict[tuple[int, str], bool] = {}
        self.race = _demo_admission.Race(f"demo-{run}-zero")

    def virtual(self) -> float:
        """Seconds of Polar's clock since the first bucket started."""
        return (self.clock.now_us() - self.origin_us) / SECOND_US

    # -- the run ----------------------------------------------------------------------------

    def run(self, logs: _Collect) -> int:
        t = self.timeline
        # + about 1.5 s of starting and stopping (measured: 6.3-6.7 s with --fast, 17.5 s without)
        self.view.say(
            f"Outpost demo: 2 instances, {len(self.customers)} customers, Polar's clock "
            f"{t.tracking_speed:g}-{t.sealing_speed:g}x (about {t.wall_seconds() + 1.5:.0f} s)"
        )
        self.view.say(f"  Redis:  {self.redis.description}")
        with Emulator.start(port=0, clock=self.clock, sync_delay=SYNC_DELAY) as emulator:
            self.view.say(
                f"  Polar:  emulator at {emulator.url} (in this process; its dashboard: "
                f"{emulator.url}/)"
            )
            meter = emulator.create_meter(
                "demo tokens",
                {
                    "conjunction": "and",
                    "clauses": [{"property": "name", "operator": "eq", "value": "api_call"}],
                },
                {"func": "sum", "property": "tokens"},
            )
            meter_id = str(meter["id"])
            for customer in self.customers:
                emulator.grant_credits(
                    meter_id, customer.credits, external_customer_id=customer.external_id
                )
            self.view.say(
                f"  Meter:  {meter_id}, the sum of metadata.tokens of `api_call` events; "
                "credits granted"
            )
            shards = _deployment_shards(self.redis.url)
            instances = [self._instance(emulator, shards) for _ in range(2)]
            try:
                return self._run(emulator, meter_id, instances, logs)
            finally:
                for instance in instances:
                    instance.close(timeout=5)

    def _instance(self, emulator: Emulator, shards: int) -> Outpost:
        return Outpost(
            access_token=emulator.token,
            server_url=emulator.url,
            redis_url=self.redis.url,
            clock=self.clock,
            linger=0.05,
            telemetry=False,
            shards=shards,
        )

    def _run(
        self, emulator: Emulator, meter_id: str, instances: list[Outpost], logs: _Collect
    ) -> int:
        t = self.timeline
        try:
            self._first_reads(meter_id, instances)
        except OutpostError as exc:
            self.view.say(f"The instances could not read the balances: {type(exc).__name__}: {exc}")
            self._show_logs(logs)
            self.view.say("VERDICT: DISAGREEMENT (the demo could not start)")
            return 1
        self.view.say(
            "  Both instances read every customer's balance (each first read waits for "
            "Polar's snapshot).\n"
        )
        workers = [
            threading.Thread(
                target=self._serve, args=(n, instance, meter_id), name=f"demo-{n}", daemon=True
            )
            for n, instance in enumerate(instances)
        ]
        self.phase = "tracking"
        emulator.freeze(False)
        for worker in workers:
            worker.start()
        try:
            while self.virtual() < t.stop:
                if not self.topped_up and self.virtual() >= t.top_up:
                    self._top_up(emulator, meter_id)
                self._draw(emulator, meter_id, instances, logs)
                time.sleep(0.2)
            self.stop_tracking.set()
            for worker in workers:
                worker.join(timeout=10)
            self.phase = "admission"
            self.race = _demo_admission.race(
                emulator, meter_id, instances, self.race.external_id, self._note
            )
            self.customers.append(Customer("zero", self.race.external_id, 0))
            self.phase = "settling"
            emulator.set_speed(t.settling_speed)
            for instance in instances:
                instance.flush(10)
            synced_at = t.last_bucket_end + SYNC_DELAY
            while self.virtual() < synced_at + 1:
                self._draw(emulator, meter_id, instances, logs)
                time.sleep(0.2)
            self.phase = "sealing"
            emulator.set_speed(t.sealing_speed)
            last_end = self.origin_us + round(t.last_bucket_end * SECOND_US)
            while emulator.state()["pipeline"]["sealed_until"] < last_end:
                self._draw(emulator, meter_id, instances, logs)
                time.sleep(0.2)
            self.phase = "verdict"
            emulator.set_speed(1)
            return self._verdict(emulator, meter_id, instances, logs)
        finally:
            self.stop_tracking.set()

    def _first_reads(self, meter_id: str, instances: list[Outpost]) -> None:
        deadline = time.monotonic() + 15
        for instance in instances:
            for customer in self.customers:
                while True:
                    try:
                        balance = instance.balance(
                            meter_id, external_customer_id=customer.external_id
                        )
                        self.stats.saw(customer.external_id, balance)
                        break
                    except UnknownMeter:
                        # A configuration cached in Redis by an earlier run (another emulator)
                        # is read until Polar's own arrives over the WebSocket.
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.05)

    def _serve(self, n: int, instance: Outpost, meter_id: str) -> None:
        """One instance playing an application: read the balance, then serve (track) or refuse."""
        rng = random.Random()
        interval = self.timeline.interval
        while not self.stop_tracking.is_set():
            customer = rng.choice(self.customers)
            try:
                balance = instance.balance(meter_id, external_customer_id=customer.external_id)
                self.stats.saw(customer.external_id, balance)
                if balance.balance <= 0:
                    with self.stats.lock:
                        self.stats.refused[n] += 1
                else:
                    instance.track(
                        "api_call",
                        external_customer_id=customer.external_id,
                        metadata={"tokens": rng.randint(5, 40), "instance": "AB"[n]},
                    )
                    with self.stats.lock:
                        self.stats.tracked[n] += 1
                        pc = self.stats.per_customer
                        pc[customer.external_id] = pc.get(customer.external_id, 0) + 1
            except OutpostError as exc:
                with self.stats.lock:
                    self.stats.errors.append(f"instance {'AB'[n]}: {type(exc).__name__}: {exc}")
            self.stop_tracking.wait(interval)

    def _top_up(self, emulator: Emulator, meter_id: str) -> None:
        self.topped_up = True
        for customer in self.customers:
            if customer.top_up:
                emulator.grant_credits(
                    meter_id, customer.top_up, external_customer_id=customer.external_id
                )
                self._note(
                    f"{customer.name} buys {customer.top_up:,} more credits: Polar pushes a "
                    "snapshot, both instances see it"
                )

    def _note(self, text: str, at: int | None = None) -> None:
        self.view.say(f"  {_clock_text(self.clock.now_us() if at is None else at)}  {text}")

    # -- drawing ----------------------------------------------------------------------------

    def _rows(self, emulator: Emulator, meter_id: str, instances: list[Outpost]) -> list[Row]:
        rows = []
        for customer in self.customers:
            balances: list[float | None] = []
            pending: int | None = None
            undelivered: int | None = None
            for instance in instances:
                try:
                    b = instance.balance(meter_id, external_customer_id=customer.external_id)
                except OutpostError:
                    balances.append(None)
                    continue
                self.stats.saw(customer.external_id, b)
                balances.append(b.balance)
                pending = max(pending or 0, b.pending)
                undelivered = max(undelivered or 0, b.undelivered)
            polar = emulator.customer_meter(meter_id, external_customer_id=customer.external_id)
            with self.stats.lock:
                snapshots = len(self.stats.snapshots.get(customer.external_id, ()))
            rows.append(Row(balances, float(polar["balance"]), pending, undelivered, snapshots))
        return rows

    def _bucket_lines(self, emulator: Emulator) -> list[str]:
        pipeline = emulator.state()["pipeline"]
        now = self.clock.now_us()
        lines = []
        for start in self.buckets:
            end = start + BUCKET_US
            if now < start:
                key, status = "later", ""
            elif now < end:
                key, status = "open", "Polar holds its events in its current bucket"
            elif pipeline["synced_until"] < end:
                key, status = "closed", f"Polar syncs it {SYNC_DELAY:g} s after its end"
            elif pipeline["sealed_until"] < end:
                sealed = _minutes(end + SEAL_AFTER_US)
                key, status = "synced", f"snapshots pushed; seals at {sealed}"
            else:
                key, status = "sealed", "billed as it stands"
            name = f"bucket {_minutes(start)}-{_minutes(end)}"
            # Note each step once, in order, at the time it happened: a redraw may come after
            # several steps at a high clock speed.
            steps = {"closed": end, "synced": end + SYNC_US, "sealed": end + SEAL_AFTER_US}
            reached = list(steps)[: list(steps).index(key) + 1] if key in steps else []
            for step in reached:
                if not self.shown.get((start, step)):
                    self.shown[(start, step)] = True
                    self._note(f"{name} {step}: {STEP_NOTES[step]}", at=steps[step])
            lines.append(f"  {name}  {key:<7} {status}")
        return lines

    def _draw(
        self,
        emulator: Emulator,
        meter_id: str,
        instances: list[Outpost],
        logs: _Collect,
        *,
        force: bool = False,
    ) -> list[Row]:
        rows = self._rows(emulator, meter_id, instances)
        buckets = self._bucket_lines(emulator)
        speed = self.clock.speed
        s = self.stats
        with s.lock:
            tracked, refused, errors = sum(s.tracked), sum(s.refused), len(s.errors)
        lines = [
            f"Polar's clock {_clock_text(self.clock.now_us())} ({speed:g}x)  {self._phase_text()}",
            *buckets,
            "",
            f"  {'':<21}{'balance on':>11}{'balance on':>11}{'Polar':>9}",
            f"  {'customer':<21}{'instance A':>11}{'instance B':>11}{'balance':>9}"
            f"{'pending':>8}{'undeliv.':>9}{'snaps.':>7}",
        ]
        for customer, row in zip(self.customers, rows, strict=True):
            a, b = row.balances
            lines.append(
                f"  {customer.external_id:<21}{_number(a):>11}{_number(b):>11}"
                f"{_number(row.polar):>9}{_number(row.pending):>8}{_number(row.undelivered):>9}"
                f"{row.snapshots:>7}"
            )
        lines.append("")
        lines.append(
            f"  requests: {tracked:,} tracked (A {s.tracked[0]:,}, B {s.tracked[1]:,}), "
            f"{refused:,} refused with 402 (balance <= 0)"
            + (f", {errors} errors" if errors else "")
        )
        if logs.count:
            lines.append(f"  log ({logs.count} warnings): {logs.records[-1]}")
        self.view.frame(lines, force=force)
        return rows

    def _phase_text(self) -> str:
        return {
            "tracking": "A and B serve: balance(), then track() or 402",
            "admission": "A and B race reserve() for a customer's last credits",
            "settling": "tracking stopped; the last bucket closes, syncs",
            "sealing": "billing seals each bucket 11 min after its end",
            "verdict": "does everyone agree?",
        }.get(self.phase, self.phase)

    # -- the verdict ------------------------------------------------------------------------

    def _verdict(
        self, emulator: Emulator, meter_id: str, instances: list[Outpost], logs: _Collect
    ) -> int:
        deadline = time.monotonic() + 15
        while True:
            rows = self._rows(emulator, meter_id, instances)
            problems = self._disagreements(rows) + self.race.problems(emulator, meter_id)
            if not problems or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        self._draw(emulator, meter_id, instances, logs, force=True)
        self.view.keep()
        s = self.stats
        if s.errors:
            self.view.say(f"  {len(s.errors)} calls raised; first: {s.errors[0]}")
        self._show_logs(logs)
        total = sum(s.tracked) + sum(self.race.admitted)
        if problems:
            self.view.say("VERDICT: DISAGREEMENT")
            for problem in problems:
                self.view.say(f"  {problem}")
            return 1
        self.view.say(
            f"VERDICT: OK: instances A and B agree with each other and with Polar's balance for "
            f"all {len(self.customers)} customers ({total:,} events tracked, 0 pending); "
            f"exactly {self.race.credits} of {self.race.attempts} racing reservations admitted "
            f"for {self.race.credits} credits, and Polar counts {self.race.credits}."
        )
        return 0

    def _show_logs(self, logs: _Collect) -> None:
        if logs.count:
            self.view.say(f"  {logs.count} warnings were logged; the last ones:")
            for record in list(logs.records)[-5:]:
                self.view.say(f"    {record}")

    def _disagreements(self, rows: list[Row]) -> list[str]:
        problems = []
        for customer, row in zip(self.customers, rows, strict=True):
            a, b = row.balances
            who = customer.external_id
            if a is None or b is None:
                problems.append(f"{who}: an instance could not read the balance")
                continue
            if a != b:
                problems.append(f"{who}: instance A reads {_number(a)}, instance B {_number(b)}")
            if row.polar is not None and a != row.polar:
                problems.append(f"{who}: the instances read {_number(a)}, Polar {row.polar}")
            if row.pending:
                problems.append(f"{who}: {row.pending} events still pending")
            if row.undelivered:
                problems.append(f"{who}: {row.undelivered} events not delivered to Polar")
        return problems


# -- entry point ------------------------------------------------------------------------------


def _options(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="outpost demo",
        description=(
            "Run the Polar emulator and two Outpost instances sharing one Redis, show their "
            "balances live while buckets close, sync and seal, and end with a verdict."
        ),
    )
    parser.add_argument(
        "--redis-url",
        help="the Redis to use (default: REDIS_URL, else database 15 of 127.0.0.1:6379, else "
        "a redis-server from PATH on a free port)",
    )
    parser.add_argument(
        "--customers",
        type=int,
        default=4,
        choices=range(1, len(NAMES) + 1),
        metavar="N",
        help=f"how many customers the two instances serve, 1 to {len(NAMES)} (default: 4)",
    )
    parser.add_argument(
        "--fast", action="store_true", help="run the clock 3x faster (about 7 s instead of 20)"
    )
    parser.add_argument(
        "--log",
        metavar="FILE",
        help="write the SDK's and the emulator's logs (DEBUG) to FILE (default: none)",
    )
    parser.add_argument(
        "--public-only",
        action="store_true",
        help="run the emulator serving only Polar's public API (no /v1/outpost/): the "
        "instances find it out (mode auto) and follow Polar by polls and webhooks",
    )
    parser.add_argument(
        "--plain",
        action="store_true",
        help="print periodic plain lines instead of redrawing a table (the default when "
        "stdout is not a terminal)",
    )
    options = parser.parse_args(list(argv) if argv is not None else None)
    options.live = not options.plain and sys.stdout.isatty() and os.environ.get("TERM") != "dumb"
    return options


def main(argv: Sequence[str] | None = None) -> int:
    options = _options(argv)
    try:
        choice = find_redis(options.redis_url)
    except RedisNotFound as exc:
        print(f"outpost demo: {exc}", file=sys.stderr)
        return 2
    started = time.monotonic()
    live = options.live
    previous = {signum: signal.getsignal(signum) for signum in _STOPS}
    for signum in _STOPS:
        signal.signal(signum, _raise_interrupt)
    try:
        if live:
            sys.stdout.write("\x1b[?25l")  # hide the cursor while redrawing
        with _collected_logs(options.log) as logs:
            if options.public_only:
                status = _demo_public.PublicDemo(options, choice.url, choice.description).run()
            else:
                status = Demo(options, choice).run(logs)
        print(f"(the demo took {time.monotonic() - started:.1f} s)")
        return status
    except KeyboardInterrupt:
        print("\noutpost demo: stopped", file=sys.stderr)
        return 0
    finally:
        if live:
            sys.stdout.write("\x1b[?25h")
            sys.stdout.flush()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        choice.stop()


_STOPS = (signal.SIGINT, signal.SIGTERM)
_AGAIN_AFTER = 0.02
"""Seconds after which an interrupt that landed in a finalizer is sent again."""


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C or a termination: stop the demo. Raised inside a finalizer (a connection's
    ``__del__`` that the collector runs in the middle of the demo), Python would print the
    interrupt as ignored, with a traceback, and lose it: the signal is sent again once that
    finalizer is done."""
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            threading.Timer(_AGAIN_AFTER, os.kill, (os.getpid(), signum)).start()
            return
        frame = frame.f_back
    raise KeyboardInterrupt


__all__ = ["main"]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

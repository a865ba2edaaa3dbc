"""The verdicts of ``outpost doctor`` and ``outpost outbox``: pure judgements of what the
commands measured (Redis's version, Polar's clock, the outbox group), so each rule is tested
without I/O and the commands only read and print.
"""

from __future__ import annotations

import email.utils
import enum
from collections.abc import Sequence

import attrs

MIN_REDIS = (7, 0)
"""Sharded pub/sub (SSUBSCRIBE, SPUBLISH) came with Redis 7."""
AHEAD_LIMIT_S = 2.0
"""Polar refuses events timestamped in its future. Its ``Date`` header has a resolution of one
second, so a clock more than this far ahead is certainly ahead."""
BEHIND_LIMIT_S = 60.0
"""A clock this far behind puts events into buckets Polar may have synced already (late events:
still counted, but each one makes Polar push a snapshot)."""
STALE_ENTRY_S = 60.0
"""An outbox entry older than this while instances are alive means delivery is stuck."""


class Severity(enum.Enum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


@attrs.frozen(slots=True)
class Verdict:
    check: str
    status: Severity
    detail: str

    def line(self) -> str:
        return f"{self.status.value.upper():4}  {self.check}: {self.detail}"


def overall(verdicts: Sequence[Verdict]) -> int:
    """The exit code: 0 when every check passed (warnings included), 1 when one failed."""
    return 1 if any(v.status is Severity.FAIL for v in verdicts) else 0


def redis_version(version: str) -> Verdict:
    parts = version.split(".")
    try:
        found = (int(parts[0]), int(parts[1]) if len(parts) > 1 else 0)
    except ValueError:
        return Verdict("redis version", Severity.FAIL, f"unreadable version {version!r}")
    if found < MIN_REDIS:
        return Verdict(
            "redis version",
            Severity.FAIL,
            f"Redis {version} has no sharded pub/sub; Outpost needs Redis 7 or newer",
        )
    return Verdict("redis version", Severity.OK, f"Redis {version}")


def clock_skew(local_us: int, date_header: str | None) -> Verdict:
    """This machine's clock against Polar's ``Date`` header."""
    if not date_header:
        return Verdict("clock", Severity.WARN, "Polar sent no Date header: skew unknown")
    try:
        polar = email.utils.parsedate_to_datetime(date_header)
    except (TypeError, ValueError):
        return Verdict("clock", Severity.WARN, f"unreadable Date header {date_header!r}")
    skew = local_us / 1e6 - polar.timestamp()
    if skew > AHEAD_LIMIT_S:
        return Verdict(
            "clock",
            Severity.FAIL,
            f"this machine is {skew:.1f} s ahead of Polar: Polar refuses events from its future "
            "(delivery waits until Polar's clock catches up); synchronise the clock (NTP)",
        )
    if skew < -BEHIND_LIMIT_S:
        return Verdict(
            "clock",
            Severity.WARN,
            f"this machine is {-skew:.1f} s behind Polar: events land in buckets Polar may have "
            "synced already (counted, but each makes Polar push a snapshot)",
        )
    limit = f"limit: {AHEAD_LIMIT_S:g} s ahead"
    return Verdict("clock", Severity.OK, f"{skew:+.1f} s from Polar ({limit})")


@attrs.frozen(slots=True)
class ConsumerState:
    name: str
    pending: int
    """Entries it holds (read, not settled)."""
    alive: bool
    """Whether its instance's heartbeat key exists."""
    released: bool = False
    """The consumer ``outpost outbox release`` hands entries to: no instance, so no heartbeat;
    a live instance's next survey takes what it holds (the next one to start, when none is)."""


@attrs.frozen(slots=True)
class OutboxState:
    depth: Sequence[int]
    """Entries in each shard's stream (undelivered, or delivered and not settled yet)."""
    oldest_age_s: float | None
    """Age of the oldest entry of all shards, or ``None`` when the outbox is empty."""
    consumers: Sequence[ConsumerState]

    @property
    def stranded(self) -> int:
        """Entries held by consumers whose instance is gone."""
        return sum(c.pending for c in self.consumers if not c.alive and not c.released)

    @property
    def released(self) -> int:
        """Entries released to whichever live instance surveys the outbox next."""
        return sum(c.pending for c in self.consumers if c.released)


def outbox(state: OutboxState) -> Verdict:
    total = sum(state.depth)
    alive = sum(1 for c in state.consumers if c.alive)
    dead = [c for c in state.consumers if not c.alive and not c.released]
    age = "" if state.oldest_age_s is None else f", oldest {state.oldest_age_s:.1f} s old"
    summary = (
        f"{total} entries{age}; {len(state.consumers)} consumers ({alive} alive, {len(dead)} gone)"
    )
    if state.stranded:
        return Verdict(
            "outbox",
            Severity.FAIL if not alive else Severity.WARN,
            f"{summary}; {state.stranded} entries held by gone instances "
            + (
                "(a live instance takes them within seconds)"
                if alive
                else "and no live instance to take them: start one, or `outpost outbox release`"
            ),
        )
    if state.released and not alive:
        # Released already: asking for a release again would change nothing.
        detail = f"{summary}; {state.released} entries released, for the next instance to start"
        return Verdict("outbox", Severity.WARN, detail)
    if total and state.oldest_age_s is not None and state.oldest_age_s > STALE_ENTRY_S:
        if not alive:
            detail = f"{summary}; no instance is delivering (none alive)"
            return Verdict("outbox", Severity.WARN, detail)
        return Verdict("outbox", Severity.WARN, f"{summary}; delivery is behind or stalled")
    return Verdict("outbox", Severity.OK, summary)


def eviction_policy(policy: str, maxmemory: int) -> Verdict:
    """Redis's ``maxmemory-policy`` against what Outpost keeps in it.

    The outbox streams (undelivered events) have no time to live; the state and bucket hashes
    (the local copy of usage) and the heartbeats have one. ``noeviction`` loses nothing (a full
    Redis refuses writes, and ``track()`` says so). A ``volatile-*`` policy can evict the state
    hashes: nothing is lost for billing, but a balance reads high until Polar's next snapshot
    counts the forgotten events. An ``allkeys-*`` policy can evict the outbox: undelivered events
    are lost, never billed."""
    name = "eviction"
    if policy == "noeviction":
        return Verdict(name, Severity.OK, "maxmemory-policy noeviction: Redis never drops a key")
    if maxmemory == 0:
        return Verdict(
            name,
            Severity.OK,
            f"maxmemory-policy {policy}, but no maxmemory limit: nothing is evicted "
            "(Outpost needs noeviction should a limit be set)",
        )
    if policy.startswith("volatile-"):
        return Verdict(
            name,
            Severity.WARN,
            f"maxmemory-policy {policy} can evict Outpost's state hashes (they carry a time to "
            "live): balances then read high until Polar's next snapshot; the outbox (no time to "
            "live) is kept. Outpost needs noeviction",
        )
    if policy.startswith("allkeys-"):
        return Verdict(
            name,
            Severity.FAIL,
            f"maxmemory-policy {policy} can evict the outbox: undelivered events would be lost, "
            "never billed. Set maxmemory-policy noeviction (or give Outpost its own Redis)",
        )
    return Verdict(
        name, Severity.WARN, f"unknown maxmemory-policy {policy!r}: Outpost needs noeviction"
    )


def shard_spread(count: int, stored: bool, used: int | None, primaries: int | None) -> Verdict:
    """The deployment's shard count, and on a cluster (``used`` of ``primaries`` own a shard)
    whether it leaves primaries without any of Outpost's keys."""
    origin = "stored" if stored else "none stored yet: the default, which the first instance stores"
    detail = f"{count} shards ({origin})"
    if used is None or primaries is None:
        return Verdict("shards", Severity.OK, detail)
    detail += f", over {used} of {primaries} primaries"
    if used < primaries:
        return Verdict(
            "shards",
            Severity.WARN,
            f"{detail}: the others hold none of Outpost's keys; more shards spread the load "
            "(docs/redis-layout.md, `outpost shards set`)",
        )
    return Verdict("shards", Severity.OK, detail)

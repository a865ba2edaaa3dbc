"""Delivery of the outbox to Polar's ingestion API: batching, retries, splitting, settling.

Theory of operation
-------------------
``track()`` appends every event to its shard's outbox stream in the same script that reduces it,
so an event that ``track()`` returned for is durable before delivery starts. Each instance runs
one (or ``max_in_flight``) delivery loops; each loop owns a :class:`Delivery` and repeats::

    delivery.handle(Tick(now, wall_us))     # the time
    (effect,) = delivery.effects()          # what to do now
    ...do it...                             # XREADGROUP, POST, a script, a callback, or sleep
    delivery.handle(Tick(now, wall_us))     # the time it came
    delivery.handle(answer)                 # what came of it
    ...log delivery.reports()...

This is the session's vocabulary: inputs in through ``handle()`` (time as a :class:`Tick`, which
dates the inputs after it), what to do drained with ``effects()``, what to log with
``reports()``. Every effect of a loop is a request whose answer is its next input, so a drain
holds exactly one effect, and the next drain waits for that answer.

A loop reads up to ``batch_size`` entries, lingers up to ``linger`` seconds for more (reading
what came every ``linger / 8`` seconds, not as each entry comes, and once more when a flush
begins), and posts one batch. With a shared request budget (``requests_per_minute``,
``_budget``) it first takes a request from it; while it waits for one it keeps reading, so under
load batches grow, up to ``batch_bytes`` of body (under Polar's 10 MiB; a batch that did not wait
for the budget holds at most ``batch_size`` events). An event too large for any batch is dropped.
Every batch ends in one of two ways, whatever the number of attempts:

* **delivered** (2xx): the ``acknowledge`` script marks its events acknowledged and removes the
  entries from the outbox;
* **dropped**: Polar refused an event for good (a 422 that points at it, or a batch of one that a
  400/413/422 refuses), or ``max_attempts`` failed. ``on_dropped`` hears of it, then the
  ``confirm`` script removes the events from pending everywhere. When an attempt may have reached
  Polar (a timeout, a reset connection, a 5xx: Polar may fail after storing) Polar may hold the
  events after all: they are settled with
  ``acknowledge`` instead, so they keep counting until a snapshot counts them or the pending limit
  passes, which keeps the local balance on the safe side.

A failed attempt changes nothing in Redis. A 422 that names its bad events splits the batch: the
named events are dropped and the rest go again at once. A 400, 413 or a 422 without usable
locations bisects the batch until the bad event stands alone. Only a delivery Polar received and
failed (a 5xx other than 502/503/504), or one that may have reached it (a timeout, a reset),
uses an attempt. When Polar cannot take the batch at all (429, 502, 503, 504, 408, 425, or
unreachable), or refuses only timestamps it finds in its future (its clock is behind ours), the
loop waits (Retry-After up to two minutes, else exponential backoff with jitter up to a minute)
and tries again for as long as it takes: an outage delays events, it never drops them. Any other
answer (401, 403, 404, a redirect, 405...) means a token or URL mistake that no retry within
this process fixes, but that dropping would make permanent: the loop stalls and retries slowly,
logging an error each time. A TLS certificate of Polar's that does not verify stalls it too.

Entries held by an instance whose heartbeat expired (it died or closed) are taken over at once
(``_liveness``). Entries of an instance that beats but does not move them are claimed once idle
for ``claim_idle`` seconds; a loop refreshes the claim on its own entries before each attempt so a
slow retry is never mistaken for a stuck instance.
"""

from __future__ import annotations

import email.utils
import functools
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import attrs

from . import _budget, _keys, _liveness
from ._backoff import backoff
from ._budget import BudgetAnswered, TakeRequest
from ._checks import finite, require_positive, require_whole
from ._inputs import Tick
from ._liveness import (
    Beat,
    CheckHeartbeats,
    ConsumersListed,
    ForgetHeartbeat,
    HeartbeatsChecked,
    Reclaim,
    Reclaimed,
    SurveyConsumers,
)
from ._outage import Report
from ._random import Random
from ._replies import text_of
from ._reports import Reports
from ._shards import checked as checked_shards
from .errors import UsageError

GROUP = "outpost"
_LINGER_READS = 8
"""A loop that lingers for more entries reads again at most this many times before the batch is
due, whatever arrives (and at least every ``read_block``: a long linger still reads what waits):
a read that blocked until the next entry came would be one read (and one GIL hand-off, in the
sync driver) per event at moderate rates. Often enough that a batch still fills to
``batch_size`` well before ``linger`` under load."""


@attrs.frozen(kw_only=True)
class DeliverySettings:
    batch_size: int = 500
    linger: float = 0.2
    max_attempts: int = 10
    backoff_base: float = 0.5
    backoff_cap: float = 60.0
    stall_delay: float = 30.0
    claim_idle: float = 300.0
    claim_interval: float = attrs.field(
        default=attrs.Factory(lambda s: min(30.0, s.claim_idle / 2), takes_self=True)
    )
    """How often a loop looks for stale entries: often enough that one idle for ``claim_idle`` is
    taken over soon after, never more than every 30 s."""
    channel_namespace: str = ""
    """Appended to the change channels, as ``Settings.channel_namespace``."""
    shards: int = _keys.DEFAULT_SHARDS
    """The deployment's shard count, as ``Settings.shards``: one outbox stream per shard."""
    read_block: float = 0.5
    """Longest a read blocks: a flush waits at most this long to be noticed."""
    flush_block: float = 0.01
    """How long a read blocks while flushing: short, but never zero (a read that returns at once
    would spin while the last entries are held by another loop or instance)."""
    consumer: str = ""
    """This instance's name in the outbox group; empty turns heartbeats and surveys off."""
    heartbeat: float = 10.0
    """Seconds an instance's heartbeat lives: one silent for that long is dead (``_liveness``)."""
    requests_per_minute: float = 0.0
    """The ingestion requests every instance together may send a minute (``_budget``); 0: no
    shared budget."""
    batch_bytes: int = 8 * 1024 * 1024
    """Most bytes of one request body: Polar refuses bodies over 10 MiB (413)."""
    settle_alongside: bool = False
    """Settle the batch that ended while the next one is posted (:class:`PostAndSettle`), rather
    than before reading on: a loop that settles, then posts, spends the settle scripts' round
    trips on top of Polar's. The drivers turn it on; off, a loop acts as traces recorded before
    it existed show."""
    settle_every: int = 0
    """Acknowledged entries settle together once this many are held, or as soon as no batch is
    about to go: fewer, larger settle scripts (each identity's state is written once a script,
    so once for several batches rather than once for each). 0: each batch settles on its own, as
    traces recorded before it existed show."""
    read_alongside: bool = False
    """Read the entries of the next batch while a batch is posted (``PostAndSettle.read``), and
    size each read to about one batch across the streams that hold entries, so that the first
    post does not wait for a read of everything queued. The drivers turn it on; off, a loop acts
    as traces recorded before it existed show."""

    def __attrs_post_init__(self) -> None:
        # Refused here, at construction: NaN passes every comparison, and a fraction or an
        # infinity reaches Redis and Polar as a command or header they refuse, in a loop.
        for name in ("batch_size", "max_attempts"):
            require_whole(name, getattr(self, name), 1, "at least 1")
        require_whole("batch_bytes", self.batch_bytes, 1024, "at least 1024")
        require_whole(
            "settle_every", self.settle_every, 0, "not negative (0: each batch settles alone)"
        )
        require_positive("heartbeat", self.heartbeat)
        if not finite(self.requests_per_minute) or self.requests_per_minute < 0:
            raise UsageError(
                "requests_per_minute must be a finite number, not negative (0: no budget), "
                f"got {self.requests_per_minute!r}"
            )
        for name in _DELAYS:
            value = getattr(self, name)
            if not finite(value) or value < 0:
                raise UsageError(f"{name} must be a finite number, not negative, got {value!r}")
        checked_shards(self.shards)


class OutboxEntry(NamedTuple):  # a tuple: a read makes thousands (attrs' init cost 2 µs each)
    stream: str
    id: str
    item: bytes
    """The event as an item of the ingestion body (JSON), exactly as track() queued it."""
    field: str
    """Its events-hash field, ``<bucket>:<event id>``."""
    states: tuple[str, ...]
    """The state keys of the identities it counts in."""


# -- effects (what the loop must do next) ---------------------------------------------------


@attrs.frozen(slots=True)
class ReadOutbox:
    """``XREADGROUP GROUP outpost <consumer> COUNT count BLOCK block STREAMS <all> >...``"""

    count: int
    block: float


@attrs.frozen(slots=True)
class ClaimStale:
    """``XAUTOCLAIM`` on every outbox stream for entries idle at least ``min_idle`` seconds."""

    min_idle: float
    count: int


@attrs.frozen(slots=True)
class RefreshClaim:
    """``XCLAIM ... JUSTID`` the batch's entries to this consumer, resetting their idle time
    (one command a stream: :meth:`by_stream`)."""

    entries: tuple[tuple[str, str], ...]

    def by_stream(self) -> dict[str, list[str]]:
        return _by_stream(self.entries)


@attrs.frozen(slots=True)
class PostBatch:
    """``POST /v1/events/ingest`` with ``body``; report :class:`BatchAnswered` or
    :class:`BatchFailed`."""

    body: bytes
    size: int


@attrs.frozen(slots=True)
class SettleScript:
    """Run ``acknowledge`` or ``confirm`` for one shard; report :class:`Settled`."""

    script: str
    keys: tuple[str, ...]
    args: tuple[str, ...]


@attrs.frozen(slots=True)
class PostAndSettle:
    """Run ``settles`` (in order) while ``post`` is in flight; report the post's answer once
    both are done. The scripts settle earlier batches, whose answers came: never this one's.
    With a ``read``, run it meanwhile too (without blocking), and report
    :class:`PostedAlongside`: the post's answer with what the read found."""

    post: PostBatch
    settles: tuple[SettleScript, ...]
    read: ReadOutbox | None = None


@attrs.frozen(slots=True)
class SettleScripts:
    """Run ``settles``, in any order or at once (each settles entries of its own); report
    :class:`Settled` once all are done."""

    settles: tuple[SettleScript, ...]


@attrs.frozen(slots=True)
class ReportDropped:
    """Call ``on_dropped(events, reason)``; report :class:`Reported`."""

    events: tuple[dict[str, Any], ...]
    reason: str


@attrs.frozen(slots=True)
class Sleep:
    """Nothing to do before ``until`` (monotonic seconds), unless flushing starts."""

    until: float


DeliveryEffect = (
    ReadOutbox
    | ClaimStale
    | RefreshClaim
    | PostBatch
    | PostAndSettle
    | SettleScript
    | SettleScripts
    | ReportDropped
    | Sleep
    | Beat
    | SurveyConsumers
    | CheckHeartbeats
    | Reclaim
    | TakeRequest
    | ForgetHeartbeat
)
"""Every effect a delivery driver runs: what a :class:`Delivery` asks for, and what a closing
instance runs after its loops stopped (``hand_back``: :class:`ForgetHeartbeat` is only there)."""


# -- inputs (what came of an effect) -------------------------------------------------------


@attrs.frozen(slots=True)
class OutboxRead:
    entries: Sequence[tuple[object, object, Mapping[Any, Any]]]  # StreamEntry, spelt out: a
    # trace decodes the tuples back from this annotation
    """(stream, entry id, fields) as Redis answered (``stream_entries``)."""


@attrs.frozen(slots=True)
class BatchAnswered:
    status: int
    body: bytes = b""
    retry_after: float | None = None


@attrs.frozen(slots=True)
class BatchFailed:
    reason: str
    maybe_sent: bool
    """Whether Polar may have received the request (a timeout or reset after sending)."""
    stalls: bool = False
    """Nothing was sent, and no retry will change that until someone fixes the set-up (Polar's
    TLS certificate does not verify): the loop stalls, as on a 401, and says why."""


@attrs.frozen(slots=True)
class PostedAlongside:
    """What came of a :class:`PostAndSettle` with a read: the post's answer, and the entries the
    read found (none when Redis failed it: they stay queued for a later read)."""

    answer: BatchAnswered | BatchFailed
    read: OutboxRead


@attrs.frozen(slots=True)
class Settled:
    reply: object = None


@attrs.frozen(slots=True)
class Reported:
    pass


@attrs.frozen(slots=True)
class Done:
    """The previous action (claim refresh, claim) finished; nothing to report."""


@attrs.frozen(slots=True)
class Flushing:
    """A flush began (``on``) or every flush ended: while one runs, a loop sends what is queued at
    once rather than linger, and reads with a short block."""

    on: bool


DeliveryAnswer = (
    OutboxRead
    | BatchAnswered
    | BatchFailed
    | PostedAlongside
    | Settled
    | Reported
    | Done
    | ConsumersListed
    | HeartbeatsChecked
    | Reclaimed
    | BudgetAnswered
)
"""What came of an effect: the input that answers it."""

DeliveryInput = DeliveryAnswer | Tick | Flushing
"""Every input a :class:`Delivery` takes: the time (:class:`Tick`, as the session's), a flush
beginning or ending, and the answers to its effects."""

_ANSWERS: dict[type, type | tuple[type, ...]] = {
    ReadOutbox: OutboxRead,
    ClaimStale: (OutboxRead, Done),
    RefreshClaim: Done,
    PostBatch: (BatchAnswered, BatchFailed),
    PostAndSettle: (BatchAnswered, BatchFailed, PostedAlongside),
    SettleScript: Settled,
    SettleScripts: Settled,
    ReportDropped: Reported,
    Sleep: Done,
    Beat: Done,
    SurveyConsumers: ConsumersListed,
    CheckHeartbeats: HeartbeatsChecked,
    Reclaim: Reclaimed,
    TakeRequest: BudgetAnswered,
    ForgetHeartbeat: Done,
}


RETRY_AFTER_CAP = 120.0
"""Longest wait a Retry-After may ask for: an absurd one would park a batch for ever, and a
batch's entries must be claimed again (before each attempt) well within ``claim_idle``."""

UNAVAILABLE = (502, 503, 504)
"""Polar (or its proxy) is down: wait, without using an attempt."""


@attrs.define
class _Batch:
    entries: list[OutboxEntry]
    attempts: int = 0
    """Failed deliveries: Polar received the batch and answered an error, or may have."""
    waits: int = 0
    """Times Polar could not take it (rate limited, unavailable, unreachable)."""
    maybe_sent: bool = False
    not_before: float = 0.0
    refreshed: bool = False


def _split(batch: _Batch, entries: list[OutboxEntry], now: float) -> _Batch:
    """A part of a batch, sent at once, keeping the batch's history."""
    return _Batch(entries, batch.attempts, batch.waits, batch.maybe_sent, not_before=now)


class Delivery:
    """One delivery loop's policy. Not thread-safe: one loop drives it."""

    def __init__(self, settings: DeliverySettings, rng: Random, now: float) -> None:
        self.settings = settings
        self._rng = rng
        self._streams = _keys.shard_of_stream(settings.shards)  # the deployment's outboxes
        self._buffer: list[OutboxEntry] = []
        self._buffer_bytes = 0  # what the buffer adds to a body: each item and a comma
        self._budgeted = settings.requests_per_minute > 0
        self._granted_at: float | None = None  # when the request taken from the budget may go
        self._waited = False
        """Whether the budget made this request wait: requests are scarce, so it carries all
        that was read meanwhile (up to ``batch_bytes``), not ``batch_size``."""
        self._buffer_since: float | None = None
        self._next_read = 0.0
        """While lingering, no read before this: see ``_LINGER_READS``."""
        self._topped_up = False
        """Whether the buffer was read once more since a flush began."""
        self._read_ahead = False
        """Whether the outbox was read (without blocking) since the last batch's settle scripts
        were queued: once, to find the next batch to post alongside them."""
        self._spread = settings.shards
        """How many streams held more entries than the last read took from each: a read asks
        each stream for its share of a batch (``read_alongside``)."""
        self._asked: int | None = None  # what the read in flight asked of each stream
        self._more = False
        """Whether the last sized read left entries behind (a stream gave all it was asked): a
        batch that is not full reads again before it goes, rather than spend a request on a
        part (a flush of a backlog would otherwise take more requests than it needs)."""
        self._read_outstanding = False  # the post in flight carries a read
        self._batches: list[_Batch] = []  # splits waiting their turn, first is current
        # (stream, id) of every entry in the buffer or a batch, kept as they come and go: a read
        # checks against it, and building it from them for every read cost a lingering loop
        # more than the read (thousands held, a read every linger / 8).
        self._held_keys: set[tuple[str, str]] = set()
        self._work: list[DeliveryEffect] = []  # settle scripts and reports of the batch that ended
        self._acked: list[OutboxEntry] = []  # acknowledged, to settle together (settle_every)
        self._awaiting: type | None = None
        self._next_claim = now
        self._live = bool(settings.consumer)
        self._next_beat = now
        self._next_survey = now
        self._surveyed: dict[str, set[str]] = {}
        self._checking: tuple[str, ...] = ()
        self._reclaims: list[DeliveryEffect] = []
        self.consumers_removed = 0
        """Consumers of dead instances this loop removed from the outbox group."""
        self.flushing = False
        """Whether a flush runs (the latest :class:`Flushing`)."""
        self.delivered = 0
        self.dropped = 0
        self.rejected_entries = 0
        self.rate_limited = 0
        self._now = now
        self._wall_us = 0
        self._reports = Reports()
        self.stalled: str | None = None
        """Why delivery is stalled (a 401/403/404), for operators; ``None`` when it is not."""
        self.blocked = False
        """Stalled by what only an operator fixes (a token, a URL, a certificate, a proxy): the
        queued events wait ``stall_delay`` between tries, and a flush can only time out."""

    # -- what to do ---------------------------------------------------------------------------

    def effects(self) -> list[DeliveryEffect]:
        """Drain what the driver must do now (as of the latest :class:`Tick`): one effect, a
        request whose answer :meth:`handle` takes before the next drain."""
        if self._awaiting is not None:
            raise UsageError(f"report the outcome of the last action first ({self._awaiting})")
        action = self._choose(self._now)
        self._awaiting = type(action)
        return [action]

    def _choose(self, now: float) -> DeliveryEffect:
        s = self.settings
        if self._acked and (len(self._acked) >= s.settle_every or not self._posting_next(now)):
            acked, self._acked = self._acked, []
            self._settle(acked, "acknowledge")
        if self._work:
            if s.settle_alongside and all(isinstance(w, SettleScript) for w in self._work):
                ahead = self._ahead(now)
                if ahead is not None:
                    return ahead
                settles = tuple(w for w in self._work if isinstance(w, SettleScript))
                self._work, self._read_ahead = [], False
                return SettleScripts(settles)  # the next batch cannot go yet: settle now
            return self._work.pop(0)
        if self._live:
            liveness = self._liveness(now)
            if liveness is not None:
                return liveness
        if self._batches:
            batch = self._batches[0]
            if batch.not_before > now:
                return Sleep(batch.not_before)
            if not batch.refreshed:
                # Every entry this loop holds, not only this batch's: the others wait behind it,
                # and an entry left idle past claim_idle would be claimed and posted again.
                batch.refreshed = True
                return RefreshClaim(tuple((e.stream, e.id) for e in self._held()))
            return self._gate(now, reading=False) or self._post(batch.entries)
        if now >= self._next_claim:
            self._next_claim = now + s.claim_interval
            return ClaimStale(min_idle=s.claim_idle, count=s.batch_size)
        if self._buffer:
            assert self._buffer_since is not None
            due = self._buffer_since + s.linger
            ready = self._topped_up or (now >= due and not self.flushing)
            if self._full or (ready and not self._more):
                return self._gate(now, reading=True) or self._next_post()
            if self.flushing:  # one read first: a flush sends what is queued in one batch
                self._topped_up = True
            elif now < self._next_read and not self._more:
                return Sleep(min(self._next_read, due))
            return self._read_of(s.batch_size - len(self._buffer), 0.0)
        return self._read_of(s.batch_size, s.flush_block if self.flushing else s.read_block)

    def _read_of(self, wanted: int, block: float) -> ReadOutbox:
        """A read for ``wanted`` more entries. Its count bounds each stream: with reads sized
        (``read_alongside``), each stream still holding entries is asked for its share."""
        if not self.settings.read_alongside:
            return ReadOutbox(count=wanted, block=block)
        # An eighth more than wanted: streams give unevenly, and a batch a few entries short
        # would take one more read before it goes.
        self._asked = -(-(wanted + wanted // 8) // self._spread)
        return ReadOutbox(count=self._asked, block=block)

    def _with_read(self, post: PostBatch, settles: tuple[SettleScript, ...]) -> DeliveryEffect:
        """``post`` (with ``settles``), and the read of the next batch's entries meanwhile unless
        the buffer holds them already (or reads alongside are off)."""
        s = self.settings
        if not s.read_alongside or self._full:
            return PostAndSettle(post, settles) if settles else post
        self._read_ahead = True  # the next batch's read is this one
        if self.flushing:
            self._topped_up = True  # a flush posts what this read finds, in one batch
        self._read_outstanding = True
        return PostAndSettle(post, settles, self._read_of(s.batch_size - len(self._buffer), 0.0))

    @property
    def _full(self) -> bool:
        s = self.settings
        return len(self._buffer) >= s.batch_size or self._buffer_bytes >= s.batch_bytes

    def _ahead(self, now: float) -> DeliveryEffect | None:
        """With settle scripts queued: the next batch's post, carrying them (they run while it is
        in flight), or what it needs first without waiting (a read, a request from the budget);
        ``None`` when it cannot go yet: the scripts then run alone, never held back."""
        s = self.settings
        if self._batches:  # a split or a retry: its claim is refreshed before it goes again
            return None
        if self._buffer:
            assert self._buffer_since is not None
            due = now >= self._buffer_since + s.linger and not self.flushing
            if self._full or ((self._topped_up or due) and not self._more):
                return self._alongside(now)
        if self._read_ahead and not self._more:
            return None
        self._read_ahead = True
        if self.flushing:
            self._topped_up = True  # a flush posts what this read finds, in one batch
        return self._read_of(s.batch_size - len(self._buffer), 0.0)

    def _alongside(self, now: float) -> DeliveryEffect | None:
        """The next batch with the settle scripts, once the budget lets it go; a request taken
        from the budget first; ``None`` when the budget makes it wait."""
        gate = self._gate(now, reading=False)
        if gate is None:
            return self._next_post()
        return gate if isinstance(gate, TakeRequest) else None

    def _next_post(self) -> DeliveryEffect:
        """The next batch's post, carrying the settle scripts its turn takes
        (``_settles_for_one_post``), and the read of the batch after it."""
        post = self._start_batch()
        last = not self._buffer and not self._more and self.settings.settle_alongside
        if last and self._acked:
            # No batch is known to follow this one: what waited to settle with the next batches
            # settles beside it, rather than alone after it (the end of a flush waited for that).
            acked, self._acked = self._acked, []
            self._settle(acked, "acknowledge")
        settles = self._settles_for_one_post(every=last)
        if settles:
            self._read_ahead = False
        return self._with_read(post, settles)

    def _settles_for_one_post(self, *, every: bool) -> tuple[SettleScript, ...]:
        """The queued settle scripts to run beside the next post: all of them, or with
        ``settle_every``, about one batch's entries (at least one script), the rest beside the
        posts after it. Several batches settled beside one post held the next post back: Redis
        takes longer to settle four batches than Polar to store one. ``every``: the post is the
        last one known, and no post after it would carry the rest."""
        settles = [w for w in self._work if isinstance(w, SettleScript)]  # all the work, here
        taken, entries = len(settles), 0
        if self.settings.settle_every and not every:
            taken = 0
            while taken < len(settles) and (taken == 0 or entries < self.settings.batch_size):
                entries += int(settles[taken].args[3])  # the count of entry ids it settles
                taken += 1
        self._work = list(settles[taken:])
        return tuple(settles[:taken])

    def _liveness(self, now: float) -> DeliveryEffect | None:
        """Beat, then survey the group and take what dead instances hold: before any batch, so
        neither waits behind a batch that waits for Polar."""
        s = self.settings
        if now >= self._next_beat:
            self._next_beat = now + _liveness.interval(s.heartbeat)
            return _liveness.beat(s.consumer, s.heartbeat)
        if self._reclaims:
            return self._reclaims.pop(0)
        if now >= self._next_survey:
            self._next_survey = now + _liveness.interval(s.heartbeat)
            return SurveyConsumers()
        return None

    def _posting_next(self, now: float) -> bool:
        """Whether a batch goes next, or once a read fills it: acknowledged entries wait for it
        (to settle with the next ones) only then, never behind a wait."""
        s = self.settings
        if self._granted_at is not None and self._granted_at > now:
            return False  # the budget makes the next request wait
        if self._batches:
            return self._batches[0].not_before <= now
        if not self._buffer:
            return False
        assert self._buffer_since is not None
        due = now >= self._buffer_since + s.linger
        return self._full or self._more or self._topped_up or self.flushing or due

    @property
    def idle(self) -> bool:
        """Nothing read and not yet settled."""
        return not (self._buffer or self._batches or self._work or self._acked)

    def _held(self) -> list[OutboxEntry]:
        return [e for b in self._batches for e in b.entries] + self._buffer

    def _gate(self, now: float, *, reading: bool) -> DeliveryEffect | None:
        """``None`` when a request may go now; else take one from the budget, or wait for the one
        taken (reading more meanwhile, while the batch has room: it grows instead of idling)."""
        if not self._budgeted:
            return None
        if self._granted_at is None:
            return _budget.take(self.settings.requests_per_minute)
        if now >= self._granted_at:
            return None
        if reading and self._buffer_bytes < self.settings.batch_bytes:
            block = min(self._granted_at - now, self.settings.read_block)
            return self._read_of(self.settings.batch_size, block)
        return Sleep(self._granted_at)

    def _post(self, entries: list[OutboxEntry]) -> PostBatch:
        self._granted_at = None
        return PostBatch(body=_body(entries), size=len(entries))

    def _start_batch(self) -> PostBatch:
        """A batch of the oldest buffered entries, as many as ``batch_bytes`` of body holds (and
        ``batch_size`` unless the budget made it wait: requests are only scarce then)."""
        self._topped_up = False
        room = self.settings.batch_bytes - _BODY_OVERHEAD
        most = len(self._buffer) if self._waited else self.settings.batch_size
        taken = 0
        for entry in self._buffer[:most]:
            room -= len(entry.item) + 1
            if room < 0 and taken:
                break
            taken += 1
        entries = self._buffer[:taken]
        self._buffer = self._buffer[taken:]
        self._buffer_bytes -= sum(len(e.item) + 1 for e in entries)
        self._buffer_since = None if not self._buffer else self._buffer_since
        self._batches.append(_Batch(entries=entries, refreshed=True))
        return self._post(entries)

    # -- outcomes -----------------------------------------------------------------------------

    def handle(self, event: DeliveryInput) -> None:
        """Take one input: the time (a :class:`Tick`: ``now`` monotonic seconds, which the inputs
        after it and the next effect date from; ``wall_us`` the wall clock, for acknowledgement
        times, which are compared with snapshot times), a flush beginning or ending, or what came
        of the effect last drained. Then drain :meth:`reports` (and :meth:`effects`)."""
        if isinstance(event, Tick):
            self._now, self._wall_us = event.now, event.wall_us
        elif isinstance(event, Flushing):
            self.flushing = event.on
        else:
            self._answered_by(event)

    def _answered_by(self, outcome: DeliveryAnswer) -> None:
        expected, self._awaiting = self._awaiting, None
        now = self._now
        if expected is None:
            raise UsageError(f"{type(outcome).__name__} reported with no action outstanding")
        if not isinstance(outcome, _ANSWERS[expected]):
            self._awaiting = expected
            raise UsageError(
                f"{type(outcome).__name__} is not a delivery outcome that answers "
                f"{expected.__name__}"
            )
        if expected is PostAndSettle and self._read_outstanding != isinstance(
            outcome, PostedAlongside
        ):
            self._awaiting = expected
            what = "a PostedAlongside" if self._read_outstanding else "the post's answer alone"
            raise UsageError(f"this PostAndSettle is answered by {what}")
        self._read_outstanding = False
        rejected = self.rejected_entries
        self._take(outcome, now)
        if isinstance(outcome, PostedAlongside):
            outcome = outcome.answer
        if self.rejected_entries > rejected:
            count = self.rejected_entries - rejected
            message = f"outpost removed {count} unreadable outbox entries (or rejected replies)"
            self._reports.add(logging.WARNING, message)
        stalls = isinstance(outcome, BatchFailed) and outcome.stalls
        if self.stalled and (isinstance(outcome, BatchAnswered) or stalls):
            self._reports.add(logging.ERROR, f"outpost delivery is stalled: {self.stalled}")

    def reports(self) -> list[Report]:
        """Drain what the driver must log (unreadable entries removed, a stall and why), oldest
        first: at most the newest thousand lines, after one that counts those let go when nobody
        drained them in time."""
        return self._reports.drain()

    def _take(self, outcome: DeliveryAnswer, now: float) -> None:
        if isinstance(outcome, OutboxRead):
            self._read(outcome, now)
        elif isinstance(outcome, BatchAnswered):
            self._answered(outcome, now)
        elif isinstance(outcome, BatchFailed):
            self._failed(outcome, now)
        elif isinstance(outcome, PostedAlongside):
            self._take(outcome.answer, now)  # the batch posted, then what was read meanwhile
            self._read(outcome.read, now)
        elif isinstance(outcome, ConsumersListed):
            self._listed(outcome)
        elif isinstance(outcome, HeartbeatsChecked):
            self._checked(outcome)
        elif isinstance(outcome, Reclaimed):
            self._reclaimed(outcome, now)
        elif isinstance(outcome, BudgetAnswered):
            self._budget_answered(outcome, now)

    def _budget_answered(self, outcome: BudgetAnswered, now: float) -> None:
        wait = _budget.wait_of(outcome)
        if wait is None:
            self.rejected_entries += 1
        self._granted_at = now + (wait or 0.0)
        self._waited = bool(wait)

    def _listed(self, outcome: ConsumersListed) -> None:
        self._surveyed, rejected = _liveness.consumers_of(
            outcome.listing, self.settings.consumer, self.settings.shards
        )
        self.rejected_entries += rejected
        check = _liveness.check(self._surveyed)
        if check is not None:
            self._checking, action = check
            self._reclaims.append(action)

    def _checked(self, outcome: HeartbeatsChecked) -> None:
        s = self.settings
        calls, rejected = _liveness.reclaims(
            self._surveyed, self._checking, outcome.values, s.consumer, s.batch_size
        )
        self.rejected_entries += rejected
        self._reclaims += calls

    def _reclaimed(self, outcome: Reclaimed, now: float) -> None:
        taken = _liveness.taken_entries(outcome)
        if taken is None:
            self.rejected_entries += 1
            return
        entries, removed = taken
        self.consumers_removed += removed
        self._read(OutboxRead(entries), now)

    def _read(self, outcome: OutboxRead, now: float) -> None:
        malformed: list[tuple[str, str]] = []
        too_large: list[OutboxEntry] = []
        held, streams, buffer = self._held_keys, self._streams, self._buffer
        was_empty = not buffer
        largest = self.settings.batch_bytes - _BODY_OVERHEAD  # the largest item a body holds
        added = 0  # what the entries buffered add to a body
        names: dict[object, str | None] = {}  # each stream's name decoded once a read
        taken: dict[str | None, int] = {}  # entries each stream answered
        # The loop runs for every entry read (thousands a second): locals, one key tuple each.
        for stream, entry_id, fields in outcome.entries:
            stream_s = names.get(stream, _UNSEEN) if type(stream) is bytes else text_of(stream)
            if stream_s is _UNSEEN:
                stream_s = names[stream] = text_of(stream)
            taken[stream_s] = taken.get(stream_s, 0) + 1
            id_s = text_of(entry_id)
            key = (stream_s, id_s)
            if key in held:  # held as text, answered as bytes
                continue  # claimed back while this loop still holds it: it is here already
            entry = _entry(stream_s, id_s, fields, streams)
            if entry is None:
                if stream_s in streams and id_s is not None:
                    malformed.append((stream_s, id_s))  # removed, so it is not read again
                self.rejected_entries += 1
                continue
            size = len(entry[2])  # the item's
            if size > largest:
                too_large.append(entry)  # no batch can carry it: Polar would refuse it (413)
                continue
            buffer.append(entry)
            added += size + 1
            held.add(key)  # type: ignore[arg-type]  # text both, once _entry took them
        self._buffer_bytes += added
        if was_empty and buffer:
            self._buffer_since = now
        self._next_read = now + min(self.settings.linger / _LINGER_READS, self.settings.read_block)
        if self._asked is not None:
            # Streams that gave all that was asked may hold more; when none did, what comes
            # next is new, and the last spread is as good a guess as any.
            filled = sum(n >= self._asked for n in taken.values())
            self._spread, self._more, self._asked = filled or self._spread, filled > 0, None
        if too_large:
            limit = self.settings.batch_bytes
            self._drop(too_large, f"larger than an ingestion request may be ({limit} bytes)",
                       definitive=True)  # fmt: skip
        if malformed:
            for stream, ids in _by_stream(malformed).items():
                self._work.append(self._settle_script("confirm", stream, ids, []))

    def _answered(self, outcome: BatchAnswered, now: float) -> None:
        batch = self._batches[0]
        status = outcome.status
        if 200 <= status < 300:
            self._batches.pop(0)
            self.stalled, self.blocked = None, False
            self.delivered += len(batch.entries)
            if self.settings.settle_every:
                self._acked += batch.entries  # held (and so not read again) until settled
            else:
                self._settle(batch.entries, "acknowledge")
        elif status == 422 and _only_early(outcome.body):
            # Polar's clock is behind this machine's: the events become valid in a moment.
            self.stalled = "Polar refused timestamps in its future: this machine's clock is ahead"
            self._wait(batch, now, None)
        elif status == 422 and (bad := _bad_indexes(outcome.body, len(batch.entries))):
            self._batches.pop(0)
            dropped = [e for i, e in enumerate(batch.entries) if i in bad]
            rest = [e for i, e in enumerate(batch.entries) if i not in bad]
            # An earlier attempt that may have reached Polar keeps the drop uncertain.
            self._drop(dropped, "rejected by Polar (422)", definitive=not batch.maybe_sent)
            if rest:
                self._batches.insert(0, _split(batch, rest, now))
        elif status in (400, 413, 422):
            self._batches.pop(0)
            if len(batch.entries) == 1:
                reason = f"rejected by Polar ({status})"
                self._drop(batch.entries, reason, definitive=not batch.maybe_sent)
            else:
                half = len(batch.entries) // 2
                for part in (batch.entries[half:], batch.entries[:half]):
                    self._batches.insert(0, _split(batch, part, now))
        elif status == 429:
            self.rate_limited += 1
            self._wait(batch, now, outcome.retry_after)
        elif status in UNAVAILABLE or status in (408, 425):
            self._wait(batch, now, outcome.retry_after)  # 408, 425: it was not processed
        elif 500 <= status < 600:
            # Polar may have stored the events before failing: if they end up dropped, they keep
            # counting (acknowledged) rather than leave the local balance above Polar's.
            self._retry(batch, f"Polar answered {status}", now, outcome.retry_after, True)
        else:
            # 401, 403, 404, a redirect, 405...: a token or URL mistake, not the events' fault.
            self.stalled = f"Polar answered {status}: check the access token and server URL"
            self.blocked = True
            batch.not_before = now + self.settings.stall_delay
            batch.refreshed = False

    def _failed(self, outcome: BatchFailed, now: float) -> None:
        if outcome.stalls:
            self.stalled, self.blocked = outcome.reason, True
            self._batches[0].not_before = now + self.settings.stall_delay
            self._batches[0].refreshed = False
        elif outcome.maybe_sent:
            self._retry(self._batches[0], outcome.reason, now, None, True)
        else:
            self._wait(self._batches[0], now, None)  # Polar unreachable: nothing was tried

    def _wait(self, batch: _Batch, now: float, retry_after: float | None) -> None:
        """Polar could not take the batch (rate limit, unavailable, unreachable): wait and try
        again, as long as it takes. This uses no attempt: an outage never drops events."""
        batch.waits += 1
        batch.not_before = now + max(self._backoff(batch.waits), retry_after or 0.0)
        batch.refreshed = False

    def _retry(
        self, batch: _Batch, reason: str, now: float, retry_after: float | None, maybe: bool
    ) -> None:
        batch.attempts += 1
        batch.maybe_sent = batch.maybe_sent or maybe
        if batch.attempts >= self.settings.max_attempts:
            self._batches.pop(0)
            why = f"{reason}, after {batch.attempts} attempts"
            self._drop(batch.entries, why, definitive=not batch.maybe_sent)
            return
        delay = self._backoff(batch.attempts + batch.waits)
        batch.not_before = now + max(delay, retry_after or 0.0)
        batch.refreshed = False

    def _settle_script(
        self, script: str, stream: str, ids: list[str], entries: Sequence[OutboxEntry]
    ) -> SettleScript:
        namespace = self.settings.channel_namespace
        shard = self._streams[stream]
        return _settle_call(script, stream, shard, ids, entries, self._wall_us, namespace)

    def _backoff(self, attempt: int) -> float:
        s = self.settings
        return backoff(attempt, s.backoff_base, s.backoff_cap, self._rng.random())

    def _drop(self, entries: list[OutboxEntry], reason: str, *, definitive: bool) -> None:
        self.dropped += len(entries)
        events = tuple(_event(e.item) for e in entries)
        self._work.append(ReportDropped(events=events, reason=reason))
        self._settle(entries, "confirm" if definitive else "acknowledge")

    def _settle(self, entries: list[OutboxEntry], script: str) -> None:
        """Every entry leaves the loop this way: acknowledged, or dropped."""
        self._held_keys.difference_update((e.stream, e.id) for e in entries)
        by_stream: dict[str, list[OutboxEntry]] = {}
        for entry in entries:
            by_stream.setdefault(entry.stream, []).append(entry)
        for stream, group in by_stream.items():
            ids = [e.id for e in group]
            self._work.append(self._settle_script(script, stream, ids, group))


def _settle_call(
    script: str,
    stream: str,
    shard: int,
    ids: list[str],
    entries: Sequence[OutboxEntry],
    wall_us: int,
    namespace: str,
) -> SettleScript:
    """The ``acknowledge``/``confirm`` call for entries of one stream (of that shard)."""
    fields: dict[str, list[str]] = {}
    for entry in entries:
        for state in entry.states:
            fields.setdefault(state, []).append(entry.field)
    keys = [stream]
    args = [_keys.channel(shard, namespace), GROUP, str(wall_us), str(len(ids)), *ids]
    for state, names in fields.items():
        keys += (state, _keys.acked_key(state))
        args += ("-1", str(len(names)), *names)
    return SettleScript(script=script, keys=tuple(keys), args=tuple(args))


def nothing_done(action: DeliveryEffect) -> DeliveryAnswer:
    """The outcome a closing instance reports for an action it could not run (Redis failed while
    it closed): nothing happened, so the work stays queued in Redis for another instance. Whatever
    was held is taken again by a live instance; no heartbeat counts as alive; nothing is taken."""
    if isinstance(action, ReadOutbox | ClaimStale):
        return OutboxRead([])
    if isinstance(action, SurveyConsumers):
        return ConsumersListed([])
    if isinstance(action, CheckHeartbeats):
        return HeartbeatsChecked([b"1"] * len(action.keys))  # take nothing from anyone
    if isinstance(action, Reclaim):
        return Reclaimed(action.stream, '{"e":[],"d":[]}')
    if isinstance(action, TakeRequest):
        return BudgetAnswered(0)
    if isinstance(action, SettleScript | SettleScripts):
        return Settled(None)
    if isinstance(action, PostAndSettle) and action.read is not None:
        return PostedAlongside(BatchFailed("the instance closed", maybe_sent=True), OutboxRead([]))
    if isinstance(action, PostBatch | PostAndSettle):
        return BatchFailed("the instance closed", maybe_sent=True)
    return Done()


def with_known_revs(action: SettleScript, known: Callable[[str], int]) -> SettleScript:
    """The same call, telling the script which revision this instance holds of each identity,
    so that its reply updates this instance's copies at once (``known`` gives -1 for none)."""
    args = list(action.args)
    pos = 4 + int(args[3])
    for state in action.keys[1::2]:
        args[pos] = str(known(state))
        pos += 2 + int(args[pos + 1])
    return attrs.evolve(action, args=tuple(args))


def _event(item: bytes) -> dict[str, Any]:
    """The event of an entry, for ``on_dropped``; the raw text if it does not parse."""
    try:
        event = json.loads(item)
    except (ValueError, RecursionError):
        event = None
    return event if isinstance(event, dict) else {"unreadable": item.decode(errors="replace")}


def _by_stream(pairs: Sequence[tuple[str, str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for stream, entry_id in pairs:
        out.setdefault(stream, []).append(entry_id)
    return out


_BODY_OVERHEAD = len(b'{"events":[]}')
_UNSEEN = ""  # not a stream's name: a stream not decoded yet in this read


def _body(entries: Sequence[OutboxEntry]) -> bytes:
    return b'{"events":[' + b",".join(e.item for e in entries) + b"]}"


def _field(fields: Mapping[Any, Any], name: bytes) -> bytes | None:
    """One field of an entry as bytes, whether the client decodes replies or not."""
    value = fields.get(name)
    if value is None:
        value = fields.get(name.decode())
    if isinstance(value, str):
        return value.encode()
    return value if isinstance(value, bytes) else None


@functools.lru_cache(maxsize=4096)  # one list per customer and configuration: a few, repeated
def _states(text: bytes) -> tuple[str, ...] | None:
    try:
        state_list = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: absurdly nested JSON
        return None
    if not isinstance(state_list, list) or not all(isinstance(s, str) for s in state_list):
        return None
    return tuple(state_list)


def _entry(
    stream_s: str | None, id_s: str | None, fields: Mapping[Any, Any], streams: dict[str, int]
) -> OutboxEntry | None:
    """An outbox entry (its stream and id decoded), or ``None`` when it is unreadable. The event
    is kept as the bytes track() stored, to be joined into bodies as they are: it is not parsed
    here (the cost of delivery was mostly that), only checked to be one JSON object's text; one
    that is not valid JSON inside gets a 400 or 422 from Polar, which bisection narrows down to
    it."""
    if stream_s not in streams or id_s is None:
        return None
    item, field, states = fields.get(b"e"), fields.get(b"f"), fields.get(b"k")
    if type(item) is not bytes or type(field) is not bytes or type(states) is not bytes:
        item, field, states = _field(fields, b"e"), _field(fields, b"f"), _field(fields, b"k")
    if item is None or field is None or states is None:
        return None
    field_s, state_keys = text_of(field), _states(states)
    if field_s is None or state_keys is None:
        return None
    if not (item.startswith(b"{") and item.endswith(b"}")):
        return None
    # tuple.__new__ straight: the NamedTuple's own __new__ is one more Python call, a read makes
    # thousands.
    return _new_tuple(OutboxEntry, (stream_s, id_s, item, field_s, state_keys))


_new_tuple = tuple.__new__


def _details(body: bytes) -> list[Any]:
    """The ``detail`` list of an error body; empty if there is none."""
    try:
        detail = json.loads(body).get("detail")
    except (ValueError, RecursionError, AttributeError):
        return []
    return detail if isinstance(detail, list) else []


def _only_early(body: bytes) -> bool:
    """Whether every error of a 422 is a timestamp Polar finds in its future (its clock is
    behind ours: retrying soon succeeds, dropping would lose billable events)."""
    detail = _details(body)
    return bool(detail) and all(
        isinstance(item, dict)
        and isinstance(item.get("loc"), list)
        and item["loc"][-1:] == ["timestamp"]
        and "must be in the past" in str(item.get("msg", ""))
        for item in detail
    )


def _bad_indexes(body: bytes, size: int) -> set[int]:
    """The events a 422 points at (``loc = ["body", "events", i, ...]``); empty if unclear."""
    detail = _details(body)
    if not detail:
        return set()
    bad: set[int] = set()
    for item in detail:
        loc = item.get("loc") if isinstance(item, dict) else None
        if (
            not isinstance(loc, list)
            or len(loc) < 3
            or loc[:2] != ["body", "events"]
            or not isinstance(loc[2], int)
            or isinstance(loc[2], bool)
            or not 0 <= loc[2] < size
        ):
            return set()
        bad.add(loc[2])
    return bad


def retry_after(header: str | None, wall_us: int) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP date."""
    if header is None:
        return None
    text = header.strip()
    if text.isascii() and text.isdigit():
        return min(float(text), RETRY_AFTER_CAP)
    try:
        moment = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if moment.tzinfo is None:
        return None
    waited: float = moment.timestamp() - wall_us / 1e6
    return min(max(0.0, waited), RETRY_AFTER_CAP)


_DELAYS = (
    "linger",
    "backoff_base",
    "backoff_cap",
    "stall_delay",
    "claim_idle",
    "claim_interval",
    "read_block",
    "flush_block",
)
"""The settings that are seconds: finite and not negative, each."""

"""The Outpost state machine: everything the drivers do not need sockets for.

Theory of operation
-------------------
The session holds Polar's configuration (which reducers exist, which meters they serve) and an
in-memory copy (a :class:`Mirror`) of each identity hash this instance reads. It never does I/O.

* ``track()`` validates an event, matches it against the reducers and returns the
  :class:`RunScript` that reduces it into Redis and queues it for delivery. The driver runs it and
  hands the reply back (:class:`ScriptReplied`); the reply updates the copies at once, so a read
  on this instance sees the event as soon as ``track()`` returns.
* Every script publishes its changes on its shard's channel; the driver hands each message back
  (:class:`ChangePublished`) and every instance's copies follow in revision order. A gap, a
  restarted subscription or a failed load makes the copy reload (:class:`LoadIdentity`).
* This instance's own changes come back over the channel too (their echoes), already applied
  from their replies. The driver asks :meth:`Session.own_echo` of each message, without the lock,
  and drops an echo unparsed. An echo may come before its reply: while scripts the driver
  announced (:meth:`Session.script_sent`) are in flight, a change nobody expects is held; each
  reply (or failure) with its ticket first applies the held changes no script still in flight can
  have published, then itself, dropping its own echo if it came (``_echoes``).
* ``read()`` answers from the copies alone. ``cached_balance()`` is the warm path: one dict lookup.

Inputs go through :meth:`Session.handle`; the requests the core makes of the driver accumulate
in an outbox the driver drains with :meth:`Session.effects`, then runs, then reports back.
Peer misbehaviour (garbage in Redis, a malformed message) is never raised: it is counted in
:attr:`Session.rejections` and reported. The session never logs: what its driver should log it
queues as :class:`Report` lines, which the driver drains with :meth:`Session.reports`. Caller
mistakes raise at once.
"""

from __future__ import annotations

import collections
import json
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from . import _keys
from ._aggregate import format_number
from ._backoff import backoff
from ._balance import Balance, compute_balance, hold_expiry, merged_state
from ._changes import Change, MalformedChange, parse_changes
from ._configuration import Configuration, Reducer, parse_configuration
from ._deadlines import Deadlines
from ._echoes import Echoes
from ._effects import Effect, Fetch, LoadIdentity, RunScript, StoreConfiguration
from ._event import build_event, check_event_id, customer_of
from ._filters import InvalidDefinition
from ._following import Following, Pacer
from ._inputs import (
    BytesReceived,
    ChangePublished,
    ChannelsLost,
    ChannelSubscribed,
    Closing,
    ConfigurationReceived,
    ConnectionFailed,
    ConnectionOpened,
    IdentityLoaded,
    Input,
    ListFailed,
    LoadFailed,
    PendingListed,
    ScriptFailed,
    ScriptReplied,
    SubscriberLost,
    SubscriberRestarted,
    SubscriptionConfirmed,
    Tick,
)
from ._keys import Customer
from ._link import Link, LinkState
from ._mirror import IdentityState, Mirror, Offer, derive_state, unreadable_fields
from ._observations import Observation
from ._outage import Outage, Report
from ._peer import peer_json, printable
from ._random import Random
from ._remote import Remote
from ._replies import text_of
from ._reports import Reports, error_text
from ._shards import checked as checked_shards
from ._status import Status
from ._telemetry import ReadKey
from ._time import HOUR_US, floor_bucket, iso
from ._track_plans import TrackPlan, TrackPlans, item, key_of
from .errors import InvalidEvent, NotReady, UnknownMeter, UnsupportedMeter, UsageError

_IGNORED, _GAP = Offer.IGNORED, Offer.GAP
_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _check_timestamp(timestamp_us: int, now_us: int) -> None:
    if timestamp_us > now_us:
        raise InvalidEvent("timestamp is in the future; Polar refuses such events")
    if timestamp_us < 0:
        # A negative bucket makes events-hash fields ("-3:id") the Lua scripts cannot parse.
        raise InvalidEvent("timestamp is before 1970; outpost cannot bucket such events")


MAX_VALUE = 1e300
"""The largest magnitude track() accepts for a value a reducer counts: Lua sums a bucket's values
in doubles, and a few values near 1e308 overflow to inf, which no reader accepts."""


@attrs.frozen(kw_only=True)
class Settings:
    snapshot_timeout: float = 5.0
    """Seconds a first read waits for its snapshot before :class:`NotReady`."""
    pending_limit_us: int = HOUR_US
    """How long an acknowledged event no snapshot counts stays pending: one hour, as far
    back as Polar looks for ``cold_until`` (docs/design.md)."""
    reload_retry: float = 0.5
    """Seconds before a failed load is tried again; doubled (with jitter) for each further
    failure in a row, up to ``reload_cap``."""
    reload_cap: float = 5.0
    load_timeout: float = 10.0
    """Seconds a load may go unanswered before it is asked again (its reply was lost)."""
    channel_namespace: str = ""
    """Appended to the change channels (``dbN`` for Redis database N > 0)."""
    max_customers: int = 16_000
    """The most customers the process follows (a copy, cached balances, a snapshot flow each:
    4.8 to 5.4 KB measured by ``python -m bench --only following``, so under 90 MB at the
    default); beyond it, the least recently read is let go (and Polar told to ``forget`` it)."""
    idle_customer_ttl: float = 900.0
    """Seconds without a read after which a customer is let go."""
    recent_window: float = 60.0
    """After a reconnect or a restarted subscription, the customers read within this many
    seconds reload (or ask Polar again) at once, paced; the others on their next read."""
    reload_rate: float = 200.0
    """The pace of those reloads and requests: at most this many a second, per kind."""
    refresh_after: float | None = 600.0
    """Seconds after a snapshot is applied by which Polar has normally pushed the next one:
    if by then this instance still holds acknowledged events of the customer that no snapshot
    counted, it asks Polar for one (Polar pushes when its data moves, not when its
    ``cold_until`` passes a bucket it had already counted). ``None``: never ask."""
    shards: int = _keys.DEFAULT_SHARDS
    """The deployment's shard count (``_shards``): which shard, so which keys and channel, each
    customer has."""

    def __attrs_post_init__(self) -> None:
        if not (math.isfinite(self.snapshot_timeout) and self.snapshot_timeout >= 0):
            raise UsageError("snapshot_timeout must be a finite number of seconds, not negative")
        for name in ("reload_retry", "reload_cap", "load_timeout"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise UsageError(f"{name} must be a positive, finite number of seconds")
        if self.pending_limit_us <= 0:
            raise UsageError("pending_limit_us must be positive")
        if isinstance(self.max_customers, bool) or not isinstance(self.max_customers, int):
            raise UsageError("max_customers must be an integer")
        if self.max_customers < 1:
            raise UsageError("max_customers must be at least 1")
        for name in ("idle_customer_ttl", "recent_window", "reload_rate"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise UsageError(f"{name} must be a positive, finite number")
        refresh = self.refresh_after
        if refresh is not None and not (math.isfinite(refresh) and refresh > 0):
            raise UsageError("refresh_after must be a positive, finite number of seconds, or None")
        checked_shards(self.shards)


class CachedBalance:
    """A computed balance, and how many warm reads it answered."""

    __slots__ = ("balance", "hits")

    def __init__(self, balance: Balance) -> None:
        self.balance = balance
        self.hits = 0


"""(meter id, external customer id, customer id): a read's key."""


def warm_customer(external_customer_id: object, customer_id: object) -> object:
    """The customer part of a read, as :attr:`Session.warm` keys it: the external customer id
    of a read that names only that (the common case), else both ids."""
    return external_customer_id if customer_id is None else (external_customer_id, customer_id)


class Session:
    """One Outpost instance's state machine: Polar's configuration, the copies of the identities
    it reads, and (with an access token) Polar's side, the WebSocket and its snapshot flows.

    The driver calls :meth:`track` and :meth:`read` for its caller, hands every input to
    :meth:`handle`, runs what :meth:`effects` drains and reports each answer back as an input,
    and wakes it with a :class:`Tick` by :meth:`next_deadline`. Not thread-safe: the driver holds
    one lock around every call.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        link: Link | None = None,
        rng: Random | None = None,
    ) -> None:
        """``link`` is the WebSocket to Polar; without one (no access token) the session reads
        whatever snapshots other instances apply to the shared Redis. ``rng`` jitters retries
        (default: the link's generator; without either, no jitter)."""
        self.settings = settings or Settings()
        self._rng: Random = rng or (link.rng if link is not None else _NoJitter())
        self.remote = Remote(_PortForRemote(self), link, self._rng) if link is not None else None
        self._link_dropped = False
        self._reports = Reports()
        self._polar_outage = Outage("the WebSocket", peer="Polar")
        self.configuration: Configuration | None = None
        self._configuration_text: str | None = None
        self._configuration_from_polar = False
        self._mirrors: dict[str, Mirror] = {}
        self._plans = TrackPlans()
        """What track() built for names and customers it saw, per configuration."""
        self._customer_mirrors: dict[Customer, list[Mirror]] = {}
        """Each customer's copies, one per reducer read (an alias change invalidates them)."""
        self._balances: dict[ReadKey, CachedBalance] = {}
        """The balances computed since their last change, by read (meter id, external customer
        id, customer id)."""
        self._warm: dict[object, dict[str, CachedBalance]] = {}
        self.warm: Mapping[object, Mapping[str, CachedBalance]] = self._warm
        """The same balances by customer (:func:`warm_customer`), then meter id:
        :meth:`cached_balance` without the call, for a driver's hottest path (it adds one to
        ``hits`` of the balance it returns). Two lookups of keys whose hashes Python caches are
        cheaper than hashing a new tuple on every read. Always the same mapping."""
        self._warm_reads: collections.Counter[ReadKey] | None = None
        """Warm reads of balances no longer cached, once :meth:`count_warm_reads` was called."""
        self._effects: list[Effect] = []
        self._observations: list[Observation] = []
        self._retry_at: Deadlines[str] = Deadlines()
        """State key → when to ask for its load again (failed, or unanswered for too long)."""
        self._following = Following()
        """The customers followed (each has copies here and a flow in ``remote``)."""
        self._warm_seen: dict[Customer, int] = {}
        """Warm reads of a customer's cached balances when last looked at: warm reads bypass
        :meth:`read`, so a customer they keep busy is told by its hits, not its last read."""
        self._let_go: collections.OrderedDict[Customer, tuple[Customer, ...]] = (
            collections.OrderedDict()
        )
        """Customers let go (with a link), and their aliases then: read again, they answer from
        Redis at once (this process knows their other names), at most ``max_customers``."""
        self._reloads: collections.deque[str] = collections.deque()
        """State keys to reload at the reload pace (recently read, after a restart)."""
        self._reload_pace = Pacer(self.settings.reload_rate)
        self._load_failures: collections.Counter[str] = collections.Counter()
        self._now = 0.0
        self.wall_us = 0
        """The wall clock (µs) of the latest :class:`Tick`: what reads count holds against."""
        self._hold_due: dict[str, int] = {}
        """State key → when the first hold a cached balance of it counts expires (wall µs):
        the balance is stale from then on."""
        self.subscribed = False
        """Whether Redis confirmed the subscription to every shard channel and it holds."""
        self._live_shards: set[int] = set()
        """The shards whose channel subscription Redis confirmed and that has not broken since:
        their copies may follow Redis."""
        self.shards = self.settings.shards
        """The deployment's shard count, as the keys each customer has depend on it."""
        self._shard_of_channel = _keys.shard_of_channel(
            self.settings.channel_namespace, self.shards
        )
        self.ever_subscribed = False
        self.rejections: collections.Counter[str] = collections.Counter()
        self._echoes = Echoes()
        """This instance's scripts in flight, the changes held meanwhile, the echoes expected."""
        self.script_sent: Callable[[], int] = self._echoes.sent
        """A script of this instance that writes customers' state (track, an admission) is on
        its way: its ticket, for the :class:`ScriptReplied` or :class:`ScriptFailed` that ends it
        (every ticket must end: until then, changes nobody expects wait). Meanwhile a change
        published that nobody expects is held, as it may be this script's echo come before its
        reply. Tickets count from 0, so a replayed trace gets the same ones. (The bookkeeping's
        own method: ``track()`` takes one on its hot path.)"""
        self.own_echo: Callable[[object], bool] = self._echoes.seen
        """Whether ``data`` (a message from a shard channel, as it came) is the echo of this
        instance's own change, already applied from its reply: forgotten if so. The one question
        a driver asks without the lock (one atomic delete), before it parses anything. Not an
        input: it changes nothing the session answers, so a trace leaves it out."""

    def drop_link(self) -> None:
        """Run without the WebSocket from now on (the public-API mode: Polar serves no
        ``/v1/outpost/``): reads wait for a state hash anchored by the driver instead."""
        if self.remote is not None:
            self.remote.close()
            self.remote = None
            self._link_dropped = True

    # -- driver plumbing ----------------------------------------------------------------------

    def handle(self, event: Input) -> None:
        """Take one input. Then drain :meth:`effects` and run them."""
        try:
            remote = self.remote
            if isinstance(event, ScriptReplied):
                if event.ticket is None:
                    self._echoes.expect(event.reply)
                    self._changes(event.reply)
                else:
                    # What was held for it came before its reply, so goes first; the echo it
                    # holds is its own, dropped unparsed.
                    held = self._echoes.replied(event.ticket, event.reply)
                    if held:
                        self._release(held)
                    if event.reply is not None:  # None: it wrote nothing
                        self._changes(event.reply)
                if event.tag is not None and remote is not None:
                    remote.applied(event.tag)
            elif isinstance(event, ChangePublished):
                # Released (held once) or not held now: applied.
                if type(event) is _Released or not self._echoes.hold(event.data):
                    self._changes(event.data)
            elif isinstance(event, BytesReceived | ConnectionOpened | ConnectionFailed):
                if remote is None:
                    if self._link_dropped:
                        return  # the link loop's last bytes, after the public mode took over
                    raise UsageError(f"{type(event).__name__} but this session has no link")
                if isinstance(event, BytesReceived):
                    refused, connections = remote.link.refused, remote.link.connections
                    remote.received(event.data, event.now)
                    if remote.link.refused is not None and remote.link.refused != refused:
                        # A refused token is the merchant's to fix: say it loudly, once per cause
                        # (the refusal is one sentence that names its cause). A 404 is Polar
                        # serving only its public API: the driver's mode="auto" takes it.
                        public = remote.link.refused_status == 404
                        level = logging.INFO if public else logging.ERROR
                        self._reports.add(level, f"outpost: {remote.link.refused}")
                    if remote.link.connections > connections:
                        self._reports.relay(self._polar_outage.succeeded(event.now))
                elif isinstance(event, ConnectionOpened):
                    remote.opened(event.now)
                else:
                    remote.failed(event.now, event.reason)
                    # Polar unreachable: one WARNING, a reminder a minute, one INFO when it is
                    # back (the reconnection's backoff is the link's; this only decides the log).
                    # The reason may quote a peer (a proxy's answer): one printable line.
                    why = printable(event.reason, _DETAIL_LIMIT)
                    self._reports.relay(self._polar_outage.failed(event.now, why, 0.0)[1])
            elif isinstance(event, ScriptFailed):
                if event.ticket is not None:
                    self._release(self._echoes.replied(event.ticket, None))
                if event.tag is not None and remote is not None:
                    remote.apply_failed(event.tag)
            elif isinstance(event, PendingListed | ListFailed):
                if remote is not None:
                    if isinstance(event, PendingListed):
                        remote.listed(event.tag, event.fields)
                    else:
                        remote.list_failed(event.tag)
            elif isinstance(event, IdentityLoaded):
                self._loaded(event.key, event.fields, event.load_id)
            elif isinstance(event, LoadFailed):
                self._load_failed(event.key, event.load_id)
            elif isinstance(event, SubscriptionConfirmed):
                # Redis confirms a subscription to N channels one channel at a time (1, 2, ... N).
                # A first confirmation while subscribed is a client library re-subscribing by itself
                # after a break: what was published meanwhile is lost.
                if event.count == 1 and self.subscribed:
                    self._subscription_lost()
                if event.count == self.shards:
                    self._subscription_restarted()
            elif isinstance(event, SubscriberRestarted):
                self._subscription_restarted()
            elif isinstance(event, SubscriberLost):
                self._subscription_lost()
            elif isinstance(event, ChannelSubscribed):
                self._shards_confirmed(self._shards_of((event.channel,)))
            elif isinstance(event, ChannelsLost):
                self._shards_lost(self._shards_of(event.channels))
            elif isinstance(event, ConfigurationReceived):
                self._configure(event.payload, event.from_cache)
            elif isinstance(event, Closing):
                if remote is not None:
                    remote.close()
            elif isinstance(event, Tick):
                self._tick(event.now, event.wall_us)
            else:
                raise UsageError(f"not an input: {event!r}")
        except UsageError:
            raise
        except Exception as exc:
            if not isinstance(event, _PEER_INPUTS):
                raise
            # The last resort: what a peer sent (Redis, Polar, another instance) is dropped and
            # counted, never raised into the caller's request or the driver's worker.
            self._reject("peer", f"{type(event).__name__} dropped: {exc!r}"[:300])
            # Known peer garbage is rejected by name before it gets here: reaching this is a bug
            # of ours, and where it was raised is what finds it (at debug: the warning says it).
            self._reports.add(
                logging.DEBUG, f"outpost: the dropped input's error: {error_text(exc)}"
            )

    @property
    def holding(self) -> bool:
        """Whether a change published now would be held (scripts of this instance are in
        flight), not applied."""
        return self._echoes.holding

    def _release(self, held: list[object]) -> None:
        """Apply changes held while scripts were in flight, in the order they came: each as an
        input of its own, so a bad one is dropped alone."""
        for data in held:
            self.handle(_Released(data))

    def _subscription_restarted(self) -> None:
        self._shards_confirmed(set(range(self.shards)))

    def _subscription_lost(self) -> None:
        self._shards_lost(set(range(self.shards)))

    def _shards_confirmed(self, shards: set[int]) -> None:
        """Messages of these shards may have been missed until now: their copies stop answering
        from memory (a read goes to Redis, and starts the copy's reload); the copies of customers
        read within ``recent_window`` reload at once, at the reload pace, most recent first. The
        other shards' copies are left alone."""
        self._live_shards |= shards
        if len(self._live_shards) == self.shards:
            self.subscribed = self.ever_subscribed = True
        for mirror in self._mirrors.values():
            if self.shard_of(mirror.customer) in shards:
                self._invalidate(mirror)
                if mirror.loaded:
                    mirror.stop_following()
                else:  # a load asked before the confirmation must not make it follow
                    self._load(mirror)
        recent = self._following.recent(self._now - self.settings.recent_window)
        self._reloads.clear()
        for customer in recent:
            if self.shard_of(customer) in shards:
                self._reloads.extend(m.key for m in self._customer_mirrors[customer])
        self._pace_reloads()

    def _pace_reloads(self) -> None:
        """Reload what the pace allows of the queued copies that still need it."""
        granted = self._reload_pace.take(self._now, len(self._reloads))
        while granted and self._reloads:
            mirror = self._mirrors.get(self._reloads.popleft())
            if mirror is not None and self._stale(mirror):
                self._load(mirror)
                granted -= 1

    def _stale(self, mirror: Mirror) -> bool:
        """Whether a copy must reload to follow Redis again (and now can)."""
        live = self.shard_of(mirror.customer) in self._live_shards
        return mirror.loaded and not mirror.following and live

    def _shards_lost(self, shards: set[int]) -> None:
        # Keep the copies (reads go to Redis meanwhile); they reload once subscribed again.
        self._live_shards -= shards
        if shards:
            self.subscribed = False
        for mirror in self._mirrors.values():
            if self.shard_of(mirror.customer) in shards:
                mirror.stop_following()
                self._invalidate(mirror)

    def _shards_of(self, channels: tuple[object, ...]) -> set[int]:
        """The shards these channels belong to; a channel that is none of ours is rejected."""
        shards = set()
        for channel in channels:
            shard = self._shard_of_channel.get(text_of(channel) or "")
            if shard is None:
                self._reject("subscription", f"not one of the shard channels: {channel!r}")
            else:
                shards.add(shard)
        return shards

    def effects(self) -> list[Effect]:
        """Drain what the driver must do now, in order."""
        out, self._effects = self._effects, []
        return out

    def reports(self) -> list[Report]:
        """Drain what the driver must log, oldest first: at most the newest thousand lines, after
        one that counts those let go when nobody drained them in time."""
        return self._reports.drain()

    def observations(self) -> list[Observation]:
        """Drain what happened that telemetry may record (no action needed)."""
        out, self._observations = self._observations, []
        return out

    def next_deadline(self) -> float | None:
        """The earliest monotonic time at which a :class:`Tick` has work to do."""
        deadlines = []
        if (retry := self._retry_at.next()) is not None:
            deadlines.append(retry)
        if self._hold_due:
            deadlines.append(self._now + (min(self._hold_due.values()) - self.wall_us) / 1e6)
        if self.remote is not None and (remote := self.remote.next_deadline()) is not None:
            deadlines.append(remote)
        if (oldest := self._following.oldest()) is not None:
            deadlines.append(oldest[1] + self.settings.idle_customer_ttl)
        if self._reloads:
            deadlines.append(self._reload_pace.next_at(self._now))
        return min(deadlines, default=None)

    def status(
        self,
        *,
        redis_error: str | None,
        delivery_stalled: str | None,
        failed_loop: str | None = None,
    ) -> Status:
        """The instance's status: the WebSocket and the subscription as the core knows them;
        what the driver knows of Redis, delivery and its loops, as given."""
        websocket, websocket_error = self.link_status()
        return Status(
            websocket, websocket_error, self.subscribed, redis_error, delivery_stalled, failed_loop
        )

    def link_status(self) -> tuple[str, str | None]:
        """The WebSocket's state and the reason it last failed or was refused (``"none"``
        without an access token)."""
        if self.remote is None:
            return ("none", None)
        link = self.remote.link
        return (link.state.value, link.refused or link.last_error)

    @property
    def connected(self) -> bool:
        """Whether the WebSocket to Polar is open."""
        return self.remote is not None and self.remote.link.state is LinkState.OPEN

    # -- what Polar's side needs (see _remote.SessionHooks) ------------------------------------

    def emit(self, effect: Effect) -> None:
        self._effects.append(effect)

    def known_rev(self, state_key: str) -> int:
        mirror = self._mirrors.get(state_key)
        return mirror.rev if mirror is not None and mirror.loaded else -1

    def reject(self, kind: str, detail: str) -> None:
        self._reject(kind, detail)

    def _recently_read(self) -> list[Customer]:
        """The customers read within ``recent_window``, most recent first."""
        return list(self._following.recent(self._now - self.settings.recent_window))

    def _aliases_changed(self, customer: Customer, aliases: tuple[Customer, ...]) -> None:
        """Polar names other reference forms for ``customer``: its cached balances are stale,
        and every reducer read of it follows the aliases' copies too (loads start now, so the
        next read waits as little as it can)."""
        for mirror in self._customer_mirrors.get(customer, ()):
            self._invalidate(mirror)
            for alias in aliases:
                self._follow(alias, mirror.reducer_id)

    def _consumed(self, customer: Customer, reducer_id: str) -> dict[str, float]:
        """Per meter of the reducer: the consumption this instance reads now ({} if unknown)."""
        mirror = self._mirrors.get(_keys.state_key(customer, reducer_id, self.shards))
        reducer = self.configuration.reducers.get(reducer_id) if self.configuration else None
        if mirror is None or not mirror.loaded or reducer is None:
            return {}
        if not reducer.aggregation.bucketed():
            return {}
        state = mirror.state
        quantity = state.polar.merge(state.local).quantity(reducer.aggregation.func)
        return dict.fromkeys(reducer.meter_ids, quantity)

    def _unsettled(self, customer: Customer) -> tuple[int, int]:
        """The customer's events that no snapshot counted yet, as this instance's loaded copies
        read them: (delivered to Polar, not yet delivered)."""
        delivered = undelivered = 0
        for mirror in self._customer_mirrors.get(customer, ()):
            if mirror.loaded:
                state = mirror.state
                delivered += max(state.pending - state.undelivered, 0)
                undelivered += min(state.undelivered, state.pending)
        return delivered, undelivered

    @property
    def channel_namespace(self) -> str:
        return self.settings.channel_namespace

    def shard_of(self, customer: Customer) -> int:
        """The customer's shard in this deployment."""
        return _keys.shard_of(customer, self.shards)

    # -- configuration ------------------------------------------------------------------------

    def _configure(self, payload: object, from_cache: bool) -> None:
        try:
            if isinstance(payload, str | bytes):  # the cached text, as Redis holds it
                payload = peer_json(payload)
            configuration = parse_configuration(payload)
            text = _JSON.encode(payload)
        except (InvalidDefinition, TypeError, ValueError, RecursionError) as exc:
            self._reject("configuration", f"unusable configuration: {exc}")
            return
        for problem in configuration.problems:
            self._reject("configuration", problem)
        if text == self._configuration_text:
            self._configuration_from_polar |= not from_cache  # Polar confirmed the cached one
            return
        if from_cache and self._configuration_from_polar:
            return  # what Polar sent this instance beats what any instance cached
        self.configuration = configuration
        self._configuration_text = text
        self._configuration_from_polar = not from_cache
        for key in list(self._balances):
            self._uncache(key)
        if not from_cache:
            self._effects.append(StoreConfiguration(key=_keys.CONFIGURATION_KEY, text=text))

    # -- writes -------------------------------------------------------------------------------

    def track(
        self,
        *,
        name: object,
        external_customer_id: object = None,
        customer_id: object = None,
        metadata: object = None,
        timestamp_us: int,
        now_us: int,
        event_id: str,
    ) -> RunScript:
        """Validate an event and return the script that tracks it.

        Raises :class:`InvalidEvent` for input Polar would refuse, :class:`NotReady` when no
        configuration has arrived yet. The driver runs the script, then hands the reply to
        :meth:`handle` as :class:`ScriptReplied`.
        """
        plan_key = None if metadata is not None else key_of(name, external_customer_id, customer_id)
        if plan_key is not None and self.configuration is not None:
            plan = self._plans.get(plan_key, self.configuration)
            if plan is not None:
                return self._planned(plan, timestamp_us, now_us, event_id)
        customer = customer_of(external_customer_id, customer_id)
        _check_timestamp(timestamp_us, now_us)
        event = build_event(
            event_id=event_id,
            name=name,
            customer=customer,
            metadata=metadata,
            timestamp_us=timestamp_us,
        )
        if self.configuration is None:
            raise NotReady("no configuration from Polar yet: cannot tell which meters count it")
        bucket = floor_bucket(timestamp_us)
        shard = self.shard_of(customer)
        keys = [_keys.outbox_key(shard)]
        values: list[str] = []
        states: list[str] = []
        meter_ids: list[str] = []
        reducers = self.configuration.reducers
        for reducer_id, value in self.configuration.contributions(event.view()):
            if abs(value) > MAX_VALUE:
                raise InvalidEvent(
                    f"{reducer_id} counts a value of {value!r}; outpost refuses values beyond "
                    f"±{MAX_VALUE:g} (a bucket's sum of them would overflow)"
                )
            meter_ids += reducers[reducer_id].meter_ids
            state = _keys.state_key(customer, reducer_id, self.shards)
            mirror = self._mirrors.get(state)
            known = mirror.rev if mirror is not None and mirror.loaded else -1
            keys += (state, _keys.bucket_key(state, bucket))
            values += (str(known), format_number(value))
            states.append(state)
        channel = _keys.channel(shard, self.settings.channel_namespace)
        states_json = _JSON.encode(states)
        args = (
            channel,
            f"{bucket}:{event_id}",
            str(bucket),
            _JSON.encode(event.ingest_item()),
            states_json,
            *values,
        )
        if plan_key is not None:
            head = _JSON.encode({"name": event.name, **customer.wire()})[:-1]
            plan = TrackPlan(
                outbox=keys[0],
                channel=channel,
                states=tuple(states),
                values=tuple(values[1::2]),
                meter_ids=tuple(meter_ids),
                item_head=f'{head},"external_id":',
                states_json=states_json,
            )
            self._plans.keep(plan_key, plan)
        return RunScript(
            script="track",
            keys=tuple(keys),
            args=args,
            meter_ids=tuple(meter_ids),
            buckets=len(states),
        )

    def _planned(self, plan: TrackPlan, timestamp_us: int, now_us: int, event_id: str) -> RunScript:
        """``track()`` for a name and customer with a plan: only the event's id, its time and
        the revisions held are new (the same checks, the same call as without the plan)."""
        _check_timestamp(timestamp_us, now_us)
        check_event_id(event_id)
        bucket = floor_bucket(timestamp_us)
        if bucket != plan.bucket:
            plan.at(bucket)
        values: list[str] = []
        mirrors = self._mirrors
        for state, value in plan.pairs:
            mirror = mirrors.get(state)
            values += (str(mirror.rev) if mirror is not None and mirror.loaded else "-1", value)
        bucket_text = plan.bucket_text
        args = (
            plan.channel,
            f"{bucket_text}:{event_id}",
            bucket_text,
            item(plan, event_id, iso(timestamp_us)),
            plan.states_json,
            *values,
        )
        return RunScript("track", plan.keys, args, None, plan.meter_ids, plan.buckets)

    # -- reads --------------------------------------------------------------------------------

    def cached_balance(
        self, meter_id: str, external_customer_id: str | None, customer_id: str | None
    ) -> Balance | None:
        """The warm path: a balance computed since the last change, or ``None``. Counted: a warm
        read is too quick to time, so telemetry reports how many there were
        (:meth:`warm_reads`)."""
        cached = self._warm.get(warm_customer(external_customer_id, customer_id), {}).get(meter_id)
        if cached is None:
            return None
        cached.hits += 1  # racing threads may lose one: a count for telemetry, nothing more
        return cached.balance

    def count_warm_reads(self) -> None:
        """Count warm reads from now on, for :meth:`warm_reads`."""
        if self._warm_reads is None:
            self._warm_reads = collections.Counter()
            for cached in self._balances.values():
                cached.hits = 0

    def warm_reads(self) -> dict[ReadKey, int]:
        """The warm reads since the last call, per read (meter id, external customer id,
        customer id); empty unless :meth:`count_warm_reads` was called."""
        if self._warm_reads is None:
            return {}
        counts, self._warm_reads = self._warm_reads, collections.Counter()
        for key, cached in list(self._balances.items()):
            hits, cached.hits = cached.hits, 0
            if hits:
                counts[key] += hits
        return dict(counts)

    def _cache(self, key: ReadKey, balance: Balance) -> None:
        self._uncache(key)  # a fresh read replaces it: keep its count
        cached = self._balances[key] = CachedBalance(balance)
        self._warm.setdefault(warm_customer(key[1], key[2]), {})[key[0]] = cached

    def _uncache(self, key: ReadKey) -> None:
        cached = self._balances.pop(key, None)
        if cached is None:
            return
        customer = warm_customer(key[1], key[2])
        by_meter = self._warm[customer]
        del by_meter[key[0]]
        if not by_meter:
            del self._warm[customer]
        if cached.hits and self._warm_reads is not None:
            self._warm_reads[key] += cached.hits

    def read(
        self,
        meter_id: str,
        external_customer_id: str | None = None,
        customer_id: str | None = None,
        *,
        fresh: bool = False,
    ) -> Balance | Fetch | None:
        """The balance from memory; a :class:`Fetch` when it must come from Redis instead; or
        ``None`` while the customer's state is not ready.

        ``None`` also starts what makes it ready (a load, a snapshot request); wait for a change
        and ask again. A copy answers from memory only while it follows Redis (see
        :mod:`._mirror`); otherwise, and always when ``fresh``, the answer is a :class:`Fetch`:
        the driver reads the hash and hands it to :meth:`read_fetched`. Before the subscription
        was ever confirmed, a read waits for it (``None``) rather than fetch, unless ``fresh``.
        Raises :class:`UnknownMeter`, :class:`UnsupportedMeter` or :class:`InvalidEvent` (a bad
        customer argument) at once.
        """
        if not isinstance(meter_id, str) or not meter_id:
            raise UsageError(f"meter_id must be a non-empty string, got {meter_id!r}")
        customer = customer_of(external_customer_id, customer_id)
        reducer = self._reducer(meter_id)
        if reducer is None:
            return None
        mirror = self._follow(customer, reducer.id)
        # The customer's other names: their pending events count too (docs/invariant.md).
        aliases = self._aliases_of(customer)
        # (Short-circuits keep the common case, no alias, as fast as before.)
        others = [self._follow(alias, reducer.id) for alias in aliases] if aliases else _NONE
        following = self._following
        following.touch(customer)
        for alias in aliases:
            following.touch(alias)
        if len(following) > self.settings.max_customers:
            self._let_go_beyond(self.settings.max_customers, keep=(customer, *aliases))
        if not mirror.loaded or (others and not all(m.loaded for m in others)):
            self._waiting(customer)
            return None
        if mirror.state.cold_until is None:
            if self.remote is not None:
                self.remote.lost(customer)  # e.g. its keys expired: ask Polar again
            self._waiting(customer)
            return None
        if self.remote is not None:
            flow = self.remote.follow(customer)
            # A customer read again after this process let it go answers from Redis at once:
            # the process kept its other names (docs/invariant.md); a fresh snapshot is asked.
            if not flow.applied and not flow.rejoined:
                self._waiting(customer)
                return None
        if fresh or not mirror.following or (others and not all(m.following for m in others)):
            if not fresh and not self.ever_subscribed:
                self._waiting(customer)  # a first read waits for the subscription
                return None
            for m in (mirror, *others):
                if self._stale(m):  # its restarted shard missed changes: follow Redis again
                    self._load(m)
            following.reading(customer, self.settings.load_timeout)
            return Fetch(keys=(mirror.key, *(m.key for m in others)))
        following.answered(customer)
        state = mirror.state
        if others:
            state = merged_state(state, [m.state for m in others])
            for m in others:  # a change of any of them makes the balance stale
                m.read_keys.add((meter_id, external_customer_id, customer_id))
        now_us = self.wall_us
        balance = compute_balance(
            meter_id, customer, reducer.aggregation.func, state, aliases, now_us=now_us
        )
        key = (meter_id, external_customer_id, customer_id)
        if state.holds and (expiry := hold_expiry(state, now_us)) is not None:
            for m in (mirror, *others):  # a change of the balance without a change of Redis
                self._hold_due[m.key] = min(expiry, self._hold_due.get(m.key, expiry))
        self._cache(key, balance)
        mirror.read_keys.add(key)
        return balance

    def _waiting(self, customer: Customer) -> None:
        """The read waits for its customer's state: not let go meanwhile."""
        self._following.reading(customer, self.settings.snapshot_timeout + 1.0)

    def read_fetched(
        self,
        meter_id: str,
        external_customer_id: str | None,
        customer_id: str | None,
        fields: Mapping[str, Mapping[Any, Any]],
    ) -> Balance | None:
        """The balance from the hashes a :class:`Fetch` read (``source="redis"``): ``fields``
        maps each of its keys to that hash's fields. ``None`` when the customer's hash holds no
        snapshot (it expired or was wiped: Polar is asked again), or when the customer's aliases
        changed since the :class:`Fetch` (a hash is missing: read again). Each copy takes its
        hash too when it is newer."""
        customer = customer_of(external_customer_id, customer_id)
        reducer = self._reducer(meter_id, waiting=False)
        assert reducer is not None  # read() returned a Fetch, so the configuration is there
        aliases = self._aliases_of(customer)
        keys = [_keys.state_key(c, reducer.id, self.shards) for c in (customer, *aliases)]
        if keys[0] not in fields:
            raise UsageError(f"read_fetched needs the fields of {keys[0]}")
        if not all(key in fields for key in keys):
            return None
        states = [self._fetched_state(key, fields[key]) for key in keys]
        if states[0].cold_until is None:
            if self.remote is not None:
                self.remote.lost(customer)
            return None
        state = merged_state(states[0], states[1:])
        func = reducer.aggregation.func
        return compute_balance(
            meter_id, customer, func, state, aliases, source="redis", now_us=self.wall_us
        )

    def not_ready_reason(
        self, meter_id: str, external_customer_id: str | None, customer_id: str | None
    ) -> str:
        """Why :meth:`read` returns ``None``, for the :class:`NotReady` message.

        Raises :class:`UnknownMeter` when the meter is still missing from the configuration."""
        state, error = self.link_status()
        if error and self._reducer(meter_id) is None and self.configuration is not None:
            # Only the cache is here, without the meter, and Polar's cannot come: the meter may
            # well exist, and what stands in the way is the WebSocket's error (a refused token).
            return (
                f"meter {meter_id!r} is not in the configuration cached in Redis and Polar's "
                f"has not arrived (WebSocket {state}: {error})"
            )
        reducer = self._reducer(meter_id, waiting=False)
        if reducer is None:
            return self.unconfigured_reason()
        customer = customer_of(external_customer_id, customer_id)
        for name in (customer, *self._aliases_of(customer)):
            mirror = self._mirrors.get(_keys.state_key(name, reducer.id, self.shards))
            if mirror is None or not mirror.loaded:
                alias = "" if name == customer else f" (another name of {customer})"
                return f"the local state of {name}{alias} could not be loaded from Redis"
        mirror = self._mirrors[_keys.state_key(customer, reducer.id, self.shards)]
        has_snapshot = mirror.state.cold_until is not None
        applied = self.remote is None or self.remote.follow(customer).applied
        if has_snapshot and applied and not self.ever_subscribed:
            return "Redis has not confirmed the subscription to the change channels yet"
        if self.remote is None:
            return f"no snapshot for {customer} in Redis yet (this instance has no access token)"
        link = self.remote.link
        status = link.state.value
        if link.state is not LinkState.OPEN and link.last_error:
            status += f": {link.last_error}"
        return f"no snapshot from Polar for {customer} yet (WebSocket {status})"

    def unconfigured_reason(self) -> str:
        """Why a ``track()`` cannot tell yet which meters count an event (no configuration)."""
        state, error = self.link_status()
        return f"no configuration from Polar yet (WebSocket {state}{_suffix(error)})"

    def _reducer(self, meter_id: str, *, waiting: bool = True) -> Reducer | None:
        if self.configuration is None:
            return None
        reducer = self.configuration.reducer_for(meter_id)
        if reducer is None:
            if waiting and self.remote is not None and not self._configuration_from_polar:
                return None  # the cached configuration may predate the meter: wait for Polar's
            raise UnknownMeter(f"meter {meter_id!r} is not in Polar's configuration")
        if not reducer.aggregation.bucketed():
            raise UnsupportedMeter(
                f"meter {meter_id!r} aggregates with {reducer.aggregation.func!r}, which cannot "
                "be reduced into buckets; read it from Polar's API instead"
            )
        return reducer

    def _follow(self, customer: Customer, reducer_id: str) -> Mirror:
        key = _keys.state_key(customer, reducer_id, self.shards)
        mirror = self._mirrors.get(key)
        if mirror is None:
            mirror = self._mirrors[key] = Mirror(key, customer, reducer_id)
            mirrors = self._customer_mirrors.setdefault(customer, [])
            mirrors.append(mirror)
            self._load(mirror)
            if len(mirrors) == 1:
                self._start_following(customer)
        return mirror

    def _start_following(self, customer: Customer) -> None:
        self._following.add(customer, self._now)
        if self.remote is not None:
            aliases = self._let_go.pop(customer, None)
            if aliases:
                self.remote.aliases[customer] = aliases
            self.remote.follow(customer).rejoined = aliases is not None

    def _let_go_beyond(self, limit: int, keep: tuple[Customer, ...] = ()) -> None:
        """Let go of the least recently read customers until at most ``limit`` are followed,
        and of those not read for ``idle_customer_ttl``. A customer whose read waits for its
        answer is kept, and one whose cached balances were read since last looked at counts as
        read now (warm reads do not pass through :meth:`read`)."""
        following, now = self._following, self._now
        idle_before = now - self.settings.idle_customer_ttl
        for _ in range(len(following)):  # each customer moves back at most once
            oldest = following.oldest()
            assert oldest is not None  # (at most one customer let go per turn)
            customer, last = oldest
            if len(following) <= limit and last > idle_before:
                return
            hits = self._warm_hits(customer)
            busy = customer in keep or following.pinned(customer, now)
            if busy or hits != self._warm_seen.get(customer, 0):
                self._warm_seen[customer] = hits
                following.touch(customer)
                following.stamp(now)  # (the touched ones all date from now: order holds)
                continue
            self._let_go_of(customer)

    def _warm_hits(self, customer: Customer) -> int:
        hits = 0
        for mirror in self._customer_mirrors[customer]:
            for key in mirror.read_keys:
                cached = self._balances.get(key)
                hits += cached.hits if cached is not None else 0
        return hits

    def _let_go_of(self, customer: Customer) -> None:
        """Drop the customer's copies, cached balances and flow; tell Polar to forget it. The
        shard channels stay: other customers share them."""
        self._reports.add(logging.DEBUG, f"outpost lets go of {customer}")
        for mirror in self._customer_mirrors.pop(customer):
            self._invalidate(mirror)
            del self._mirrors[mirror.key]
            self._retry_at.cancel(mirror.key)
            self._load_failures.pop(mirror.key, None)
        self._following.drop(customer)
        self._warm_seen.pop(customer, None)
        if self.remote is not None:
            self._let_go[customer] = self.remote.forget(customer)
            if len(self._let_go) > self.settings.max_customers:
                self._let_go.popitem(last=False)

    def _aliases_of(self, customer: Customer) -> tuple[Customer, ...]:
        """The customer's other names Polar told this instance (none without a link)."""
        return () if self.remote is None else self.remote.aliases.get(customer, ())

    @property
    def followed(self) -> list[Mirror]:
        """The identities this instance keeps a copy of (for inspection)."""
        return list(self._mirrors.values())

    # -- keeping copies current ---------------------------------------------------------------

    def _load(self, mirror: Mirror) -> None:
        load_id = mirror.start_load(follows=self.shard_of(mirror.customer) in self._live_shards)
        self._reports.add(
            logging.DEBUG, f"outpost loads {mirror.key} (copy at revision {mirror.rev})"
        )
        # Asked again if no answer comes (a driver task cancelled mid-load loses it).
        self._retry_at.set(mirror.key, self._now + self.settings.load_timeout)
        self._effects.append(LoadIdentity(key=mirror.key, load_id=load_id))

    def _load_failed(self, key: str, load_id: int) -> None:
        mirror = self._mirrors.get(key)
        if mirror is None or load_id != mirror.load_id:
            return
        self._load_failures[key] += 1
        self._load_failed_later(key)

    def _load_failed_later(self, key: str) -> None:
        """Ask for the load again after the backoff its failures in a row call for."""
        s = self.settings
        delay = backoff(self._load_failures[key], s.reload_retry, s.reload_cap, self._rng.random())
        self._retry_at.set(key, self._now + delay)

    def _text_fields(self, key: str, fields: Mapping[object, object]) -> dict[str, str]:
        try:  # the common case, a hash of UTF-8 bytes, in one pass without a call per item
            return {name.decode(): value.decode() for name, value in fields.items()}  # type: ignore[attr-defined]
        except (AttributeError, UnicodeDecodeError):
            pass  # text already (decode_responses), or not UTF-8: item by item
        text: dict[str, str] = {}
        for name, value in fields.items():
            name_s, value_s = text_of(name), text_of(value)
            if name_s is None or value_s is None:
                self._reject("state", f"{key}: field that is not UTF-8 text")
                continue
            text[name_s] = value_s
        return text

    def _fetched_state(self, key: str, raw: Mapping[object, object]) -> IdentityState:
        """The state of a hash a fresh read fetched; a copy takes it too when it is newer."""
        mirror = self._mirrors.get(key)
        if mirror is not None and mirror.fetched is not None and mirror.fetched[0] == raw:
            state = mirror.fetched[1]  # the very bytes of the last fetch: the same state
            if not _newer_for(mirror, state):
                return state
        text = self._text_fields(key, raw)
        state = derive_state(text)
        if mirror is not None:
            if _newer_for(mirror, state):
                self._offer_full(mirror, state.revision, text)
            # A copy: the caller's mapping may change. Kept with a field refused too: the same
            # bytes fetched again are counted once, not at every fresh read (a log flood).
            mirror.fetched = (dict(raw), state)
        return state

    def _offer_full(self, mirror: Mirror, rev: int, text: Mapping[str, str]) -> None:
        """A newer hash than the loaded copy's: the copy takes it."""
        mirror.offer(Change(key=mirror.key, rev=rev, set=tuple(text.items()), full=True))
        self._invalidate(mirror)

    def _changes(self, raw: object) -> None:
        try:
            changes = parse_changes(raw, self._mirrors.__contains__)
        except MalformedChange as exc:
            self._reject("change", f"unreadable change from Redis: {exc}")
            return
        if not changes:  # a duplicate track, or none of the keys followed
            return
        mirrors = self._mirrors
        for change in changes:  # only those of followed keys
            mirror = mirrors[change.key]
            if change.set and (unreadable := unreadable_fields(change.set)):
                self._refuse_change(mirror, change, unreadable)
                continue
            outcome = mirror.offer(change)
            if outcome is not _IGNORED and mirror.read_keys:
                # Applied, or waiting behind a load: either way the cached balance is stale.
                self._invalidate(mirror)
            if outcome is _GAP:
                self._load(mirror)

    def _refuse_change(self, mirror: Mirror, change: Change, unreadable: tuple[str, ...]) -> None:
        """A change holding a value the scripts never write: a peer published it, or the hash
        holds it. Either way the hash decides: the copy reloads it when the change is newer (a
        load counts what the hash holds), rather than take what a read could not use."""
        fields = ", ".join(unreadable)
        detail = f"{change.key} at revision {change.rev}: unreadable field {fields}"
        self._reject("change", f"unreadable change from Redis: {detail}")
        if change.rev > mirror.rev:
            self._load(mirror)
            self._invalidate(mirror)

    def _loaded(self, key: str, fields: Mapping[object, object], load_id: int) -> None:
        mirror = self._mirrors.get(key)
        if mirror is None:
            return
        if load_id != mirror.load_id:
            ignored = f"outpost ignores load {load_id} of {key} (load {mirror.load_id} is newer)"
            self._reports.add(logging.DEBUG, ignored)
            return
        text = self._text_fields(key, fields)
        self._reports.add(logging.DEBUG, f"outpost loaded {key} at revision {text.get('rev')}")
        self._retry_at.cancel(key)
        complete = mirror.loaded_with(text, load_id)
        if complete is False:
            # A gap the load did not close (a held change of an incarnation of the hash that is
            # gone, say): load again at once the first time, then back off, not spin on Redis.
            self._load_failures[key] += 1
            if self._load_failures[key] == 1:
                self._load(mirror)
            else:
                self._load_failed_later(key)
        else:
            self._load_failures.pop(key, None)
        for problem in mirror.state.problems:
            self._reject("state", f"{key}: unreadable field {problem}")
        self._invalidate(mirror)

    def _invalidate(self, mirror: Mirror) -> None:
        for key in mirror.read_keys:
            self._uncache(key)
        mirror.read_keys.clear()

    def _tick(self, now: float, wall_us: int) -> None:
        self._now = now
        self._following.stamp(now)
        self.wall_us = wall_us
        for key, expires in list(self._hold_due.items()):
            if expires <= wall_us:  # a hold expired: the balances that counted it are stale
                del self._hold_due[key]
                if (mirror := self._mirrors.get(key)) is not None:  # not let go meanwhile
                    self._invalidate(mirror)
        if self.remote is not None:
            self.remote.wall_us = wall_us
            self.remote.tick(now)
        for key in self._retry_at.pop_due(now):
            self._load(self._mirrors[key])  # (an answered load or a let-go copy cancels it)
        if self._reloads:
            self._pace_reloads()
        self._let_go_beyond(self.settings.max_customers)

    def _reject(self, kind: str, detail: str) -> None:
        self.rejections[kind] += 1
        detail = printable(detail, _DETAIL_LIMIT)
        self._reports.add(logging.WARNING, f"outpost rejected {kind}: {detail}")


class _PortForRemote:
    """What Polar's side of a session may do to it and ask of it (``SessionHooks``), and no
    more: the session's other public methods are its driver's."""

    __slots__ = ("_session",)

    def __init__(self, session: Session) -> None:
        self._session = session

    def emit(self, effect: Effect) -> None:
        self._session.emit(effect)

    def configure(self, payload: object) -> None:
        self._session._configure(payload, from_cache=False)

    def known_rev(self, state_key: str) -> int:
        return self._session.known_rev(state_key)

    def reject(self, kind: str, detail: str) -> None:
        self._session.reject(kind, detail)

    def observe(self, observation: Observation) -> None:
        self._session._observations.append(observation)

    def consumed(self, customer: Customer, reducer_id: str) -> dict[str, float]:
        return self._session._consumed(customer, reducer_id)

    def aliases_changed(self, customer: Customer, aliases: tuple[Customer, ...]) -> None:
        self._session._aliases_changed(customer, aliases)

    def unsettled(self, customer: Customer) -> tuple[int, int]:
        return self._session._unsettled(customer)

    @property
    def refresh_after(self) -> float | None:
        return self._session.settings.refresh_after

    def recently_read(self) -> list[Customer]:
        return self._session._recently_read()

    @property
    def reload_rate(self) -> float:
        return self._session.settings.reload_rate

    @property
    def pending_limit_us(self) -> int:
        return self._session.settings.pending_limit_us

    @property
    def channel_namespace(self) -> str:
        return self._session.settings.channel_namespace

    @property
    def shards(self) -> int:
        return self._session.shards

    def shard_of(self, customer: Customer) -> int:
        return self._session.shard_of(customer)


def _suffix(error: str | None) -> str:
    return f": {error}" if error else ""


_DETAIL_LIMIT = 300
"""What a rejection's log line keeps of its detail (a peer's garbage can be megabytes)."""

_PEER_INPUTS = (
    ScriptReplied,
    ChangePublished,
    BytesReceived,
    PendingListed,
    IdentityLoaded,
    ConfigurationReceived,
    ChannelSubscribed,
    ChannelsLost,
)
"""Inputs that carry what a peer wrote: an error while taking one drops it (counted)."""

_NONE: list[Mirror] = []
"""No alias copies (never mutated: the common case builds no list)."""


@attrs.frozen(slots=True)
class _Released(ChangePublished):
    """A change held while scripts of this instance were in flight, released by a reply or a
    failure: applied, never held again (the session's own, never an input a driver gives)."""


class _NoJitter:
    """The draw of a session with neither a generator nor a link: the middle of the range."""

    def random(self) -> float:
        return 0.5


def _newer_for(mirror: Mirror, state: IdentityState) -> bool:
    """Whether a fetched state would move a loaded copy forward (an offer of the copy's own
    revision or an older one changes nothing)."""
    return mirror.loaded and state.revision > max(mirror.rev, 0)

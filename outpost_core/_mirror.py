"""The in-memory copy of one identity's state hash, kept in revision order.

A change whose revision is the next one applies in place; an older one is ignored; a full state
replaces the copy when it is newer; anything else is a gap, and the copy reloads the hash.
Changes that arrive while a load is in flight wait for it, then apply in order.

Loads are numbered: only the answer to the latest one counts. An older load may have read the
hash before changes the copy has since taken (or before the hash existed at all), and installing
it would move the copy back in time.

A copy is *following* Redis when the load that installed it was asked while the shard's
subscription was confirmed, and the subscription has not broken since: every change after that
load reaches it. Only a following copy may answer a read from memory.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping

import attrs

from ._aggregate import EMPTY, Aggregate, parse_number, readable
from ._changes import Change, revision_of
from ._keys import Customer
from ._peer import decimal_int
from ._time import MAX_US


class Offer(enum.Enum):
    APPLIED = "applied"  #: the copy moved to the change's revision
    IGNORED = "ignored"  #: the copy already had it
    HELD = "held"  #: a load is in flight; the change waits for it
    GAP = "gap"  #: a revision is missing; the copy must reload


@attrs.frozen(slots=True)
class IdentityState:
    """What a read needs, derived from the state hash."""

    revision: int
    cold_until: int | None
    as_of: int | None
    snapshot_id: str | None
    polar: Aggregate
    local: Aggregate
    credits: Mapping[str, float]
    pending: int
    undelivered: int
    problems: tuple[str, ...]
    holds: tuple[tuple[float, int], ...] = ()
    """The open reservations' holds: (units, expires at µs), expired ones included (a read
    counts those whose expiry is after its clock)."""


class Mirror:
    __slots__ = (
        "_state",
        "customer",
        "fetched",
        "fields",
        "following",
        "held",
        "key",
        "load_follows",
        "load_id",
        "load_rev",
        "loaded",
        "read_keys",
        "reducer_id",
        "rev",
    )

    def __init__(self, key: str, customer: Customer, reducer_id: str) -> None:
        self.key = key
        self.customer = customer
        self.reducer_id = reducer_id
        self.rev = -1
        self.fields: dict[str, str] = {}
        self.loaded = False
        self.load_id = 0
        """The latest load asked for; answers to older ones are ignored."""
        self.load_follows = False
        """Whether the latest load was asked while the shard's subscription was confirmed."""
        self.load_rev = -1
        """The copy's revision when the latest load was asked."""
        self.following = False
        self.held: list[Change] = []
        self._state: IdentityState | None = None
        self.read_keys: set[tuple[str, str | None, str | None]] = set()
        """The warm-path keys whose cached balance this copy answers (callers' spellings)."""
        self.fetched: tuple[Mapping[object, object], IdentityState] | None = None
        """The hash a fresh read last fetched, as Redis sent it, and what it derived: the same
        bytes fetched again derive the same state (a fresh read of a hash that did not change
        since the last one costs a comparison, not a parse)."""

    def offer(self, change: Change) -> Offer:
        if change.set is None:
            # The script sent no content: the caller did not follow this identity (or it was
            # loading) when the script ran. A newer revision than the copy's means the copy is
            # behind something this instance wrote: reload rather than serve it without it.
            if self.loaded and change.rev > self.rev:
                self.unload()
                return Offer.GAP
            return Offer.IGNORED
        if not self.loaded:
            self.held.append(change)
            return Offer.HELD
        if change.full:
            if change.rev <= self.rev:  # the same revision is the same content: nothing new
                return Offer.IGNORED
            self.fields = dict(change.set)
            self.rev = change.rev
            self._state = None
            return Offer.APPLIED
        if change.rev <= self.rev:
            return Offer.IGNORED
        if change.rev != self.rev + 1:
            self.unload()
            self.held.append(change)
            return Offer.GAP
        self.fields.update(change.set)
        for name in change.deleted:
            self.fields.pop(name, None)
        self.rev = change.rev
        self._state = None
        return Offer.APPLIED

    def unload(self) -> None:
        """Forget the copy's currency: it reloads, and changes wait for the load."""
        self.loaded = False

    def start_load(self, follows: bool) -> int:
        """A load is asked for (the copy waits for it); return its number."""
        self.unload()
        self.load_id += 1
        self.load_follows = follows
        self.load_rev = self.rev
        return self.load_id

    def stop_following(self) -> None:
        """The subscription broke: changes may be missed from now on."""
        self.following = self.load_follows = False

    def loaded_with(self, fields: Mapping[str, str], load_id: int) -> bool | None:
        """Install the hash that load ``load_id`` read, then the held changes; ``False`` when a
        gap remains (load again), ``None`` when the load is not the latest (ignored)."""
        if load_id != self.load_id:
            return None
        rev = revision_of(fields.get("rev")) or 0
        held, self.held = sorted(self.held, key=lambda c: c.rev), []
        # A load older than the copy is a second answer to the latest load, come after changes
        # the copy has taken since: the copy is consistent up to its revision, so keep it (the
        # held changes follow). A hash older than the copy was when the load was asked has gone
        # back in time: Redis lost writes (a fail-over, a restart without persistence, a wipe),
        # and the copy must follow Redis there.
        if rev >= self.rev or rev < self.load_rev:
            self.fields = dict(fields)
            self.rev = rev
            self._state = None
        self.loaded = True
        self.following = self.load_follows
        for change in held:
            if self.offer(change) is Offer.GAP:
                self.held.extend(c for c in held if c.rev > change.rev)
                return False
        return True

    @property
    def state(self) -> IdentityState:
        if self._state is None:
            self._state = derive_state(self.fields, self.rev)
        return self._state


_int = decimal_int
_TIMES = ("cu", "sa")


def derive_state(fields: Mapping[str, str], rev: int | None = None) -> IdentityState:
    """What a read needs from a state hash (``rev`` defaults to the hash's own)."""
    if rev is None:
        rev = revision_of(fields.get("rev")) or 0
    problems: list[str] = []
    local = EMPTY
    credits: dict[str, float] = {}
    holds: list[tuple[float, int]] = []
    polar = EMPTY
    for name, text in fields.items():
        if name.startswith("h:"):
            hold = parse_hold(text)
            if hold is None:
                problems.append(f"{name}={text!r}")
            else:
                holds.append(hold)
        elif name.startswith("a:"):
            agg = Aggregate.decode(text)
            if agg is None or _int(name[2:]) is None:
                problems.append(f"{name}={text!r}")
            else:
                local = local.merge(agg)
        elif name.startswith("c:"):
            units = parse_number(text)
            if units is None:
                problems.append(f"{name}={text!r}")
            else:
                credits[name[2:]] = units
    if "p" in fields:
        parsed = Aggregate.decode(fields["p"])
        if parsed is None:
            problems.append(f"p={fields['p']!r}")
        else:
            polar = parsed
    counters: dict[str, int] = {}
    for name in _COUNTERS:
        value = _counter(name, fields.get(name))
        if name in fields and value is None:
            problems.append(f"{name}={fields[name]!r}")
        counters[name] = value if value is not None else -1
    return IdentityState(
        revision=rev,
        cold_until=counters["cu"] if counters["cu"] >= 0 else None,
        as_of=counters["sa"] if counters["sa"] >= 0 else None,
        snapshot_id=fields.get("sid"),
        polar=polar,
        local=local,
        credits=credits,
        pending=max(counters["n"], 0),
        undelivered=max(counters["u"], 0),
        problems=tuple(problems),
        holds=tuple(holds),
    )


def unreadable_fields(pairs: Iterable[tuple[str, str]]) -> tuple[str, ...]:
    """The fields of a change that a read could not use, named and ordered as
    :func:`derive_state` has them in ``problems``: each field checked on its own, without the
    state a read builds (every change a copy takes passes here, its instance's own tracks too)."""
    fields = dict(pairs)
    problems = [f"{name}={text!r}" for name, text in fields.items() if not _usable(name, text)]
    if len(problems) > 1:  # derive_state: h:, a:, c: as they come, then p, then the counters
        problems.sort(key=lambda problem: _ORDER.get(problem.partition("=")[0], -1))
    return tuple(problems)


_ORDER = {"p": 0, "rev": 1, "cu": 2, "sa": 3, "n": 4, "u": 5}  # derive_state's order


def _usable(name: str, text: str) -> bool:
    kind = name[:2]
    if kind == "a:":
        return readable(text) and _int(name[2:]) is not None
    if kind == "h:":
        return parse_hold(text) is not None
    if kind == "c:":
        return parse_number(text) is not None
    if name == "p":
        return readable(text)
    if name in _COUNTERS:
        return _counter(name, text) is not None
    return True


_COUNTERS = ("rev", "cu", "sa", "n", "u")


def _counter(name: str, text: str | None) -> int | None:
    """One of the state hash's integers, as the scripts write it; ``None`` for anything else."""
    if name == "rev":
        return revision_of(text)
    value = _int(text)
    if name in _TIMES and value is not None and not 0 <= value <= MAX_US:
        return None  # the scripts write no such time (no datetime holds it): a peer's garbage
    return value


def parse_hold(text: str) -> tuple[float, int] | None:
    """A hold's field value as the scripts write it, ``"<units> <expires at µs>"``."""
    units, _, expires = text.partition(" ")
    value, at = parse_number(units), _int(expires)
    if value is None or at is None or value < 0:
        return None
    return (value, at)

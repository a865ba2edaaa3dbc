"""Exact admission: reservations (holds) and conditional tracks (docs/admission.md).

A read followed by a ``track()`` admits as many requests as read the balance at the same moment.
Admission is decided inside one script on the customer's shard instead, against what Redis holds
for every instance: the available balance is ``credited - consumed - held``, over every name of
the customer (as reads merge Polar's aliases). A reservation holds units in the customer's state
hash (a field ``h:<hold id>`` = ``"<units> <expires at µs>"``), so a hold travels to every
instance's copy on the change channel, as a tracked event does; it expires at its time (the
scripts compare it with the caller's clock, and prune it lazily) so a crashed process never
strands units. Holds never reach Polar.

Functions here build the scripts' calls from a :class:`~outpost_core.Session`'s configuration and
copies; the driver runs them, hands a refusal to :func:`refusal_of` and everything else to the
session as :class:`~outpost_core.ScriptReplied`.
"""

from __future__ import annotations

import json
import math

import attrs

from . import _keys
from ._aggregate import format_number, parse_number
from ._configuration import Reducer
from ._effects import RunScript
from ._event import customer_of
from ._keys import Customer
from ._replies import text_of
from ._session import Session
from .errors import CannotAdmit, InsufficientBalance, UnknownMeter, UnsupportedMeter, UsageError

ADMITTED = ("count", "sum")
"""Aggregations whose consumption adds up, so that holding units of them means something."""


@attrs.frozen(slots=True)
class Hold:
    """One open reservation: where its field is, and what it holds."""

    meter_id: str
    customer: Customer
    state_key: str
    field: str
    units: float
    expires_us: int


@attrs.frozen(slots=True)
class Refusal:
    """A script's answer that the available balance did not cover the request."""

    meter_id: str
    balance: float
    held: float

    def error(self, units: float) -> InsufficientBalance:
        return InsufficientBalance(self.meter_id, units, self.balance, self.held)


def refusal_of(reply: object) -> Refusal | None:
    """The refusal a reserve or admit script answered, or ``None`` for any other reply (a change,
    a duplicate: the session reads those)."""
    text = text_of(reply) if isinstance(reply, bytes | str) else None
    if text is None or not text.startswith('{"no":'):
        return None
    try:
        meter_id, balance, held = json.loads(text)["no"]
    except (ValueError, TypeError):
        return None
    balance_v = parse_number(balance) if isinstance(balance, str) else None
    held_v = parse_number(held) if isinstance(held, str) else None
    if not isinstance(meter_id, str) or balance_v is None or held_v is None:
        return None
    return Refusal(meter_id, balance_v, held_v)


def admission_reducer(session: Session, meter_id: str) -> Reducer:
    """The reducer of a meter that takes reservations; raises when it does not."""
    configuration = session.configuration
    reducer = None if configuration is None else configuration.reducer_for(meter_id)
    if reducer is None:
        raise UnknownMeter(f"meter {meter_id!r} is not in Polar's configuration")
    check_admitted(meter_id, reducer)
    return reducer


def check_admitted(meter_id: str, reducer: Reducer) -> None:
    func = reducer.aggregation.func
    if func not in ADMITTED:
        raise UnsupportedMeter(
            f"meter {meter_id!r} aggregates with {func!r}: holding units of it means nothing "
            "(only count and sum meters, whose consumption adds up, admit exactly)"
        )


def _names(session: Session, customer: Customer, one_slot: bool) -> tuple[Customer, ...]:
    """The customer's other names, which admission counts; on one slot only (Redis Cluster),
    refused when one lives elsewhere."""
    aliases = () if session.remote is None else session.remote.aliases.get(customer, ())
    if one_slot and any(session.shard_of(alias) != session.shard_of(customer) for alias in aliases):
        raise CannotAdmit(
            f"{customer} has other names ({', '.join(map(str, aliases))}) in other Redis Cluster "
            "slots: one script cannot count them all, and a partial view would admit too much"
        )
    return aliases


def ready(
    session: Session, meter_id: str, external_customer_id: object, customer_id: object
) -> bool:
    """Whether the customer's copies are loaded and hold Polar's applied snapshot, and its other
    names are known, as a first read waits for: then an admission script reads the whole picture
    in Redis. Cheaper than a read (no balance computed): admission asks it every time, the driver
    reads (and waits) only when it is not."""
    configuration = session.configuration
    reducer = None if configuration is None else configuration.reducer_for(meter_id)
    if reducer is None:
        return False
    customer = customer_of(external_customer_id, customer_id)
    own = session._mirrors.get(_keys.state_key(customer, reducer.id, session.shards))
    if own is None or not own.loaded or "cu" not in own.fields:
        return False
    remote = session.remote
    if remote is not None and not remote.follow(customer).applied:
        return False
    for alias in () if remote is None else remote.aliases.get(customer, ()):
        mirror = session._mirrors.get(_keys.state_key(alias, reducer.id, session.shards))
        if mirror is None or not mirror.loaded:
            return False
    return True


def check_request(units: object, ttl: object) -> None:
    """Raise :class:`UsageError` for units or a ttl a reservation cannot take."""
    _units(units)
    _ttl_us(ttl)


def _units(units: object) -> float:
    if isinstance(units, bool) or not isinstance(units, int | float):
        raise UsageError(f"units must be a number, got {units!r}")
    if not (math.isfinite(units) and units > 0):
        raise UsageError(f"units must be a positive, finite number, got {units!r}")
    return float(units)


def _ttl_us(ttl: object) -> int:
    if isinstance(ttl, bool) or not isinstance(ttl, int | float):
        raise UsageError(f"ttl must be a number of seconds, got {ttl!r}")
    if not (math.isfinite(ttl) and ttl > 0):
        raise UsageError(f"ttl must be a positive, finite number of seconds, got {ttl!r}")
    return max(1, round(ttl * 1_000_000))


def reserve(
    session: Session,
    meter_id: str,
    units: object,
    external_customer_id: object,
    customer_id: object,
    *,
    ttl: object,
    now_us: int,
    hold_id: str,
    one_slot: bool = False,
) -> tuple[RunScript, Hold]:
    """The script that holds ``units`` of the meter for the customer, and the hold it writes.

    Raises :class:`UsageError` (bad units or ttl), :class:`UnknownMeter`,
    :class:`UnsupportedMeter`, :class:`CannotAdmit` at once."""
    value, ttl_us = _units(units), _ttl_us(ttl)
    customer = customer_of(external_customer_id, customer_id)
    reducer = admission_reducer(session, meter_id)
    aliases = _names(session, customer, one_slot)
    state = _keys.state_key(customer, reducer.id, session.shards)
    hold = Hold(meter_id, customer, state, f"h:{hold_id}", value, now_us + ttl_us)
    run = RunScript(
        script="reserve",
        keys=(state, *(_keys.state_key(alias, reducer.id, session.shards) for alias in aliases)),
        args=(
            _keys.channel(session.shard_of(customer), session.channel_namespace),
            str(now_us),
            hold.field,
            format_number(value),
            str(hold.expires_us),
            reducer.aggregation.func,
            f"c:{meter_id}",
            str(session.known_rev(state)),
        ),
        meter_ids=(meter_id,),
    )
    return run, hold


def release(session: Session, hold: Hold, now_us: int) -> RunScript:
    """The script that frees a hold (and prunes its hash's expired holds)."""
    return RunScript(
        script="release",
        keys=(hold.state_key,),
        args=(
            _keys.channel(session.shard_of(hold.customer), session.channel_namespace),
            str(now_us),
            hold.field,
            str(session.known_rev(hold.state_key)),
        ),
        meter_ids=(hold.meter_id,),
    )


def admit(
    session: Session,
    track: RunScript,
    customer: Customer,
    *,
    now_us: int,
    require_balance: bool = False,
    hold: Hold | None = None,
    one_slot: bool = False,
) -> tuple[RunScript, dict[str, float]]:
    """``track`` (what :meth:`Session.track` returned for the customer's event) as the admit
    script: with ``require_balance``, written only if every meter it counts in covers it; with
    ``hold``, releasing that hold in the same script (a reservation's commit).

    Raises :class:`UnsupportedMeter` when ``require_balance`` and the event counts in a meter
    that cannot admit, :class:`CannotAdmit` as :func:`reserve`. Also returns what the event asks
    of each meter it is checked against (its value; 1 for a count), for the refusal's message."""
    assert session.configuration is not None  # track() raised NotReady otherwise
    reducers = session.configuration.reducers
    by_key: dict[str, str] = {}
    if require_balance:  # which reducer each identity is (a commit needs no check: not built)
        prefix = _keys.customer_prefix(customer, session.shards) + ":"
        by_key = {prefix + _keys.encode_component(rid): rid for rid in reducers}
    outbox, *pairs = track.keys
    states = pairs[0::2]
    aliases = _names(session, customer, one_slot) if require_balance else ()
    extra: list[str] = []

    def index_of(key: str) -> int:
        """The 1-based index of ``key``, a state hash none of the identities', among the
        script's KEYS (each is another name's, or the hold's: never the same twice)."""
        extra.append(key)
        return 1 + len(pairs) + len(extra)

    identities: list[str] = []
    asks: dict[str, float] = {}
    for i, state in enumerate(states):
        known, value = track.args[5 + 2 * i], track.args[6 + 2 * i]
        if not require_balance:
            identities += (known, value, "", "0", "0")
            continue
        reducer = reducers[by_key[state]]
        for meter_id in reducer.meter_ids:
            check_admitted(meter_id, reducer)
        names = [
            str(index_of(_keys.state_key(alias, reducer.id, session.shards))) for alias in aliases
        ]
        credits = [f"c:{meter_id}" for meter_id in reducer.meter_ids]
        ask = 1.0 if reducer.aggregation.func == "count" else float(value)
        asks.update(dict.fromkeys(reducer.meter_ids, ask))
        identities += (known, value, reducer.aggregation.func, str(len(credits)), *credits)
        identities += (str(len(names)), *names)
    hold_args = ("", "0", "-1")
    if hold is not None:
        at = 2 + 2 * states.index(hold.state_key) if hold.state_key in states else None
        at = at if at is not None else index_of(hold.state_key)
        hold_args = (hold.field, str(at), str(session.known_rev(hold.state_key)))
    run = RunScript(
        script="admit",
        keys=(outbox, *pairs, *extra),
        args=(*track.args[:5], str(now_us), str(len(states)), *hold_args, *identities),
        meter_ids=track.meter_ids,
        buckets=track.buckets,
    )
    return run, asks

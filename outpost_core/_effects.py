"""What the core asks its driver to do. Imperative names; the driver executes each and reports
the outcome back as an input (see ``_inputs.py``)."""

from __future__ import annotations

import attrs


@attrs.frozen(slots=True)
class RunScript:
    """Run one of the scripts of ``lua/`` (by name) with EVALSHA; report its reply."""

    script: str
    keys: tuple[str, ...]
    args: tuple[str, ...]
    tag: int | None = None
    """Echoed in :class:`ScriptReplied` / :class:`ScriptFailed` when the core needs to know."""
    meter_ids: tuple[str, ...] = ()
    """The meters the write counts in (telemetry names them)."""
    buckets: int = 0
    """The buckets the write reduces into, one per identity (telemetry counts them)."""


@attrs.frozen(slots=True)
class LoadIdentity:
    """``HGETALL key``; report :class:`IdentityLoaded` or :class:`LoadFailed` with the same
    ``load_id`` (a reply to an older load of the key is ignored: it may have read the hash
    before changes the copy already has)."""

    key: str
    load_id: int


@attrs.frozen(slots=True)
class Fetch:
    """What :meth:`Session.read` answers when the balance must come from Redis: ``HGETALL`` of
    each key now (one round trip), then :meth:`Session.read_fetched` with the fields per key
    (not an effect: the caller runs it). The first key is the customer's own state; the others
    are its aliases' (docs/invariant.md, "One customer, two names")."""

    keys: tuple[str, ...]


@attrs.frozen(slots=True)
class StoreConfiguration:
    """``SET`` the configuration cache key to ``text`` (Polar's configuration payload, JSON)."""

    key: str
    text: str


@attrs.frozen(slots=True)
class ListPending:
    """``HKEYS`` each hash (state hashes, then the events hashes of their cold buckets), in one
    round trip; report :class:`PendingListed` (or :class:`ListFailed`)."""

    tag: int
    keys: tuple[str, ...]


@attrs.frozen(slots=True)
class OpenConnection:
    """Open a TCP connection (TLS when ``tls``) to Polar's WebSocket host, giving up after
    ``timeout`` seconds; report :class:`ConnectionOpened` or :class:`ConnectionFailed`."""

    host: str
    port: int
    tls: bool
    timeout: float = 10.0


@attrs.frozen(slots=True)
class SendBytes:
    """Write ``data`` to the WebSocket connection (drop it if there is none any more)."""

    data: bytes


@attrs.frozen(slots=True)
class CloseConnection:
    """Close the WebSocket connection's socket; no report is needed."""


Effect = (
    RunScript
    | LoadIdentity
    | StoreConfiguration
    | ListPending
    | OpenConnection
    | SendBytes
    | CloseConnection
)

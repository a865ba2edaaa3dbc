"""The deployment's shard count: chosen once, stored in Redis, the same for every instance.

Every key of a customer, its outbox stream and its channel carry its shard (``_keys``), so two
instances that count shards differently write one customer under two keys, and neither counts the
other's events. The count is therefore the deployment's, not the instance's: it lives in Redis
(:data:`~outpost_core._keys.SHARDS_KEY`), written once, by the first instance that starts on a
Redis holding none or by the operator (``outpost shards``). An instance checks it before its first
write and refuses to start on any other count.

A Redis holding outbox streams but no count was written by instances that could not choose one:
they used 16. The first instance there stores 16, whatever it was configured with, so that a new
instance configured for another count refuses to start beside them instead of splitting their
customers (docs/redis-layout.md says how to move a deployment to another count).
"""

from __future__ import annotations

from ._keys import DEFAULT_SHARDS, MAX_SHARDS, SHARDS_KEY
from ._peer import printable
from ._replies import text_of
from .errors import ConfigurationError

_SHOWN = 40  # characters of an unreadable stored value quoted in the refusal


def checked(count: object) -> int:
    """A shard count as configured: an integer from 1 to :data:`MAX_SHARDS`."""
    if isinstance(count, bool) or not isinstance(count, int):
        raise ConfigurationError(f"shards must be an integer, not {type(count).__name__}")
    if not 1 <= count <= MAX_SHARDS:
        raise ConfigurationError(f"shards must be from 1 to {MAX_SHARDS}, not {count}")
    return count


def parse(raw: object) -> int | None:
    """The count Redis stores (bytes or text of a decimal), or ``None`` when it is none."""
    text = text_of(raw)
    if text is None or not text.isascii() or not text.isdigit() or len(text) > 5:
        return None
    count = int(text)
    return count if 1 <= count <= MAX_SHARDS else None


def first_count(configured: int, *, legacy: bool) -> int:
    """What the first instance stores where Redis holds no count: its own, unless instances that
    could not choose one (``legacy``: their outbox streams are there) used the default."""
    return DEFAULT_SHARDS if legacy else configured


def disagreement(configured: int, raw: object) -> str | None:
    """Why an instance configured for ``configured`` shards must not start beside the stored
    count (``None``: they agree)."""
    stored = parse(raw)
    if stored == configured:
        return None
    if stored is None:
        shown = printable(text_of(raw) or repr(raw), _SHOWN)
        found = f"an unreadable shard count ({shown})"
    else:
        found = f"{stored} shards"
    return (
        f"this instance is configured for {configured} shards but the deployment's Redis holds "
        f"{found} at {SHARDS_KEY}: every instance of a deployment must use its shard count "
        "(`outpost shards` shows it; docs/redis-layout.md says how to change it)"
    )

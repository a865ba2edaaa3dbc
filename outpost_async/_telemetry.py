"""The telemetry worker: telemetry's slow work, off the paths that serve the application.

Starting the relay's exporters (the first imports OpenTelemetry's SDK: about 70 ms) and recording
each second what the hot paths buffered (about 8 µs a track: 28 ms for 3,500) run on a thread of
their own (this worker's in the sync driver, one of the loop's pool in the async one). Done by the
subscriber, they held up the changes it was to apply; in the async driver, every task.
"""

from __future__ import annotations

import time

from outpost_async._backend import run_blocking, sleep
from outpost_async._context import DriverContext
from outpost_core import Session

_TELEMETRY_TICK = 0.25  # seconds between two looks of the telemetry worker (it flushes each 1 s)


async def telemetry_forever(ctx: DriverContext) -> None:
    telemetry = ctx.telemetry
    while not ctx.closed:
        configuration = ctx.session.configuration
        organization = configuration.organization_id if configuration is not None else None
        if organization is not None and not telemetry.exporting:
            await run_blocking(telemetry.export_to_relay, organization)
        now = time.monotonic()
        if telemetry.due(now):
            with ctx.lock:
                warm = ctx.session.warm_reads()
            await run_blocking(telemetry.flush, now, *sync_counts(ctx.session), warm)
        await sleep(_TELEMETRY_TICK)


def sync_counts(session: Session) -> tuple[int, int]:
    """Snapshots received from Polar, and applied."""
    remote = session.remote
    if remote is None:
        return (0, 0)
    return (remote.snapshots_received, remote.snapshots_applied)

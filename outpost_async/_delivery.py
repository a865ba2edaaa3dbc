"""The delivery loops: each moves events from the outbox streams to Polar's ingestion API,
driving its sans-IO ``Delivery`` machine as the session is driven (the time and the answers in
through ``handle()``, what to do drained with ``effects()``: one effect a drain, a request whose
answer is the machine's next input). Also what ``flush()`` and ``close()`` ask of the outboxes.

``_DELIVERY_EFFECTS`` (at the end) is the dispatch table: each effect a delivery machine can ask
for, and the method that does it and returns what came of it.
"""

from __future__ import annotations

import contextlib
import functools
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from redis.exceptions import RedisError, ResponseError

from outpost_async._backend import Worker, alongside, call_back, sleep
from outpost_async._cluster import read_outboxes_one_by_one
from outpost_async._context import (
    POLL,
    DriverContext,
    failed_in_redis,
    log_report,
)
from outpost_async._effects import SessionEffects
from outpost_async._flushing import flush_outboxes
from outpost_async._ingest import open_ingestion, post_batch
from outpost_async._outbox import (
    beat,
    check_heartbeats,
    claim_stale,
    failed,
    forget_heartbeat,
    per_stream,
    raising,
    read_command,
    reclaim,
    refresh_claim,
    survey,
)
from outpost_async._scripts import read_then_scripts, run_script, run_scripts, take_request
from outpost_async._supervisor import Supervisor
from outpost_core import (
    GROUP,
    BackOff,
    Beat,
    CheckHeartbeats,
    ClaimStale,
    Delivery,
    DeliveryAnswer,
    DeliveryEffect,
    DeliverySettings,
    Done,
    Flushing,
    ForgetHeartbeat,
    GiveUp,
    OutboxRead,
    PostAndSettle,
    PostBatch,
    PostedAlongside,
    ReadOutbox,
    Reclaim,
    RecreateGroups,
    RefreshClaim,
    ReportDropped,
    Reported,
    Settled,
    SettleScript,
    SettleScripts,
    Sleep,
    StreamEntry,
    SurveyConsumers,
    TakeRequest,
    Tick,
    hand_back,
    lost_its_data,
    nothing_done,
    stream_entries,
    with_known_revs,
)

_T = TypeVar("_T")


class Deliveries:
    """What one instance does with its outboxes: its delivery loops (one per request it may
    have in flight), ``flush()``, and handing back what it holds at ``close()``."""

    def __init__(
        self, context: DriverContext, effects: SessionEffects, settings: DeliverySettings
    ) -> None:
        self._context = context
        self._effects = effects
        self._settings = settings
        self.machines: list[Delivery] = []

    def open_client(self) -> None:
        """Open the ingestion API's client (a proxy whose scheme needs a missing package fails
        here, before any loop starts)."""
        self._context.http = open_ingestion(self._context)

    def start(self, count: int, supervisor: Supervisor) -> list[Worker]:
        """Start ``count`` delivery loops, each under ``supervisor``."""
        workers = []
        for n in range(count):
            self.machines.append(self._machine(n))
            workers.append(supervisor.worker(f"outpost-delivery-{n}", self.loop(n)))
        return workers

    def _machine(self, number: int) -> Delivery:
        started = time.monotonic()
        delivery = Delivery(self._settings, self._context.traces.rng(number + 1), started)
        return self._context.traces.delivery(number, delivery, self._settings, started)

    @property
    def stalled(self) -> str | None:
        return next((d.stalled for d in self.machines if d.stalled), None)

    @property
    def blocked(self) -> str | None:
        """Why delivery is stalled by what only an operator fixes (a token, a URL, a
        certificate, a proxy), or ``None``: a flush could only wait it out."""
        return next((d.stalled for d in self.machines if d.blocked), None)

    @property
    def rejected_entries(self) -> int:
        return sum(d.rejected_entries for d in self.machines)

    async def flush(self, timeout: float) -> bool:
        """Wait until every event queued now is delivered or dropped (``True``), at most
        ``timeout`` seconds (``False``)."""
        return await flush_outboxes(self._context, timeout, lambda: self._holding_nothing)

    @property
    def _holding_nothing(self) -> bool:
        return all(m.idle for m in self.machines)

    def loop(self, number: int) -> Callable[[], Any]:
        """The worker of delivery machine ``number``."""
        ctx = self._context
        runs = 0

        async def loop() -> None:
            nonlocal runs
            runs += 1
            if runs > 1:
                # Restarted after a failure: a fresh machine, and what the failed one held (still
                # pending for this consumer) is read again.
                self.machines[number] = self._machine(number)
                with ctx.lock:
                    ctx.recovery.restarted(number)
            delivery = self.machines[number]
            await self._retrying(number, self._create_groups, None)  # Redis may be down at start
            while not ctx.closed:
                flushing = ctx.flushing > 0
                if flushing != delivery.flushing:
                    delivery.handle(Flushing(flushing))
                delivery.handle(Tick(time.monotonic(), ctx.now_us()))
                (action,) = delivery.effects()
                outcome = await self._act(number, action)
                delivery.handle(Tick(time.monotonic(), ctx.now_us()))
                delivery.handle(outcome)
                for report in delivery.reports():
                    log_report(ctx.log, report)
                if isinstance(outcome, Settled) or isinstance(action, PostAndSettle):
                    ctx.signal.fire()  # the ticks, and reads waiting on this instance's copies
                    ctx.deliveries.fire()  # a flush waiting; a loop holding off its re-read

        return loop

    async def hand_back(self) -> None:
        """Once the loops stopped: this instance's heartbeat goes, so other instances take what
        it still holds at their next survey, and it leaves the group where it holds nothing."""
        try:
            for action in hand_back(self._context.consumer, self._context.shards):
                await self._act_once(action)
        except (RedisError, OSError) as exc:
            self._context.log.warning(
                "outpost could not hand back its outbox entries (others take them once its "
                "heartbeat expires): %s",
                exc,
            )

    async def _act(self, loop: int, action: DeliveryEffect) -> DeliveryAnswer:
        """Do one delivery action of loop ``loop``. Redis failures are retried until they succeed
        (or the instance closes): settling must not be skipped, and a read can simply wait."""
        if not isinstance(action, _MOVES_ENTRIES):
            return await self._act_retrying(loop, action)
        ctx = self._context
        with ctx.lock:
            ctx.recovery.read_started()  # a re-read of this consumer's entries waits meanwhile
        try:
            return await self._act_retrying(loop, action)
        finally:
            with ctx.lock:
                ctx.recovery.read_ended()

    async def _act_retrying(self, loop: int, action: DeliveryEffect) -> DeliveryAnswer:
        if isinstance(action, PostAndSettle):  # each script retried, never the post
            return await self._post_and_settle(loop, action)
        if isinstance(action, SettleScripts):
            return await self._settle_scripts(loop, action)
        return await self._retrying(loop, lambda: self._act_once(action), nothing_done(action))

    async def _retrying(self, loop: int, call: Callable[[], Awaitable[_T]], closing: _T) -> _T:
        """``call()`` until Redis answers, doing what the instance's recovery says after each
        failure; ``closing`` (nothing done, the work stays queued in Redis) once it gives up."""
        ctx = self._context
        while True:
            try:
                result = await call()
            except Exception as exc:
                if not failed_in_redis(exc):
                    raise  # a bug of ours: the loop's supervisor logs it and restarts the loop
                lost = isinstance(exc, ResponseError) and lost_its_data(str(exc))
                with ctx.lock:
                    after = ctx.recovery.failed(
                        loop,
                        time.monotonic(),
                        str(exc),
                        random.random(),
                        lost_data=lost,
                        closing=ctx.closed,
                    )
                if isinstance(after, GiveUp):
                    return closing
                await self._after_failure(after)
                continue
            with ctx.lock:
                report = ctx.recovery.answered(loop, time.monotonic())
            log_report(ctx.log, report)
            return result

    async def _after_failure(self, after: BackOff | RecreateGroups) -> None:
        if isinstance(after, RecreateGroups):
            with contextlib.suppress(RedisError, OSError):  # the next try meets it again
                await self._create_groups()
        else:
            log_report(self._context.log, after.report)
        await sleep(after.seconds)

    async def _act_once(self, action: DeliveryEffect) -> DeliveryAnswer:
        result: DeliveryAnswer = await _DELIVERY_EFFECTS[type(action)](self, action)
        return result

    async def _create_groups(self) -> None:
        replies = await per_stream(
            self._context,
            self._context.outboxes,
            lambda client, stream: client.xgroup_create(stream, GROUP, id="0", mkstream=True),
        )
        raising([r for r in replies if not (failed(r) and "BUSYGROUP" in str(r))])

    # -- one method per effect ----------------------------------------------------------------

    async def _read_outbox(self, action: ReadOutbox) -> OutboxRead:
        """New entries, or this consumer's pending ones again when the recovery says so."""
        read, _ = await self._read_outbox_settling(action, ())
        return read

    async def _read_outbox_settling(
        self, action: ReadOutbox, settles: tuple[SettleScript, ...]
    ) -> tuple[OutboxRead, list[Any] | None]:
        """The same, with the ``settles`` scripts sent right behind a read of new entries that
        does not block: their replies too, or ``None`` when they did not go (the caller runs
        them)."""
        ctx = self._context
        with ctx.lock:
            reread = ctx.recovery.next_read(all_idle=self._holding_nothing)
            ctx.recovery.read_started()
        waiting = reread == "waiting" and action.block > 0
        try:
            if reread == "now":
                return await self._read_own_pending(action), None
            # Due to re-read while another loop reads or holds entries: read what is there
            # without blocking (a blocking read here would keep that loop from the re-read, each
            # loop in turn), then rest uncounted as reading below, so one finds none reading.
            read, settled = await self._read_new(
                ReadOutbox(action.count, 0.0) if waiting else action, settles
            )
        finally:
            with ctx.lock:
                ctx.recovery.read_ended()
        if waiting and not read.entries:
            await ctx.deliveries.wait(ctx.deliveries.version, min(action.block, POLL))
        return read, settled

    async def _read_own_pending(self, action: ReadOutbox) -> OutboxRead:
        """``XREADGROUP ... 0``: the entries delivered to this consumer and not acknowledged, one
        stream at a time (a cluster refuses a read across slots)."""
        ctx = self._context
        entries: list[StreamEntry] = []
        for stream in ctx.outboxes:
            reply = await ctx.redis.xreadgroup(
                GROUP, ctx.consumer, {stream: "0"}, count=action.count - len(entries)
            )
            entries += stream_entries(reply)
            if len(entries) >= action.count:
                with ctx.lock:
                    ctx.recovery.more_pending()  # the next read at rest looks again
                break
        return OutboxRead(entries)

    async def _read_new(
        self, action: ReadOutbox, settles: tuple[SettleScript, ...] = ()
    ) -> tuple[OutboxRead, list[Any] | None]:
        """The read, and the replies of ``settles`` when they went behind it (else ``None``)."""
        ctx = self._context
        if ctx.cluster is not None:
            return await read_outboxes_one_by_one(ctx, action), None
        block = int(action.block * 1000)
        if block <= 0:  # a lingering batch's read for more: with the scripts, read as it came
            command = read_command(ctx.consumer, action.count, ctx.outboxes)
            if settles:
                # The scripts in the read's round trip: Redis settles while this process parses
                # what the read found, rather than wait for the next command meanwhile.
                calls = self._with_known_revs(settles)
                read, settled = await read_then_scripts(ctx, command, _found, calls)
                if isinstance(read, BaseException):
                    raise read  # the scripts' replies are dropped: they run again (harmless)
                return read, settled
            reply = await ctx.batches.execute(*command, parsed=False)
            return OutboxRead(stream_entries(reply)), None
        # On a connection of its own (it blocks), unparsed: the name in bytes finds no reply
        # callback in redis-py, whose parsing cost more than the read.
        command = read_command(ctx.consumer, action.count, ctx.outboxes, block)
        reply = await ctx.redis.execute_command(b"XREADGROUP", *command[1:])  # type: ignore[no-untyped-call]
        return OutboxRead(stream_entries(reply)), None

    async def _post_and_settle(self, loop: int, action: PostAndSettle) -> DeliveryAnswer:
        """The next batch's post, and meanwhile the read of the batch after it (if asked) and the
        settle scripts of the batches before it, each retried until Redis answers (never the
        post: it changes nothing in Redis)."""

        ctx = self._context
        found: list[OutboxRead] = []

        async def meanwhile() -> None:
            settled = None
            if action.read is not None:  # first: the loop needs it as soon as the post returns
                read, settled = await self._read_alongside(loop, action.read, action.settles)
                found.append(read)
            await self._settle_all(loop, action.settles, settled)

        ctx.settling += 1
        try:
            answer = await alongside(lambda: post_batch(ctx, action.post), meanwhile)
        finally:
            ctx.settling -= 1
        return PostedAlongside(answer, found[0]) if found else answer

    async def _read_alongside(
        self, loop: int, action: ReadOutbox, settles: tuple[SettleScript, ...]
    ) -> tuple[OutboxRead, list[Any] | None]:
        """A read beside a post (``settles`` behind it where they may go: their replies too),
        tried once: on a Redis failure it found nothing, and what it may have taken is read
        again from this consumer's pending entries later."""
        try:
            return await self._read_outbox_settling(action, settles)
        except Exception as exc:
            if not failed_in_redis(exc):
                raise
            ctx = self._context
            with ctx.lock:
                report = ctx.recovery.read_beside_post_failed(
                    loop, time.monotonic(), str(exc), random.random(), closing=ctx.closed
                )
            log_report(ctx.log, report)
            return OutboxRead([]), None

    async def _settle_scripts(self, loop: int, action: SettleScripts) -> DeliveryAnswer:
        ctx = self._context
        ctx.settling += 1
        try:
            await self._settle_all(loop, action.settles)
        finally:
            ctx.settling -= 1
        return Settled()

    async def _settle_all(
        self, loop: int, settles: tuple[SettleScript, ...], replies: list[Any] | None = None
    ) -> None:
        """Every script of ``settles`` in one round trip (on one Redis), unless ``replies`` came
        already (they went behind a read); one that failed is tried again alone until Redis
        answers."""
        ctx = self._context
        if replies is None:
            calls = self._with_known_revs(settles)
            replies = await run_scripts(ctx, calls) if calls else []
        for settle, reply in zip(settles, replies, strict=True):
            if isinstance(reply, BaseException):
                if not failed_in_redis(reply):
                    raise reply
                await self._retrying(loop, functools.partial(self._run_settle, settle), None)
            else:
                await self._effects.replied(reply)

    async def _post_and_settle_alone(self, action: PostAndSettle) -> DeliveryAnswer:
        """The same outside a loop (the loops run these through ``_act``): as loop 0's."""
        return await self._post_and_settle(0, action)

    async def _settle_scripts_alone(self, action: SettleScripts) -> DeliveryAnswer:
        return await self._settle_scripts(0, action)

    async def _settle(self, action: SettleScript) -> DeliveryAnswer:
        ctx = self._context
        ctx.settling += 1
        try:
            return await self._run_settle(action)
        finally:
            ctx.settling -= 1

    async def _run_settle(self, action: SettleScript) -> Settled:
        ctx = self._context
        (action,) = self._with_known_revs((action,))
        reply = await run_script(ctx, action.script, action.keys, action.args)
        await self._effects.replied(reply)
        return Settled(reply)

    def _with_known_revs(self, settles: tuple[SettleScript, ...]) -> list[SettleScript]:
        """``settles`` told which revisions this instance holds: each script then replies with
        what changed, so this instance's copies (and a flush() waiting on them) see it at once."""
        ctx = self._context
        with ctx.lock:
            return [with_known_revs(s, ctx.session.known_rev) for s in settles]

    async def _report_dropped(self, action: ReportDropped) -> DeliveryAnswer:
        ctx = self._context
        if ctx.on_dropped is None:
            ctx.log.error("outpost dropped %d events: %s", len(action.events), action.reason)
        else:
            try:
                await call_back(ctx.on_dropped, list(action.events), action.reason)
            except Exception:
                ctx.log.exception("outpost: on_dropped raised")
        return Reported()

    async def _sleep(self, action: Sleep) -> DeliveryAnswer:
        signal = self._context.deliveries
        version = signal.version
        await signal.wait(version, min(action.until - time.monotonic(), POLL))
        return Done()


def _found(reply: object) -> OutboxRead:
    return OutboxRead(stream_entries(reply))


_MOVES_ENTRIES = (ClaimStale, Reclaim, SettleScript, SettleScripts, PostAndSettle)
"""What changes this consumer's pending entries as a read does: a re-read of them waits while
a loop does one. (A ``ReadOutbox`` counts itself, once it knows which read it does.)"""


def _with_context(
    run: Callable[[DriverContext, Any], Awaitable[DeliveryAnswer]],
) -> Callable[[Deliveries, Any], Awaitable[DeliveryAnswer]]:
    """An effect that needs only the driver's context, in the table of ``Deliveries``' own."""
    return lambda deliveries, action: run(deliveries._context, action)


# Each effect a delivery machine asks for, and the method that does it and returns what came of
# it. An effect missing here fails at once (KeyError), in any test.
_DELIVERY_EFFECTS: dict[type, Callable[[Deliveries, Any], Awaitable[DeliveryAnswer]]] = {
    ReadOutbox: Deliveries._read_outbox,
    PostBatch: _with_context(post_batch),
    PostAndSettle: Deliveries._post_and_settle_alone,
    SettleScripts: Deliveries._settle_scripts_alone,
    SettleScript: Deliveries._settle,
    ReportDropped: Deliveries._report_dropped,
    RefreshClaim: _with_context(refresh_claim),
    ClaimStale: _with_context(claim_stale),
    Beat: _with_context(beat),
    SurveyConsumers: _with_context(survey),
    CheckHeartbeats: _with_context(check_heartbeats),
    Reclaim: _with_context(reclaim),
    TakeRequest: _with_context(take_request),
    ForgetHeartbeat: _with_context(forget_heartbeat),
    Sleep: Deliveries._sleep,
}

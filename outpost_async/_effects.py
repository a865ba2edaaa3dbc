"""Running the session's effects: the one way inputs reach the sans-IO session and what it asks
for gets done.

Every input reaches the session here, under the lock: :meth:`SessionEffects.feed` hands it one
and runs the effects it gives; ``tell`` and ``give`` hand it a loop's news (``give`` returns what
it asks for), ``heard`` what a subscription brought, ``ask`` a call's question, ``replied`` and
``failed`` a script's outcome. :meth:`SessionEffects.run` runs effects, and those their
outcomes cause, until the session asks for nothing more. The subscription never waits on an
effect: it hands what its news asked for (loads, listings of pending events, snapshot scripts)
to :meth:`SessionEffects.hand_over`, and the effects worker
(:meth:`SessionEffects.run_handed_over`) runs them, so a change message never waits behind a
load, a listing or a script. ``_SESSION_EFFECTS`` (at the end) is the dispatch table: each effect
the session can ask for, and the method that does it and hands back what came of it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

from outpost_async._backend import Signal
from outpost_async._context import POLL, DriverContext, failed_in_redis, log_report
from outpost_async._scripts import run_or_fail
from outpost_core import (
    CONFIGURATION_KEY,
    ChangePublished,
    CloseConnection,
    ConfigurationReceived,
    ConnectionFailed,
    Effect,
    IdentityLoaded,
    Input,
    ListFailed,
    ListPending,
    LoadFailed,
    LoadIdentity,
    OpenConnection,
    PendingListed,
    RedisUnavailable,
    RunScript,
    ScriptFailed,
    ScriptReplied,
    SendBytes,
    Session,
    StoreConfiguration,
    Tick,
)

_T = TypeVar("_T")
_P = ParamSpec("_P")

News = tuple[object, Any]
"""What a subscription heard: a change published (its data, as it came), or the client's message
of another reply (``None`` when it makes none of it)."""


class SessionEffects:
    """Feeds one instance's session and runs what it asks for."""

    def __init__(self, context: DriverContext) -> None:
        self._context = context
        self._handed: list[Effect] = []  # for the effects worker, under the context's lock
        # Fired only when something is handed over: the worker does not wake at every change
        # (a thread woken per message costs the sync driver's readers the GIL).
        self._handed_signal = Signal()

    async def feed(self, event: Input) -> None:
        """Hand the session one input, then run what it asks for."""
        ctx = self._context
        with ctx.lock:
            ctx.session.handle(event)
            effects = ctx.session.effects()
            self._log_reports()
        if effects or not isinstance(event, Tick):  # a quiet tick changes nothing to wake for
            await self.run(effects)

    async def replied(self, reply: object, ticket: int | None = None) -> None:
        """A script of this instance that writes customers' state replied (``None``: it wrote
        nothing), to the session: with its ``ticket`` (from ``Session.script_sent``), the session
        first applies what it held that came before the reply (``Session``'s echo rule). Then
        what the session asks for runs. A caller's own script (with a ticket) wakes the waiters
        only when the session asks for something; a loop's (a settle, an anchor) always does, as
        what it changed may be what a read waits for."""
        ctx = self._context
        with ctx.lock:
            if reply is not None or ticket is not None:
                ctx.session.handle(ScriptReplied(reply, None, ticket))
            effects = ctx.session.effects()
            self._log_reports()
        if effects or ticket is None:
            await self.run(effects)

    def tell(self, *events: Input) -> None:
        """Hand the session ``events``, in order, under the lock, for an effect's outcome or a
        loop's news: whoever drains the session next (the :meth:`run` that runs the effect, the
        loop's next tick) gets what it asks for."""
        ctx = self._context
        with ctx.lock:
            for event in events:
                ctx.session.handle(event)
            self._log_reports()

    def give(self, *events: Input) -> list[Effect]:
        """Hand the session ``events``, in order, under the lock; what it asks for now, for a
        loop that must not run it itself (it hands it over)."""
        with self._context.lock:  # reentrant where it is a lock at all
            self.tell(*events)
            return self._context.session.effects()

    def ask(
        self, question: Callable[Concatenate[Session, _P], _T], *args: _P.args, **kw: _P.kwargs
    ) -> tuple[_T, list[Effect]]:
        """A call's question to the session (``Session.read``: ``question(session, *args,
        **kw)``), under the lock: its answer, and what the session asks for meanwhile (the
        caller runs it)."""
        ctx = self._context
        with ctx.lock:
            answer = question(ctx.session, *args, **kw)
            self._log_reports()
            return answer, ctx.session.effects()

    def heard(
        self, news: list[News], inputs_of: Callable[[Any], list[Input]]
    ) -> tuple[bool, list[Effect]]:
        """Hand the session what a subscription heard, in order, under the lock: each change
        published (which the session holds, while scripts of this instance are in flight, as it
        may be one's echo), and what each other message means (``inputs_of``, called under the
        lock: it may move the channel placement). Whether anything reached the session (not only
        held), and what it asks for now, drained in the same hold of the lock: the loads the news
        asks for go to the effects worker, never to a caller's thread that drains in between."""
        session = self._context.session
        reached = False
        with self._context.lock:
            holding = session.holding  # no news here sends or ends a script
            for change, message in news:
                if change is None:
                    reached = True
                    if message is not None:
                        for event in inputs_of(message):
                            session.handle(event)
                else:
                    session.handle(ChangePublished(change))  # as it came: no redis-py message
                    reached = reached or not holding
            self._log_reports()
            return reached, session.effects()

    def failed(self, ticket: int) -> None:
        """A script of this instance (``ticket``, from ``Session.script_sent``) failed: the
        session applies what it held for it now (their effects: the next tick's)."""
        with self._context.lock:
            self._context.session.handle(ScriptFailed(ticket=ticket))
            self._log_reports()

    async def tick(self) -> None:
        await self.feed(Tick(time.monotonic(), self._context.now_us()))

    async def run(self, effects: list[Effect]) -> None:
        """Run effects, and those their outcomes cause, until the session asks for nothing more;
        then wake whoever waits for a change."""
        ctx = self._context
        while effects:
            for index, effect in enumerate(effects):
                try:
                    await _SESSION_EFFECTS[type(effect)](self, effect)
                except BaseException:
                    # Cancelled (or failed) midway: what was not started goes back to the
                    # session, for the next loop that drains it. Its deadlines cover the one lost.
                    with ctx.lock:
                        for later in effects[index + 1 :]:
                            ctx.session.emit(later)
                    raise
            with ctx.lock:
                effects = ctx.session.effects()
        self._observe_and_wake()

    def hand_over(self, effects: list[Effect]) -> None:
        """For the subscription, which must not wait on I/O of its own making: queue ``effects``
        for the effects worker, and wake whoever waits for a change now (the changes the
        subscription applied are in memory already)."""
        if effects:
            with self._context.lock:
                self._handed += effects
            self._handed_signal.fire()
        self._observe_and_wake()

    def wake(self) -> None:
        """The instance closes: the effects worker stops waiting for work now."""
        self._handed_signal.fire()

    async def run_handed_over(self) -> None:
        """The effects worker: runs what the subscription handed over, and what that causes."""
        ctx = self._context
        while not ctx.closed:
            version = self._handed_signal.version
            with ctx.lock:
                effects, self._handed = self._handed, []
            if effects:
                await self.run(effects)
            else:
                await self._handed_signal.wait(version, POLL)  # looks at ``closed`` meanwhile

    def _log_reports(self) -> None:
        """Log what the session reported, under the lock right after the input or question that
        made it: lines come out in the order the session made them, and none waits for a later
        drain. (The session never logs: it queues what its driver should.)"""
        ctx = self._context
        for report in ctx.session.reports():
            log_report(ctx.log, report)

    def _observe_and_wake(self) -> None:
        """What happened, to telemetry; then wake every waiter: the session's state changed."""
        ctx = self._context
        with ctx.lock:
            seen = ctx.session.observations()
        if seen:
            ctx.telemetry.observe(seen)
        ctx.signal.fire()

    async def read_cached_configuration(self) -> None:
        """The configuration another instance (or an earlier run) stored in Redis, if any."""
        ctx = self._context
        try:
            text = await ctx.redis.get(CONFIGURATION_KEY)
        except Exception as exc:
            if not failed_in_redis(exc):
                raise
            ctx.redis_failed(ctx.state_outage, exc)
            return
        if text is None:
            return
        # The core parses the text: what a peer cached cannot crash the call.
        await self.feed(ConfigurationReceived(text, from_cache=True))

    async def send(self, data: bytes) -> None:
        """Write to the WebSocket, if the link loop holds it open."""
        stream = self._context.stream
        if stream is None:
            return  # the link dropped: what was asked is asked again on reconnect
        try:
            await stream.send(data)
        except OSError as exc:
            self._context.log.warning("outpost could not write to the WebSocket: %s", exc)
            await self.feed(ConnectionFailed(time.monotonic(), f"could not write: {exc}"))

    # -- one method per effect ----------------------------------------------------------------

    async def _load(self, effect: LoadIdentity) -> None:
        ctx = self._context
        try:
            fields = await ctx.batches.execute("HGETALL", effect.key)
        except Exception as exc:
            if not failed_in_redis(exc):
                raise
            ctx.redis_failed(ctx.state_outage, exc)
            self.tell(LoadFailed(effect.key, effect.load_id))
            return
        ctx.redis_answered(ctx.state_outage)
        self.tell(IdentityLoaded(effect.key, fields, effect.load_id))

    async def _store_configuration(self, effect: StoreConfiguration) -> None:
        try:
            await self._context.redis.set(effect.key, effect.text)
        except Exception as exc:
            if not failed_in_redis(exc):
                raise
            self._context.log.debug("outpost could not cache the configuration: %s", exc)

    async def _run_script(self, effect: RunScript) -> None:
        ctx = self._context
        try:
            reply = await run_or_fail(ctx, effect)
        except RedisUnavailable as exc:
            ctx.redis_failed(ctx.state_outage, exc)
            if effect.tag is not None:
                self.tell(ScriptFailed(effect.tag))
            return
        ctx.redis_answered(ctx.state_outage)
        self.tell(ScriptReplied(reply, effect.tag))

    async def _send_bytes(self, effect: SendBytes) -> None:
        await self.send(effect.data)

    async def _list_pending(self, effect: ListPending) -> None:
        ctx = self._context
        try:
            replies = await ctx.batches.execute_all(*(("HKEYS", key) for key in effect.keys))
            fields = {key: list(names) for key, names in zip(effect.keys, replies, strict=True)}
        except Exception as exc:
            if not failed_in_redis(exc):
                raise
            ctx.redis_failed(ctx.state_outage, exc)
            self.tell(ListFailed(effect.tag))
            return
        ctx.redis_answered(ctx.state_outage)
        self.tell(PendingListed(effect.tag, fields))

    async def _open_connection(self, effect: OpenConnection) -> None:
        self._context.want_open = effect  # the link loop opens it

    async def _close_connection(self, effect: CloseConnection) -> None:
        self._context.drop_stream = True  # the link loop closes it


# Each effect the session asks for, and the method that does it and reports what came of it. An
# effect missing here fails at once (KeyError), in any test.
_SESSION_EFFECTS: dict[type, Callable[[SessionEffects, Any], Awaitable[None]]] = {
    LoadIdentity: SessionEffects._load,
    StoreConfiguration: SessionEffects._store_configuration,
    RunScript: SessionEffects._run_script,
    SendBytes: SessionEffects._send_bytes,
    ListPending: SessionEffects._list_pending,
    OpenConnection: SessionEffects._open_connection,
    CloseConnection: SessionEffects._close_connection,
}

"""Recognising this instance's own changes when they come back over pub/sub: the bookkeeping
(``Echoes``), then the rule the session keeps with it (``Session.script_sent``,
``Session.own_echo``, and the tickets its inputs carry)."""

from __future__ import annotations

import json
import threading
from random import Random
from typing import Any

import pytest

from outpost_core import (
    Balance,
    ChangePublished,
    ConfigurationReceived,
    IdentityLoaded,
    ScriptFailed,
    ScriptReplied,
    Session,
    SubscriberRestarted,
    UsageError,
)
from outpost_core._echoes import Echoes
from outpost_core._trace import RecordingSession, TraceRecord, header, replay_session
from tests.core._payloads import COUNT, STANDARD
from tests.core.test_session import configured, delta, reply, snapshot_fields, state, warm


def test_an_echo_is_recognised_once_and_only_its_own_text() -> None:
    echoes = Echoes(size=3)
    echoes.expect(b'{"c":[{"k":"s","r":2}]}')
    assert not echoes.seen(b'{"c":[{"k":"s","r":3}]}')
    assert echoes.seen(b'{"c":[{"k":"s","r":2}]}')
    assert not echoes.seen(b'{"c":[{"k":"s","r":2}]}')  # once
    assert not echoes.seen(None)
    assert not echoes.seen(["unhashable"])
    echoes.expect(None)  # not a reply: ignored
    assert len(echoes) == 0


def test_echoes_that_never_come_are_forgotten() -> None:
    echoes = Echoes(size=2)
    for n in range(5):
        echoes.expect(f"reply {n}")
    assert len(echoes) == 2
    assert not echoes.seen("reply 0")
    assert echoes.seen("reply 3") and echoes.seen("reply 4")


def test_a_message_is_held_only_while_a_script_is_in_flight() -> None:
    echoes = Echoes()
    assert not echoes.holding
    assert not echoes.hold(b"foreign")  # nothing in flight: apply it now
    ticket = echoes.sent()
    assert echoes.holding
    assert echoes.hold(b"foreign")
    assert echoes.hold(b"mine")  # the echo, come before its reply
    assert echoes.replied(ticket, b"mine") == [b"foreign"]  # before the reply; the echo dropped
    assert len(echoes) == 0
    assert not echoes.hold(b"late")


def test_a_reply_whose_echo_has_not_come_expects_it() -> None:
    echoes = Echoes()
    first = echoes.sent()
    assert echoes.hold(b"other")
    assert echoes.replied(first, b"mine") == [b"other"]
    assert echoes.seen(b"mine")
    second = echoes.sent()
    assert echoes.hold(b"more")
    assert echoes.replied(second, None) == [b"more"]  # it failed: what was held is applied
    assert not echoes.hold(b"after")


def test_a_message_waits_for_every_script_that_could_have_published_it() -> None:
    echoes = Echoes()
    first, second = echoes.sent(), echoes.sent()
    assert echoes.hold(b"second's")  # the echo of either
    third = echoes.sent()
    assert echoes.hold(b"foreign")  # of any of the three, or of another instance
    assert echoes.replied(first, b"first's") == []  # the second and third may yet claim them
    assert echoes.replied(second, b"second's") == []  # its echo dropped, unparsed
    assert echoes.replied(third, b"third's") == [b"foreign"]  # nobody's here: apply it
    assert echoes.seen(b"first's") and echoes.seen(b"third's")
    assert len(echoes) == 0


def test_a_message_does_not_wait_for_scripts_sent_after_it_came() -> None:
    echoes = Echoes()
    first = echoes.sent()
    assert echoes.hold(b"foreign")
    later = echoes.sent()  # its echo cannot have come before it was sent
    assert echoes.replied(first, b"first's") == [b"foreign"]
    assert echoes.replied(later, None) == []


def test_a_reply_without_its_ticket_is_refused() -> None:
    echoes = Echoes()
    ticket = echoes.sent()
    echoes.replied(ticket, b"mine")
    with pytest.raises(UsageError):
        echoes.replied(ticket, b"mine")  # twice
    with pytest.raises(UsageError):
        echoes.replied(7, None)  # never sent


def test_a_pair_reply_names_its_echo_by_the_published_text() -> None:
    echoes = Echoes()
    ticket = echoes.sent()
    assert echoes.hold(b"published")  # come before the reply
    assert echoes.replied(ticket, [b"published", b"whole states"]) == []  # dropped, unparsed
    later = echoes.sent()
    assert echoes.replied(later, [b"published later", b"whole states"]) == []
    assert echoes.seen(b"published later")  # expected, come after the reply
    assert not echoes.seen(b"whole states")


# -- the session's rule ---------------------------------------------------------------------------

KEY = state("r-count")


def followed() -> Session:
    """A session that follows c1's count copy at revision 3."""
    session = configured()
    warm(session, fields=snapshot_fields(rev=3))
    return session


def revision(session: Session) -> int:
    balance = session.read(COUNT, "c1")
    assert isinstance(balance, Balance)
    return balance.revision


def change(rev: int) -> str:
    return reply(delta(KEY, rev, "n", str(rev)))


def test_an_echo_come_before_its_reply_is_held_then_dropped_unparsed_by_it() -> None:
    session = followed()
    ticket = session.script_sent()
    published = b"what the script published"  # not a change: parsed, it would be rejected
    session.handle(ChangePublished(published))
    assert session.holding and session.cached_balance(COUNT, "c1", None) is not None
    session.handle(ScriptReplied([published, change(4)], ticket=ticket))
    assert revision(session) == 4
    assert session.rejections == {}  # the echo never reached the parser
    assert not session.holding
    assert not session.own_echo(published)  # taken by its reply: not expected again


def test_the_session_expects_the_echo_of_a_reply_that_came_first() -> None:
    session = followed()
    ticket = session.script_sent()
    session.handle(ScriptReplied(change(4), ticket=ticket))
    assert session.own_echo(change(4))  # the subscriber drops it, unparsed
    assert not session.own_echo(change(4))  # once


def test_another_instances_change_held_meanwhile_goes_before_the_reply() -> None:
    session = followed()
    ticket = session.script_sent()
    session.handle(ChangePublished(change(4)))  # another instance's, or this script's echo
    assert session.cached_balance(COUNT, "c1", None) is not None  # held: nothing applied yet
    session.handle(ScriptReplied(change(5), ticket=ticket))
    assert session.effects() == []  # 4, then 5: no gap, no reload
    assert revision(session) == 5


def full(rev: int) -> str:
    """A reply with the whole state: the script's caller did not hold the previous revision."""
    flat = [x for pair in snapshot_fields(rev=rev, n=str(rev)).items() for x in pair]
    return reply({"k": KEY, "r": rev, "s": flat, "full": 1})


def test_a_held_change_waits_for_every_script_that_could_have_published_it() -> None:
    session = followed()
    first, second = session.script_sent(), session.script_sent()
    published = b"the second's change"  # not a change: parsed, it would be rejected
    session.handle(ChangePublished(published))  # the echo of either
    session.handle(ScriptReplied([b"the first's change", full(5)], ticket=first))
    assert session.holding  # the second may yet claim it
    session.handle(ScriptReplied([published, full(6)], ticket=second))
    assert session.rejections == {}  # claimed by its own reply, never parsed
    assert revision(session) == 6 and session.effects() == []


def test_a_released_change_is_not_held_again_for_a_script_sent_after_it_came() -> None:
    session = followed()
    first = session.script_sent()
    session.handle(ChangePublished(change(4)))
    later = session.script_sent()  # its echo cannot have come before it was sent
    session.handle(ScriptReplied(change(5), ticket=first))
    assert session.effects() == []  # 4, then 5, though the later script is in flight
    assert revision(session) == 5 and session.holding
    session.handle(ScriptFailed(ticket=later))
    assert not session.holding


def test_a_failed_script_releases_what_was_held() -> None:
    session = followed()
    ticket = session.script_sent()
    session.handle(ChangePublished(change(4)))
    session.handle(ScriptFailed(ticket=ticket))
    assert revision(session) == 4 and not session.holding
    session.handle(ChangePublished(change(5)))  # nothing in flight: applied at once
    assert revision(session) == 5


def test_a_script_that_wrote_nothing_releases_what_was_held() -> None:
    session = followed()
    ticket = session.script_sent()
    session.handle(ChangePublished(change(4)))
    session.handle(ScriptReplied(None, ticket=ticket))  # an admission refused
    assert revision(session) == 4
    assert session.rejections == {}


def test_a_bad_held_change_is_dropped_alone() -> None:
    session = followed()
    ticket = session.script_sent()
    session.handle(ChangePublished(b"\xff"))
    session.handle(ChangePublished(change(4)))
    session.handle(ScriptReplied(change(5), ticket=ticket))
    assert session.rejections == {"change": 1}
    assert revision(session) == 5


def test_a_loops_reply_is_expected_without_a_ticket() -> None:
    session = followed()
    session.script_sent()  # a caller's script in flight holds others' changes...
    session.handle(ScriptReplied(change(4)))  # ...not a loop's reply (a settle, an anchor)
    assert revision(session) == 4
    assert session.own_echo(change(4))


def test_a_ticket_ends_once() -> None:
    session = followed()
    ticket = session.script_sent()
    session.handle(ScriptReplied(change(4), ticket=ticket))
    with pytest.raises(UsageError):
        session.handle(ScriptReplied(change(5), ticket=ticket))
    with pytest.raises(UsageError):
        session.handle(ScriptFailed(ticket=ticket))
    with pytest.raises(UsageError):
        session.handle(ScriptFailed(ticket=7))  # never given


def test_the_echo_question_is_answered_once_across_threads() -> None:
    session = followed()
    echoes = [change(rev) for rev in range(4, 504)]
    for echo in echoes:
        session.handle(ScriptReplied(echo))  # a loop's reply: expected, no lock asked below
    counts = [0] * 4

    def ask(index: int) -> None:
        counts[index] = sum(map(session.own_echo, echoes))

    threads = [threading.Thread(target=ask, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(counts) == len(echoes)  # each recognised by exactly one asker


def test_a_recorded_run_with_held_changes_replays_the_same() -> None:
    records: list[TraceRecord] = [header("session", configured().settings, 0, {})]
    session = RecordingSession(Session(), records.append)
    recorded_warm(session)
    first = session.script_sent()
    session.handle(ChangePublished(change(4)))
    assert session.own_echo(b"nothing expected") is False  # asked without a record
    session.handle(ScriptReplied(change(5), ticket=first))
    second = session.script_sent()
    session.handle(ChangePublished(change(6)))
    session.handle(ScriptFailed(ticket=second))
    balance = session.read(COUNT, "c1")
    assert isinstance(balance, Balance) and balance.revision == 6
    calls = [r["method"] for r in records[1:] if r["t"] == "call"]
    assert calls.count("script_sent") == 2
    assert [r["result"] for r in records if r.get("method") == "script_sent"] == [0, 1]
    assert replay_session(json.loads(json.dumps(records)), Random) == []


def recorded_warm(session: Any) -> None:
    """``warm`` through a recording session (configuration, subscription, a first read)."""
    session.handle(ConfigurationReceived(STANDARD))
    session.effects()
    session.handle(SubscriberRestarted())
    assert session.read(COUNT, "c1") is None
    [load] = session.effects()
    session.handle(IdentityLoaded(KEY, snapshot_fields(rev=3), load.load_id))
    session.effects()


def test_a_trace_recorded_before_tickets_replays() -> None:
    """Inputs without the ticket field, and no ``script_sent`` calls: nothing is ever held."""
    records: list[TraceRecord] = [header("session", configured().settings, 0, {})]
    session = RecordingSession(Session(), records.append)
    recorded_warm(session)
    session.handle(ScriptReplied(change(4)))
    session.handle(ChangePublished(change(5)))
    session.handle(ScriptFailed(tag=3))
    balance = session.read(COUNT, "c1")
    assert isinstance(balance, Balance) and balance.revision == 5
    old = json.loads(json.dumps(records))
    for record in old:
        if record.get("t") == "input":
            record["input"].pop("ticket", None)
    assert '"ticket"' not in json.dumps(old)
    assert replay_session(old, Random) == []

"""Recognising this instance's own changes when they come back over pub/sub."""

from __future__ import annotations

import pytest

from outpost_core import Echoes, UsageError


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
    assert not echoes.hold(b"foreign")  # nothing in flight: apply it now
    ticket = echoes.sent()
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

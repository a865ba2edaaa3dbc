"""Recognising this instance's own changes when they come back over pub/sub."""

from __future__ import annotations

from outpost_core import Echoes


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
    echoes.sent()
    assert echoes.hold(b"foreign")
    assert echoes.hold(b"mine")  # the echo, come before its reply
    assert echoes.replied(b"mine") == [b"foreign"]  # applied before the reply; the echo dropped
    assert len(echoes) == 0
    assert not echoes.hold(b"late")


def test_a_reply_whose_echo_has_not_come_expects_it() -> None:
    echoes = Echoes()
    echoes.sent()
    echoes.sent()
    assert echoes.hold(b"other")
    assert echoes.replied(b"mine") == [b"other"]
    assert echoes.seen(b"mine")
    assert echoes.hold(b"more")  # the second script is still in flight
    assert echoes.replied(None) == [b"more"]  # it failed: what was held is applied
    assert not echoes.hold(b"after")

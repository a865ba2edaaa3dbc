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


def test_an_echo_is_recognised_in_a_raw_pubsub_reply() -> None:
    echoes = Echoes()
    echoes.expect(b"change")
    assert not echoes.seen_in([b"ssubscribe", b"ch", 1])
    assert not echoes.seen_in([b"smessage", b"ch"])
    assert not echoes.seen_in(None)
    assert not echoes.seen_in([b"smessage", b"ch", b"other change"])
    assert echoes.seen_in([b"smessage", b"ch", b"change"])
    assert not echoes.seen_in(["smessage", "ch", b"change"])  # once

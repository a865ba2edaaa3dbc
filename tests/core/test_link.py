"""The WebSocket to Polar (``_link``): handshake, frames, keepalive, reconnection, all in memory."""

from __future__ import annotations

import pytest
from wsproto.events import RejectData

from outpost_core import UsageError
from outpost_core._link import PATH, Link, LinkSettings, LinkState, Target, _Unreadable
from tests.core._polar import FixedRandom, Peer

TARGET = Target(host="polar.test", port=443, tls=True)


def state(link: Link) -> LinkState:
    """The link's state, read through a call so that mypy does not narrow it between steps."""
    return link.state


def new_link(settings: LinkSettings | None = None, draw: float = 0.5) -> Link:
    return Link(TARGET, "polar_oat_secret", FixedRandom(draw), settings)


def open_link(now: float = 100.0, settings: LinkSettings | None = None) -> tuple[Link, Peer]:
    link = new_link(settings)
    assert link.wants_connection(now)
    link.opened(now)
    peer = Peer()
    assert peer.feed(link.data_to_send()) == b""
    assert link.receive(peer.accept(), now) == []
    assert state(link) is LinkState.OPEN
    return link, peer


# -- Target ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "target"),
    [
        ("https://api.polar.sh", Target(host="api.polar.sh", port=443, tls=True)),
        ("https://api.polar.sh/", Target(host="api.polar.sh", port=443, tls=True)),
        ("http://127.0.0.1:8000", Target(host="127.0.0.1", port=8000, tls=False)),
        ("http://localhost", Target(host="localhost", port=80, tls=False)),
        ("wss://x.test:9443/v1", Target(host="x.test", port=9443, tls=True)),
        ("ws://x.test", Target(host="x.test", port=80, tls=False)),
    ],
)
def test_target_of_a_server_url(url: str, target: Target) -> None:
    assert Target.of(url) == target


@pytest.mark.parametrize("url", ["", "api.polar.sh", "ftp://x.test", "https://", "https:///v1"])
def test_target_refuses_what_is_not_an_http_url(url: str) -> None:
    with pytest.raises(UsageError, match="server_url must be an http"):
        Target.of(url)


# -- connecting -----------------------------------------------------------------------------------


def test_a_new_link_wants_a_connection_at_once_and_only_once() -> None:
    link = new_link()
    assert state(link) is LinkState.DISCONNECTED
    assert link.next_deadline() == 0.0
    assert link.wants_connection(0.0)
    assert state(link) is LinkState.CONNECTING
    assert not link.wants_connection(1.0)
    assert link.next_deadline() is None  # the driver is connecting: it reports either way
    assert link.data_to_send() == b""
    assert link.send({"type": "configuration"}) is False
    assert link.receive(b"HTTP/1.1 101", 1.0) == []


def test_the_upgrade_request_carries_the_token() -> None:
    link = new_link()
    link.wants_connection(5.0)
    link.opened(5.0)
    assert state(link) is LinkState.HANDSHAKING
    peer = Peer()
    peer.feed(link.data_to_send())
    [request] = peer.requests
    assert (request.host, request.target) == ("polar.test", PATH)
    assert (b"authorization", b"Bearer polar_oat_secret") in [
        (bytes(k), bytes(v)) for k, v in request.extra_headers
    ]
    assert link.next_deadline() == 5.0 + LinkSettings().connect_timeout


def test_a_non_default_port_is_in_the_host_header() -> None:
    link = Link(Target(host="127.0.0.1", port=8000, tls=False), "t", FixedRandom())
    link.wants_connection(0.0)
    link.opened(0.0)
    peer = Peer()
    peer.feed(link.data_to_send())
    assert peer.requests[0].host == "127.0.0.1:8000"


def test_opened_out_of_turn_is_a_usage_error() -> None:
    link = new_link()
    with pytest.raises(UsageError, match="opened\\(\\) while disconnected"):
        link.opened(0.0)


def test_accept_opens_the_link() -> None:
    link, _ = open_link()
    assert (link.connections, link.refused, link.peer_errors) == (1, None, 0)
    assert link.last_error is None


def handshaking(now: float = 10.0) -> tuple[Link, Peer]:
    link = new_link()
    link.wants_connection(now)
    link.opened(now)
    peer = Peer()
    peer.feed(link.data_to_send())
    return link, peer


@pytest.mark.parametrize(("status", "delay"), [(401, 60.0), (403, 60.0), (500, 0.25 * 0.75)])
@pytest.mark.parametrize("body", [None, b'{"detail":"invalid token"}'])
def test_a_refused_upgrade(status: int, delay: float, body: bytes | None) -> None:
    link, peer = handshaking()
    assert link.receive(peer.reject(status, body), 11.0) == []
    assert state(link) is LinkState.DISCONNECTED
    detail = ": invalid token" if body else ""
    assert link.refused == f"Polar refused the WebSocket with HTTP {status}{detail}"
    assert link.refused_status == status
    assert link.last_error == link.refused
    assert link.retry_at == pytest.approx(11.0 + delay)
    assert not link.wants_connection(11.0)
    assert link.wants_connection(11.0 + delay)


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (b'{"detail":"invalid token"}', ": invalid token"),
        (b'  {"detail": "The access token expired."}\n', ": The access token expired."),
        (
            b'{"detail":[{"loc":["header"],"msg":"missing"}]}',
            ': [{"loc": ["header"], "msg": "missing"}]',
        ),
        (b'{"error":"nope"}', ': {"error": "nope"}'),
        (b'"just a string"', ": just a string"),
        (b"Bad Gateway\r\n", ": Bad Gateway"),
        (b"<html>nginx</html>", ": <html>nginx</html>"),
        (b"\xffbroken", ": \ufffdbroken"),
        (b"", ""),
        (b"   ", ""),
        (b'{"detail":""}', ""),
        (b"x" * 300, ": " + "x" * 200),
    ],
)
def test_a_refusal_carries_polars_detail(body: bytes, detail: str) -> None:
    link, peer = handshaking()
    assert link.receive(peer.reject(401, body), 11.0) == []
    assert link.refused == f"Polar refused the WebSocket with HTTP 401{detail}"
    assert link.last_error == link.refused


def test_an_informational_answer_is_a_refusal_without_a_body() -> None:
    # wsproto reads a 1xx other than 101 as a refusal with no body to wait for.
    link, _ = handshaking()
    assert link.receive(b"HTTP/1.1 103 Early Hints\r\n\r\n", 11.0) == []
    assert state(link) is LinkState.DISCONNECTED
    assert link.refused == "Polar refused the WebSocket with HTTP 103"
    assert link.retry_at == pytest.approx(11.0 + 0.25 * 0.75)  # not a token problem


def test_a_refusal_waits_for_its_whole_body() -> None:
    link, peer = handshaking()
    assert link.receive(peer.reject(403, b'{"detail":"token ', finished=False), 11.0) == []
    assert state(link) is LinkState.HANDSHAKING  # the detail is still coming
    assert link.refused is None
    assert link.receive(peer.reject_more(b'revoked"}'), 11.5) == []
    assert state(link) is LinkState.DISCONNECTED
    assert link.refused == "Polar refused the WebSocket with HTTP 403: token revoked"
    assert link.retry_at == 11.5 + LinkSettings().refused_delay


def test_a_refusal_body_cut_by_the_connection_closing() -> None:
    link, peer = handshaking()
    assert link.receive(peer.reject(401, b'{"detail":"inval', finished=False), 11.0) == []
    assert link.receive(b"", 12.0) == []  # EOF: the body ends there
    assert state(link) is LinkState.DISCONNECTED
    assert link.refused == 'Polar refused the WebSocket with HTTP 401: {"detail":"inval'
    assert link.retry_at == 12.0 + LinkSettings().refused_delay


def test_a_refusal_keeps_only_the_start_of_a_long_body() -> None:
    link, peer = handshaking()
    link.receive(peer.reject(500, b"a" * 300, finished=False), 11.0)
    link.receive(peer.reject_more(b"b" * 300, finished=False), 11.0)
    link.receive(peer.reject_more(b"c" * 300, finished=False), 11.0)
    assert link._rejection is not None and bytes(link._rejection[1]) == b"a" * 300 + b"b" * 200
    link.receive(peer.reject_more(b"", finished=True), 11.0)
    assert link.refused == "Polar refused the WebSocket with HTTP 500: " + "a" * 200


def test_a_refusal_does_not_outlive_its_connection() -> None:
    link, peer = handshaking()
    link.receive(peer.reject(401, b"half", finished=False), 11.0)
    link.tick(11.0 + LinkSettings().connect_timeout + 1)  # the rest never came
    assert state(link) is LinkState.DISCONNECTED
    assert link.refused is None
    assert link.last_error == "Polar did not answer the WebSocket upgrade"
    assert link._rejection is None


def test_a_stray_body_without_a_refusal_is_ignored() -> None:
    # wsproto sends body data only after a refusal; the link does not rely on it.
    link, _ = handshaking()
    messages: list[object] = []
    link._event(RejectData(data=b"x", body_finished=True), 11.0, messages)
    assert (state(link), link.refused, messages) == (LinkState.HANDSHAKING, None, [])


def test_an_accepted_upgrade_clears_an_earlier_refusal() -> None:
    link, peer = handshaking()
    link.receive(peer.reject(401, b'{"detail":"invalid token"}'), 11.0)
    assert link.refused is not None
    now = link.retry_at
    assert link.wants_connection(now)
    link.opened(now)
    peer = Peer()
    peer.feed(link.data_to_send())
    link.receive(peer.accept(), now)
    assert state(link) is LinkState.OPEN
    assert refusal(link) is None


def refusal(link: Link) -> str | None:
    """``link.refused``, read through a call so that mypy does not narrow it between steps."""
    return link.refused


def test_the_link_shares_its_generator() -> None:
    rng = FixedRandom()
    assert Link(TARGET, "t", rng).rng is rng


def test_a_frame_after_an_oversized_one_in_the_same_chunk() -> None:
    link, peer = open_link(settings=LinkSettings(max_message=10))
    assert link.receive(peer.send_text("x" * 11) + peer.send_text("y"), 101.0) == []
    assert state(link) is LinkState.DISCONNECTED


def test_frames_after_a_close_in_the_same_chunk_are_ignored() -> None:
    link, peer = open_link()
    data = peer.close() + b"\x81\x02{}"  # a close frame, then a text frame
    assert link.receive(data, 101.0) == []
    assert state(link) is LinkState.DISCONNECTED
    assert link.last_error == "Polar closed the WebSocket (1000)"


def test_the_handshake_times_out() -> None:
    settings = LinkSettings(connect_timeout=3.0)
    link = new_link(settings)
    link.wants_connection(0.0)
    link.opened(0.0)
    link.tick(3.0)
    assert state(link) is LinkState.HANDSHAKING
    link.tick(3.01)
    assert state(link) is LinkState.DISCONNECTED
    assert link.last_error == "Polar did not answer the WebSocket upgrade"


def test_a_garbage_answer_to_the_upgrade_is_a_protocol_error() -> None:
    link = new_link()
    link.wants_connection(0.0)
    link.opened(0.0)
    assert link.receive(b"SSH-2.0-OpenSSH\r\n\r\n", 1.0) == []
    assert state(link) is LinkState.DISCONNECTED
    assert link.peer_errors == 1
    assert link.last_error is not None and link.last_error.startswith("WebSocket protocol error")


# -- messages -------------------------------------------------------------------------------------


def test_messages_both_ways() -> None:
    link, peer = open_link()
    assert link.send({"type": "configuration"}) is True
    assert link.send({"type": "snapshot", "payload": {"external_customer_id": "ü"}})
    peer.feed(link.data_to_send())
    assert peer.take() == [
        {"type": "configuration"},
        {"type": "snapshot", "payload": {"external_customer_id": "ü"}},
    ]
    data = peer.send({"type": "configuration", "payload": {}}) + peer.send({"type": "x"})
    assert link.receive(data, 101.0) == [{"type": "configuration", "payload": {}}, {"type": "x"}]


def test_a_fragmented_message_arrives_whole() -> None:
    link, peer = open_link()
    assert link.receive(peer.send_text('{"type":', finished=False), 101.0) == []
    assert link.receive(peer.send_text('"snapshot"}'), 101.0) == [{"type": "snapshot"}]


def test_a_frame_that_is_not_json_is_kept_for_the_session() -> None:
    link, peer = open_link()
    [unreadable] = link.receive(peer.send_text("x" * 300), 101.0)
    assert unreadable == _Unreadable("x" * 200)
    assert state(link) is LinkState.OPEN


def test_binary_frames_are_kept_for_the_session_as_unreadable() -> None:
    link, peer = open_link()
    assert link.receive(peer.send_bytes(b"abc", finished=False), 101.0) == []
    assert link.receive(peer.send_bytes(b"defg"), 101.0) == [_Unreadable("binary frame of 4 bytes")]
    assert state(link) is LinkState.OPEN


def test_a_message_over_the_size_limit_drops_the_link() -> None:
    link, peer = open_link(settings=LinkSettings(max_message=10))
    assert link.receive(peer.send_text("x" * 6, finished=False), 101.0) == []
    assert link.receive(peer.send_text("y" * 5, finished=False), 101.0) == []
    assert state(link) is LinkState.DISCONNECTED
    assert link.peer_errors == 1
    assert link.last_error == "Polar sent a message over the size limit"


def test_a_message_at_the_size_limit_is_fine() -> None:
    link, peer = open_link(settings=LinkSettings(max_message=12))
    assert link.receive(peer.send_text('{"type":"x"}'), 101.0) == [{"type": "x"}]


def test_pings_are_answered() -> None:
    link, peer = open_link()
    assert link.receive(peer.ping(b"are you there"), 101.0) == []
    peer.feed(link.data_to_send())
    assert peer.pongs == [b"are you there"]


def test_polar_closing_the_websocket() -> None:
    link, peer = open_link()
    assert link.receive(peer.close(1001), 101.0) == []
    assert state(link) is LinkState.DISCONNECTED
    assert link.last_error == "Polar closed the WebSocket (1001)"
    # The close answer still goes out before the driver closes the socket.
    peer.feed(link.data_to_send())
    assert peer.closes == [1001]


def test_eof_drops_the_link() -> None:
    link, _ = open_link()
    assert link.receive(b"", 150.0) == []
    assert state(link) is LinkState.DISCONNECTED
    assert link.last_error == "Polar closed the connection"
    assert link.retry_at == pytest.approx(150.0 + 0.25 * 0.75)


def test_a_broken_frame_closes_with_a_protocol_error_code() -> None:
    link, _ = open_link()
    assert link.receive(b"\x8f\x00", 101.0) == []  # a reserved opcode
    assert state(link) is LinkState.DISCONNECTED
    assert link.last_error == "Polar closed the WebSocket (1002)"


# -- keepalive ------------------------------------------------------------------------------------


def test_keepalive_pings_and_gives_up_on_a_silent_peer() -> None:
    settings = LinkSettings(ping_interval=20.0, dead_after=40.0)
    link, peer = open_link(now=0.0, settings=settings)
    assert link.next_deadline() == 20.0
    link.tick(19.9)
    assert link.data_to_send() == b""
    link.tick(20.0)
    peer.feed(link.data_to_send())
    assert peer.pings == [b"outpost"]
    assert link.next_deadline() == 40.0  # the next ping and the dead limit coincide
    link.tick(30.0)
    assert link.data_to_send() == b""
    link.tick(40.0)
    peer.feed(link.data_to_send())  # Polar answers, but the answer is lost
    assert len(peer.pings) == 2
    link.tick(40.01)
    assert state(link) is LinkState.DISCONNECTED
    assert link.last_error == "no frame from Polar for 40 s"


def test_any_frame_counts_as_life() -> None:
    link, peer = open_link(now=0.0)
    link.tick(20.0)
    pong = peer.feed(link.data_to_send())
    assert link.receive(pong, 25.0) == []
    assert link.next_deadline() == 45.0
    link.tick(44.0)
    assert state(link) is LinkState.OPEN and link.data_to_send() == b""


def test_tick_does_nothing_while_disconnected_or_connecting() -> None:
    link = new_link()
    link.tick(1000.0)
    assert state(link) is LinkState.DISCONNECTED
    link.wants_connection(0.0)
    link.tick(1000.0)
    assert state(link) is LinkState.CONNECTING


# -- reconnection ---------------------------------------------------------------------------------


def test_backoff_doubles_with_jitter_up_to_the_cap() -> None:
    settings = LinkSettings(reconnect_base=1.0, reconnect_cap=8.0)
    link = Link(TARGET, "t", FixedRandom(1.0), settings)
    delays = []
    now = 0.0
    for _ in range(6):
        assert link.wants_connection(now)
        link.failed(now, "refused")
        delays.append(link.retry_at - now)
        now = link.retry_at
    assert delays == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert link.last_error == "refused"


def test_jitter_is_half_to_all_of_the_ceiling() -> None:
    low = Link(TARGET, "t", FixedRandom(0.0), LinkSettings(reconnect_base=2.0))
    low.wants_connection(0.0)
    low.failed(0.0, "x")
    assert low.retry_at == 1.0


def test_a_successful_handshake_resets_the_backoff() -> None:
    link = new_link(LinkSettings(reconnect_base=1.0))
    for now in (0.0, 10.0, 20.0):
        link.wants_connection(now)
        link.failed(now, "x")
    assert link.retry_at == 20.0 + 4.0 * 0.75
    link.wants_connection(100.0)
    link.opened(100.0)
    peer = Peer()
    peer.feed(link.data_to_send())
    link.receive(peer.accept(), 100.0)
    link.receive(b"", 101.0)
    assert link.retry_at == 101.0 + 0.75


def test_close_for_good() -> None:
    link, peer = open_link()
    link.close()
    assert state(link) is LinkState.CLOSED
    peer.feed(link.data_to_send())
    assert peer.closes == [1000]
    link.failed(200.0, "late")
    assert state(link) is LinkState.CLOSED
    assert not link.wants_connection(1e9)
    assert link.next_deadline() is None
    assert link.send({"type": "x"}) is False
    assert link.receive(peer.close(), 200.0) == []


def test_close_before_open_sends_nothing() -> None:
    link = new_link()
    link.close()
    assert (link.state, link.data_to_send()) == (LinkState.CLOSED, b"")


def test_a_connection_that_opens_after_close_is_ignored() -> None:
    link = new_link()
    assert link.wants_connection(0.0)
    link.close()  # the client closes while the driver is still connecting
    link.opened(1.0)
    assert (link.state, link.data_to_send()) == (LinkState.CLOSED, b"")


def test_a_refusal_detail_cannot_forge_a_log_line() -> None:
    link, peer = handshaking()
    body = b'{"detail": "bad token\\nERROR outpost: forged \\u001b[2J"}'
    link.receive(peer.reject(401, body), 11.0)
    assert refusal(link) is not None
    assert "\n" not in str(refusal(link)) and "\x1b" not in str(refusal(link))

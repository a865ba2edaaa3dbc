"""`outpost inspect`, `doctor`, `outbox` and the command line around them, against a real Redis
and the emulator: a healthy setup, then each failure doctor names."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any, Literal

import jsonschema
import pytest

from outpost_core import ConfigurationError
from outpost_core import _keys as keys
from outpost_emulator import Emulator
from outpost_sync import Outpost
from outpost_sync.cli import main
from tests.drivers._sync._helpers import count_meter, eventually
from tests.support.redis_cluster import RedisCluster
from tests.support.redis_server import RedisServer, free_port
from tests.support.track_and_hang import track_then_get_killed
from tests.support.wiring import wired

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "outpost_sync" / "cli" / "schemas"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], schema: str, *argv: str) -> tuple[int, Any]:
    code, out, _ = run(capsys, *argv, "--json")
    data = json.loads(out)
    jsonschema.validate(data, json.loads((SCHEMAS / f"{schema}.json").read_text()))
    return code, data


def where(
    server: RedisServer | RedisCluster, emulator: Emulator, token: str | None = None
) -> list[str]:
    return [
        "--redis-url", server.url, "--server-url", emulator.url, "--token", token or emulator.token,
    ]  # fmt: skip


def instance(server: RedisServer | RedisCluster, emulator: Emulator, **options: Any) -> Outpost:
    return Outpost(**wired(server, emulator, **options))


@contextmanager
def following_c1(
    server: RedisServer | RedisCluster, emulator: Emulator, credits: int
) -> Iterator[tuple[Outpost, str]]:
    """An instance that has read c1's balance of a new count meter granted ``credits``."""
    meter = count_meter(emulator)
    emulator.grant_credits(meter, credits, external_customer_id="c1")
    with instance(server, emulator) as a:
        a.balance(meter, external_customer_id="c1")
        yield a, meter


def inspect_json(
    capsys: pytest.CaptureFixture[str],
    server: RedisServer | RedisCluster,
    emulator: Emulator,
    meter: str,
) -> tuple[int, Any]:
    """`outpost inspect` of c1's ``meter`` with --json, checked against its schema."""
    argv = [meter, "--external-customer-id", "c1", *where(server, emulator)]
    return run_json(capsys, "inspect", "inspect", *argv)


def statuses(data: Any) -> dict[str, str]:
    return {v["check"]: v["status"] for v in data["verdicts"]}


def failed(data: Any, check: str) -> str:
    """The detail of doctor's one verdict on ``check``, which must have failed."""
    [verdict] = [v for v in data["verdicts"] if v["check"] == check]
    assert verdict["status"] == "fail", verdict
    return str(verdict["detail"])


def test_version_and_help_with_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("outpost 0.")
    with pytest.raises(SystemExit):
        main(["--help"])
    help_text = capsys.readouterr().out
    for command in ("emulator", "demo", "inspect", "doctor", "outbox", "shards"):
        assert command in help_text
    with pytest.raises(SystemExit):
        main(["emulator", "--help"])
    emulator_help = capsys.readouterr().out
    assert "address to listen on (default: 127.0.0.1)" in emulator_help
    assert "port to listen on (default: 8000)" in emulator_help


def test_a_healthy_setup(
    capsys: pytest.CaptureFixture[str],
    redis_or_cluster: RedisServer | RedisCluster,
    emulator: Emulator,
) -> None:
    redis_server = redis_or_cluster  # every command takes the URL the SDK takes
    with following_c1(redis_server, emulator, credits=100) as (a, meter):
        for _ in range(3):
            a.track("api_call", external_customer_id="c1")
        assert a.flush(10)
        # The shared rate budget's key lapses about a second after the last post: the doctor's
        # count lies between the counts taken before and after it.
        before = outpost_keys(redis_server)
        code, data = run_json(capsys, "doctor", "doctor", *where(redis_server, emulator))
        after = outpost_keys(redis_server)
        assert code == 0 and data["ok"], data
        assert set(statuses(data).values()) == {"ok"}
        [mode] = [v["detail"] for v in data["verdicts"] if v["check"] == "redis mode"]
        cluster = isinstance(redis_server, RedisCluster)
        assert mode == ("Redis Cluster, 4 primaries" if cluster else "single Redis")
        [shards] = [v["detail"] for v in data["verdicts"] if v["check"] == "shards"]
        expected = "64 shards (stored), over 4 of 4 primaries" if cluster else "16 shards (stored)"
        assert shards == expected
        [key_count] = [v["detail"] for v in data["verdicts"] if v["check"] == "keys"]
        counted = int(key_count.partition(" Outpost keys")[0])
        assert min(before, after) <= counted <= max(before, after), (before, key_count, after)
        assert key_count.endswith(" MiB"), key_count
        checks = {
            "redis",
            "redis version",
            "scripts",
            "sharded pub/sub",
            "keys",
            "shards",
            "outbox",
        }
        checks |= {"polar token", "ingest scope", "clock", "websocket"}
        assert checks <= set(statuses(data))
        code, text, _ = run(capsys, "doctor", *where(redis_server, emulator))
        assert code == 0 and "OK    websocket: configuration received" in text
        code, report = inspect_json(capsys, redis_server, emulator, meter)
        assert code == 0
        assert report["local"]["consumed"] == 3 and report["polar"]["consumed"] == 3
        assert report["local"]["balance"] == report["polar"]["balance"] == 97
        assert len(report["pending_events"]) == report["local"]["pending"]
        assert report["difference"]["verdict"] == "same"
        code, text, _ = run(
            capsys, "inspect", meter, "--external-customer-id", "c1", *where(redis_server, emulator)
        )
        assert code == 0 and "SAME: Local consumption equals Polar's." in text
        code, status = run_json(capsys, "outbox", "outbox", *where(redis_server, emulator))
        assert code == 0 and status["stranded"] == 0
        assert [c["alive"] for c in status["consumers"]] == [True]


def outpost_keys(server: RedisServer | RedisCluster) -> int:
    """How many Outpost keys there are, counted node by node on a cluster's primaries."""
    if isinstance(server, RedisServer):
        return len(server.client().keys(f"{keys.PREFIX}*"))
    total = 0
    for port in server.live_ports():
        node = server.node_client(port)
        if node.info("replication")["role"] == "master":
            total += len(node.keys(f"{keys.PREFIX}*"))
    return total


def test_doctor_on_one_node_of_a_cluster_asks_for_the_cluster_url(
    capsys: pytest.CaptureFixture[str], redis_cluster: RedisCluster, emulator: Emulator
) -> None:
    node = f"redis://127.0.0.1:{redis_cluster.live_ports()[0]}"
    code, data = run_json(
        capsys, "doctor", "doctor", "--redis-url", node, "--server-url", emulator.url,
        "--token", emulator.token,
    )  # fmt: skip
    [mode] = [v for v in data["verdicts"] if v["check"] == "redis mode"]
    assert mode["status"] == "warn" and "redis+cluster://host:port" in mode["detail"], mode
    assert code != 0  # and the checks of keys on other nodes fail with MOVED


def test_inspect_explains_undelivered_events(
    capsys: pytest.CaptureFixture[str], redis_server: RedisServer, emulator: Emulator
) -> None:
    with following_c1(redis_server, emulator, credits=10) as (a, meter):
        emulator.fault_ingest_error(503, count=1000)  # Polar unavailable: nothing delivered
        for _ in range(2):
            a.track("api_call", external_customer_id="c1")
        code, report = inspect_json(capsys, redis_server, emulator, meter)
        assert code == 0
        assert (report["local"]["consumed"], report["polar"]["consumed"]) == (2, 0)
        assert report["difference"]["verdict"] == "safe"
        assert "The 2 undelivered events account for all of it." in report["difference"]["text"]
        assert len(report["difference"]["undelivered"]) == 2
        # Polar still refuses them: closing with the default 10 s would wait them out in a flush.
        a.close(timeout=1)


def test_doctor_names_redis_down(capsys: pytest.CaptureFixture[str], emulator: Emulator) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    code, data = run_json(
        capsys, "doctor", "doctor", "--redis-url", url, "--server-url", emulator.url,
        "--token", emulator.token,
    )  # fmt: skip
    assert code == 1 and not data["ok"]
    assert statuses(data)["redis"] == "fail"
    assert statuses(data)["websocket"] == "ok"  # the rest is still checked


def test_doctor_refuses_redis_6(
    capsys: pytest.CaptureFixture[str], redis_server: RedisServer, emulator: Emulator
) -> None:
    code, data = run_json(
        capsys, "doctor", "doctor", *where(redis_server, emulator), "--redis-version", "6.2.14"
    )
    assert code == 1 and "no sharded pub/sub" in failed(data, "redis version")


def test_doctor_names_a_wrong_token(
    capsys: pytest.CaptureFixture[str], redis_server: RedisServer, emulator: Emulator
) -> None:
    code, data = run_json(capsys, "doctor", "doctor", *where(redis_server, emulator, "wrong"))
    assert code == 1
    assert "HTTP 401" in failed(data, "polar token")
    assert "HTTP 401" in failed(data, "websocket")
    assert "refused" in failed(data, "ingest scope")  # said, not dropped
    # Polar's detail, not its raw JSON body cut at 200 characters.
    assert "{" not in failed(data, "polar token"), failed(data, "polar token")


def test_json_before_the_command_is_honoured(
    capsys: pytest.CaptureFixture[str], redis_server: RedisServer, emulator: Emulator
) -> None:
    code, out, _ = run(capsys, "--json", "doctor", *where(redis_server, emulator))
    assert code == 0, out
    assert "verdicts" in json.loads(out)
    with pytest.raises(SystemExit) as refused:
        main(["--json", "emulator", "--port", "0"])
    assert refused.value.code == 2
    assert "prints no JSON" in capsys.readouterr().err


def test_inspect_says_its_errors_in_json_and_fails_when_polar_cannot_be_read(
    capsys: pytest.CaptureFixture[str], redis_server: RedisServer, emulator: Emulator
) -> None:
    with following_c1(redis_server, emulator, credits=10) as (_, meter):
        customer = ["--external-customer-id", "c1"]
        code, out, _ = run(
            capsys, "--json", "inspect", "no-such-meter", *customer, *where(redis_server, emulator)
        )
        assert code == 2 and "not in Polar's configuration" in json.loads(out)["error"]
        elsewhere = [
            "--redis-url", redis_server.url, "--server-url", f"http://127.0.0.1:{free_port()}",
            "--token", emulator.token,
        ]  # fmt: skip
        code, report = run_json(capsys, "inspect", "inspect", meter, *customer, *elsewhere)
        assert code == 1 and "could not be reached" in report["polar_error"]


def test_doctor_names_a_clock_ahead_of_polar(
    capsys: pytest.CaptureFixture[str], redis_server: RedisServer, emulator: Emulator
) -> None:
    emulator.set_time(emulator.clock.now() - timedelta(seconds=30))  # Polar 30 s behind us
    code, data = run_json(capsys, "doctor", "doctor", *where(redis_server, emulator))
    assert code == 1 and "ahead of Polar" in failed(data, "clock")


def test_stranded_entries_of_a_killed_process_are_named_and_released(
    capsys: pytest.CaptureFixture[str], redis_server: RedisServer, emulator: Emulator
) -> None:
    count_meter(emulator)
    assert track_then_get_killed(redis_server.url, emulator.url, emulator.token, 50) == 50
    client = redis_server.client()
    for key in client.scan_iter(match=keys.heartbeat_key("*")):
        client.delete(key)  # what its expiry does ten seconds later
    code, status = run_json(capsys, "outbox", "outbox", *where(redis_server, emulator))
    assert code == 1 and status["stranded"] == 50 and status["verdict"]["status"] == "fail"
    code, text, _ = run(capsys, "doctor", *where(redis_server, emulator))
    assert code == 1 and "50 entries held by gone instances" in text
    code, released = run_json(
        capsys, "outbox-release", "outbox", "release", *where(redis_server, emulator)
    )
    assert code == 0 and released["moved"] == 50 and len(released["removed_consumers"]) == 1
    # Released, waiting for an instance to start: not stranded, no call for a release again.
    code, waiting = run_json(capsys, "outbox", "outbox", *where(redis_server, emulator))
    assert code == 0 and (waiting["stranded"], waiting["released"]) == (0, 50)
    assert "outpost outbox release" not in waiting["verdict"]["detail"]
    code, text, _ = run(capsys, "outbox", *where(redis_server, emulator))
    assert "outpost outbox release" not in text
    with instance(redis_server, emulator) as survivor:
        assert survivor.flush(30)  # it takes what was released at its first survey

        def none_left() -> bool:
            code, data = run_json(capsys, "outbox", "outbox", *where(redis_server, emulator))
            return bool(code == 0 and data["total"] == 0 and data["stranded"] == 0)

        eventually(none_left, what="the released entries delivered")


def test_ctrl_c_stops_the_emulator_with_one_line_and_status_0() -> None:
    port = str(free_port())
    last = stopped_by_ctrl_c("emulator", "--port", port, ready="Polar emulator on", on="stderr")
    assert last == "outpost emulator: stopped"


def test_ctrl_c_stops_the_demo_with_one_line_and_status_0(redis_server: RedisServer) -> None:
    args = ("demo", "--plain", "--redis-url", redis_server.url)
    last = stopped_by_ctrl_c(*args, ready="", on="stdout")  # any line: it runs
    assert last == "outpost demo: stopped"


def test_an_interrupt_that_lands_in_a_finalizer_is_sent_again_once_it_is_done() -> None:
    """A finalizer (a redis-py connection's ``__del__``) would print the interrupt as ignored,
    with a traceback, and lose it: the demo's handler sends it again instead."""
    from outpost_sync.cli.demo import _raise_interrupt

    def __del__() -> FrameType:  # a frame as the collector runs a finalizer
        return sys._getframe()

    heard: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: heard.append(signum))
    try:
        _raise_interrupt(signal.SIGUSR1, __del__())  # inside a finalizer: no raise here
        deadline = time.monotonic() + 10
        while not heard and time.monotonic() < deadline:
            time.sleep(0.005)  # a handler of the main thread runs between its bytecodes
        assert heard == [signal.SIGUSR1]
        with pytest.raises(KeyboardInterrupt):
            _raise_interrupt(signal.SIGINT, sys._getframe())  # anywhere else: it stops
    finally:
        signal.signal(signal.SIGUSR1, previous)


def stopped_by_ctrl_c(*args: str, ready: str, on: Literal["stdout", "stderr"]) -> str:
    """Run ``outpost <args>`` until a line holding ``ready`` on ``on``, then press Ctrl-C as at a
    terminal; it must exit 0 without a traceback. Returns the last line it wrote to stderr."""
    process = subprocess.Popen(
        [sys.executable, "-m", "outpost_sync.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"},
        cwd=ROOT,
        preexec_fn=_ctrl_c_as_at_a_terminal,
    )
    try:
        stream = process.stdout if on == "stdout" else process.stderr
        assert stream is not None
        for line in stream:
            if ready in line:
                break
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


def _ctrl_c_as_at_a_terminal() -> None:
    # A runner started in the background inherits SIGINT ignored; a user's terminal does not.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_doctor_fails_an_eviction_policy_that_can_drop_the_outbox(
    capsys: pytest.CaptureFixture[str], redis_server: RedisServer, emulator: Emulator
) -> None:
    client = redis_server.client()
    client.config_set("maxmemory", str(1 << 30))
    client.config_set("maxmemory-policy", "allkeys-lru")
    code, data = run_json(capsys, "doctor", "doctor", *where(redis_server, emulator))
    assert code == 1 and statuses(data)["eviction"] == "fail"
    assert "outbox" in failed(data, "eviction")
    client.config_set("maxmemory-policy", "volatile-lru")
    code, data = run_json(capsys, "doctor", "doctor", *where(redis_server, emulator))
    assert statuses(data)["eviction"] == "warn"
    client.config_set("maxmemory-policy", "noeviction")
    code, data = run_json(capsys, "doctor", "doctor", *where(redis_server, emulator))
    assert statuses(data)["eviction"] == "ok"


def test_inspect_escapes_control_characters_of_event_ids(
    capsys: pytest.CaptureFixture[str], redis_server: RedisServer, emulator: Emulator
) -> None:
    with following_c1(redis_server, emulator, credits=100) as (a, meter):
        a.track("api_call", external_customer_id="c1", event_id="e1\x1b[2J\nFORGED line")
        code, text, _ = run(
            capsys, "inspect", meter, "--external-customer-id", "c1", *where(redis_server, emulator)
        )
    assert code == 0 and "e1\\x1b[2J\\nFORGED line" in text  # shown, escaped
    assert "\x1b" not in text and "\nFORGED" not in text


def test_shards_shows_the_count_and_sets_another_only_with_nothing_in_flight(
    capsys: pytest.CaptureFixture[str], redis_server: RedisServer, emulator: Emulator
) -> None:
    at = ["--redis-url", redis_server.url]
    code, data = run_json(capsys, "shards", "shards", *at)
    assert (code, data) == (0, {"shards": 16, "stored": False})
    meter = count_meter(emulator)
    with instance(redis_server, emulator) as a:
        a.balance(meter, external_customer_id="c1")
        beat = keys.heartbeat_key(a._context.consumer)
        eventually(lambda: bool(redis_server.client().exists(beat)), what="the instance's beat")
        code, _, err = run(capsys, "shards", "set", "64", *at)  # an instance is alive
        assert code == 2 and "1 instances are alive" in err and "flush() and close()" in err
    with Outpost(redis_url=redis_server.url, telemetry=False) as writer:  # no token: no delivery
        writer.track("api_call", external_customer_id="c2")
    code, _, err = run(capsys, "shards", "set", "64", *at)  # its event waits in the outbox
    assert code == 2 and "1 entries wait in the outbox streams" in err
    assert redis_server.client().get(keys.SHARDS_KEY) == b"16"
    with instance(redis_server, emulator) as a:  # drained: flush() and close()
        assert a.flush(10)
    code, data = run_json(capsys, "shards-set", "shards", "set", "64", *at)
    assert (code, data) == (0, {"shards": 64, "before": 16, "outcome": "changed"})
    code, text, _ = run(capsys, "shards", *at)
    assert (code, text) == (0, "64 shards (stored at outpost:v2:{fleet}:shards)\n")
    old = instance(redis_server, emulator, shards=16)
    try:
        with pytest.raises(ConfigurationError, match=r"configured for 16 shards .* holds 64"):
            old.balance(meter, external_customer_id="c2")
    finally:
        old.close()
    emulator.advance(6 * 60)  # the operator waits for Polar's sync: its snapshots count c2's event
    with instance(redis_server, emulator, shards=64) as wide:  # c2: shard 48 of 64, new keys
        assert wide.balance(meter, external_customer_id="c2").consumed == 1  # Polar's snapshot
        wide.track("api_call", external_customer_id="c2")
        assert wide.balance(meter, external_customer_id="c2").consumed == 2
        assert wide.flush(10)
        code, status = run_json(capsys, "outbox", "outbox", *where(redis_server, emulator))
        assert code == 0 and len(status["depth"]) == 64
    assert emulator.customer_meter(meter, external_customer_id="c2")["consumed_units"] == 2
    assert redis_server.client().exists(keys.outbox_key(48))


def test_shards_refuses_a_count_out_of_range_and_an_unreadable_stored_one(
    capsys: pytest.CaptureFixture[str], redis_server: RedisServer
) -> None:
    at = ["--redis-url", redis_server.url]
    code, _, err = run(capsys, "shards", "set", "0", *at)
    assert code == 2 and "shards must be from 1 to 1024, not 0" in err
    code, _, err = run(capsys, "shards", "set", *at)
    assert code == 2 and "needs the new count" in err
    redis_server.client().set(keys.SHARDS_KEY, "lots")
    code, _, err = run(capsys, "outbox", *at)
    assert code == 2 and "unreadable" in err
    code, data = run_json(capsys, "shards-set", "shards", "set", "32", *at)
    assert (code, data) == (0, {"shards": 32, "before": None, "outcome": "changed"})

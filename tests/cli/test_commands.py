"""`outpost inspect`, `doctor`, `outbox` and the command line around them, against a real Redis
and the emulator: a healthy setup, then each failure doctor names."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import jsonschema
import pytest

from outpost_core import _keys as keys
from outpost_emulator import Emulator
from outpost_sync import Outpost
from outpost_sync.cli import main
from tests.drivers._sync._helpers import count_meter, eventually
from tests.support.redis_server import RedisCluster, RedisServer, free_port
from tests.support.track_and_hang import track_then_get_killed

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


def instance(server: RedisServer | RedisCluster, emulator: Emulator) -> Outpost:
    return Outpost(
        access_token=emulator.token,
        server_url=emulator.url,
        redis_url=server.url,
        clock=emulator.clock,
        telemetry=False,
        linger=0.02,
    )


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
    for command in ("emulator", "demo", "inspect", "doctor", "outbox"):
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
        code, data = run_json(capsys, "doctor", "doctor", *where(redis_server, emulator))
        assert code == 0 and data["ok"], data
        assert set(statuses(data).values()) == {"ok"}
        [mode] = [v["detail"] for v in data["verdicts"] if v["check"] == "redis mode"]
        cluster = isinstance(redis_server, RedisCluster)
        assert mode == ("Redis Cluster, 3 primaries" if cluster else "single Redis")
        [key_count] = [v["detail"] for v in data["verdicts"] if v["check"] == "keys"]
        assert key_count.startswith(f"{outpost_keys(redis_server)} Outpost keys"), key_count
        checks = {"redis", "redis version", "scripts", "sharded pub/sub", "keys", "outbox"}
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

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from outpost_emulator import Emulator, EmulatorClock, EmulatorError, create_app
from outpost_emulator.cli import main
from tests.emulator.helpers import COUNT_ALL, START, START_US, auth, event, wait_for

ROOT = Path(__file__).resolve().parents[2]


def test_start_and_stop_leave_nothing_behind() -> None:
    before = set(threading.enumerate())
    with Emulator.start() as emu:
        assert emu.url == f"http://127.0.0.1:{emu.port}"
        assert emu.ws_url == f"ws://127.0.0.1:{emu.port}/v1/outpost/"
        assert emu.token == "polar_oat_local"
        with httpx.Client(base_url=emu.url, headers=auth(emu.token), verify=False) as http:
            assert http.get("/v1/meters/").status_code == 200
        port = emu.port
    # No thread of its own left (a thread an earlier test started may have ended meanwhile).
    assert set(threading.enumerate()) - before == set()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/v1/meters/", verify=False)
    emu.stop()  # idempotent
    with pytest.raises(RuntimeError):
        emu.state()


def test_two_emulators_side_by_side() -> None:
    with Emulator.start() as one, Emulator.start() as two:
        assert one.port != two.port
        one.create_customer("only-in-one")
        assert two.state()["customers"] == []


def test_a_given_port_and_a_busy_one() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with Emulator.start(port=port) as emu:
        assert emu.port == port
        with pytest.raises(RuntimeError), contextlib.redirect_stderr(io.StringIO()):
            Emulator.start(port=port, startup_timeout=5)


def test_methods_work_from_other_threads_and_running_loops() -> None:
    with Emulator.start(clock=EmulatorClock(START, frozen=True)) as emu:
        results: list[object] = []

        async def inside_a_loop() -> None:
            results.append(emu.create_customer("from-loop")["external_id"])
            results.append(emu.advance(60)["now_us"])

        thread = threading.Thread(target=lambda: asyncio.run(inside_a_loop()))
        thread.start()
        thread.join()
        assert results == ["from-loop", START_US + 60_000_000]


def test_shared_clock_and_time_methods() -> None:
    clock = EmulatorClock(START, frozen=True)
    with Emulator.start(clock=clock) as emu:
        assert emu.clock is clock
        emu.set_time(START + timedelta(hours=1))
        assert clock.now() == START + timedelta(hours=1)
        clock.advance(30)  # the SDK may move the shared clock itself
        assert emu.clock_state()["now_us"] == START_US + 3630_000_000
        assert emu.set_speed(2)["speed"] == 2.0
        assert emu.freeze(False)["frozen"] is False
        assert emu.freeze()["frozen"] is True
        with pytest.raises(ValueError):
            emu.set_time(datetime(2026, 1, 1))


def test_python_api_errors() -> None:
    with Emulator.start() as emu:
        with pytest.raises(EmulatorError) as info:
            emu.grant_credits("nope", 1, external_customer_id="c")
        assert info.value.status == 404
        with pytest.raises(EmulatorError):
            emu.fault_ingest_error(200)
        emu.create_customer("dup")
        with pytest.raises(EmulatorError) as duplicate:
            emu.create_customer("dup")
        assert duplicate.value.status == 409


def test_stop_with_open_connections_and_a_hanging_request() -> None:
    before = set(threading.enumerate())  # an earlier test's emulator may still be stopping
    emu = Emulator.start()
    emu.fault_ingest_hang(30)
    from websockets.sync.client import connect

    with connect(emu.ws_url, additional_headers=auth(emu.token)) as ws:
        client = httpx.Client(base_url=emu.url, headers=auth(emu.token), verify=False)
        worker = threading.Thread(
            target=_swallow, args=(lambda: client.post("/v1/events/ingest", json={"events": []}),)
        )
        worker.start()
        wait_for(lambda: emu.state()["counters"].get("http_ingest") == 1, "the ingest to arrive")
        with contextlib.redirect_stderr(io.StringIO()):
            emu.stop()  # cancels the hanging request after the graceful-shutdown timeout
        added = set(threading.enumerate()) - before
        assert not any(t.name.startswith("outpost-emulator") for t in added)
        worker.join()
        client.close()
        with pytest.raises(Exception):  # noqa: B017 - closed by the server, any close is fine
            ws.recv(timeout=5)


def _swallow(call: Callable[[], object]) -> None:
    with contextlib.suppress(httpx.HTTPError):
        call()


def test_create_app_is_plain_asgi() -> None:
    app = create_app(token="t", sync_delay=1.0)
    assert app.state.hub.tokens.scopes("t")


def test_cli_without_the_emulator_extra_says_what_to_install() -> None:
    # A plain `pip install polar-outpost` has the `outpost` command but neither Starlette nor
    # uvicorn: both commands answer 2 with the extra to install, not an import traceback.
    hide = "import sys; sys.modules['starlette'] = None; sys.modules['uvicorn'] = None"
    run = "from outpost_sync.cli import main; raise SystemExit(main(sys.argv[1:]))"
    for command in ("emulator", "demo"):
        done = subprocess.run(
            [sys.executable, "-c", f"{hide}; {run}", command],
            capture_output=True, text=True, timeout=60, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr
        assert f"outpost {command}: starlette and uvicorn not installed" in done.stderr
        assert "pip install 'polar-outpost[emulator]'" in done.stderr


def test_cli_help() -> None:
    with pytest.raises(SystemExit) as info, contextlib.redirect_stdout(io.StringIO()) as out:
        main(["emulator", "--help"])
    assert info.value.code == 0
    assert "--sync-delay" in out.getvalue()
    assert main(["emulator", "--speed", "0.5"]) == 2


def test_cli_runs_the_emulator_in_the_foreground() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-m", "outpost_emulator.cli", "emulator", "--port", str(port),
         "--token", "polar_oat_cli", "--speed", "2", "--sync-delay", "1"],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            try:
                return httpx.get(f"{url}/__emulator/clock", verify=False).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(up, "the CLI emulator to listen", timeout=20)
        assert httpx.get(f"{url}/__emulator/clock", verify=False).json()["speed"] == 2.0
        response = httpx.post(
            f"{url}/v1/events/ingest",
            json={"events": [event(id="cli")]},
            headers=auth("polar_oat_cli"),
            verify=False,
        )
        assert response.json() == {"inserted": 1, "duplicates": 0}
        httpx.post(f"{url}/__emulator/customers", json={"external_id": "x"}, verify=False)
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=20)
    assert "ingest: 1 event(s), inserted=1 duplicates=0" in stderr
    assert "admin POST customers" in stderr


def test_now_defaults_to_the_wall_clock() -> None:
    with Emulator.start() as emu:
        now = datetime.now(UTC)
        assert abs(emu.clock.now() - now) < timedelta(seconds=5)
        emu.create_meter("calls", COUNT_ALL, {"func": "count"})

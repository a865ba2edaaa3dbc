"""The emulator in its own process (``outpost emulator``), driven over HTTP.

Polar is remote in production: an emulator on a thread of the benchmark's process would share its
GIL with the instances measured (and, under tracemalloc, its allocations would count as theirs).
Its clock runs at wall speed from the wall time, so the instances keep the system clock.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from outpost_emulator._defaults import DEFAULT_TOKEN
from outpost_emulator.redis_server import free_port


class EmulatorProcess:
    def __init__(
        self,
        sync_delay: float = 1.0,
        rate_limit: int = 0,
        *,
        public_only: bool = False,
        recompute_delays: tuple[float, float] | None = None,
    ) -> None:
        self.port = free_port()
        self.token = DEFAULT_TOKEN
        self._log = Path(tempfile.mkstemp(prefix="outpost-bench-emulator-", suffix=".log")[1])
        args = [
            sys.executable,
            "-m",
            "outpost_emulator.cli",
            "emulator",
            "--port",
            str(self.port),
            "--sync-delay",
            str(sync_delay),
            "--log-level",
            "warning",
            "--rate-limit",
            str(rate_limit),
        ]
        if public_only:
            args.append("--public-only")
        if recompute_delays is not None:
            args += ["--recompute-delays", *(str(d) for d in recompute_delays)]
        with self._log.open("wb") as log:
            self._process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        self._http = httpx.Client(base_url=self.url, timeout=30.0)
        deadline = time.monotonic() + 20
        while True:
            try:
                if self._http.get("/__emulator/clock").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"the emulator did not start: {self._log.read_text()[-2000:]}")
            time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cpu_seconds(self) -> float | None:
        """CPU time the emulator's process has used so far (``None`` where /proc is missing)."""
        return process_cpu_seconds(self._process.pid)

    def __enter__(self) -> EmulatorProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=10)
        self._log.unlink(missing_ok=True)

    def _admin(self, name: str, body: dict[str, Any] | None = None) -> Any:
        if body is None:
            response = self._http.get(f"/__emulator/{name}")
        else:
            response = self._http.post(f"/__emulator/{name}", json=body)
        response.raise_for_status()
        return response.json()

    def create_meter(self, name: str, filter: dict[str, Any], aggregation: dict[str, Any]) -> str:
        response = self._http.post(
            "/v1/meters/",
            json={"name": name, "filter": filter, "aggregation": aggregation},
            headers={"Authorization": f"Bearer {self.token}"},
        )
        response.raise_for_status()
        return str(response.json()["id"])

    def grant_credits(self, meter_id: str, units: int, *, external_customer_id: str) -> Any:
        body = {"meter_id": meter_id, "units": units, "external_customer_id": external_customer_id}
        return self._admin("credits", body)

    def state(self) -> dict[str, Any]:
        found: dict[str, Any] = self._admin("state")
        return found

    def customer_meter(self, meter_id: str, external_customer_id: str) -> dict[str, Any]:
        """What Polar would report for the customer meter if it recomputed now."""
        body = {"meter_id": meter_id, "external_customer_id": external_customer_id}
        found: dict[str, Any] = self._admin("customer-meter", body)
        return found

    def ingest_delays(self) -> dict[str, Any]:
        found: dict[str, Any] = self._admin("ingest-delays")
        return found

    def advance(self, seconds: float) -> Any:
        return self._admin("clock", {"advance": seconds})

    def pause_syncs(self) -> Any:
        return self.set_faults({"syncs": "pause"})

    def set_faults(self, faults: dict[str, Any]) -> Any:
        return self._admin("faults", faults)

    def resume_syncs(self) -> Any:
        return self.set_faults({"syncs": "resume"})

    def ingest(self, body: bytes) -> httpx.Response:
        """A raw ``POST /v1/events/ingest``, as the baseline of delivery throughput."""
        return self._http.post(
            "/v1/events/ingest",
            content=body,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )


def process_cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system) process ``pid`` has used, from /proc; ``None`` without it."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

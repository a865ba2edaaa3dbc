from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from outpost_emulator import Emulator, EmulatorClock
from tests.emulator.helpers import START, Ws, auth


@pytest.fixture
def clock() -> EmulatorClock:
    return EmulatorClock(START, frozen=True)


@pytest.fixture
def emu(clock: EmulatorClock) -> Iterator[Emulator]:
    with Emulator.start(clock=clock) as emulator:
        yield emulator


@pytest.fixture(scope="module")
def shared_emu() -> Iterator[Emulator]:
    """One emulator for a module's tests that leave no state behind (validation errors)."""
    with Emulator.start(clock=EmulatorClock(START, frozen=True)) as emulator:
        yield emulator


@pytest.fixture(scope="module")
def shared_http(shared_emu: Emulator) -> Iterator[httpx.Client]:
    headers = auth(shared_emu.token)
    with httpx.Client(base_url=shared_emu.url, headers=headers, timeout=10, verify=False) as client:
        yield client


@pytest.fixture
def http(emu: Emulator) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=emu.url, headers=auth(emu.token), timeout=10, verify=False
    ) as client:
        yield client


@pytest.fixture
def admin(emu: Emulator) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"{emu.url}/__emulator", timeout=10, verify=False) as client:
        yield client


@pytest.fixture
def ws(emu: Emulator) -> Iterator[Ws]:
    with Ws(emu) as client:
        yield client

"""Fixtures for the example apps: a real emulator, a real redis-server, and the environment the
examples read (POLAR_ACCESS_TOKEN, POLAR_SERVER_URL, REDIS_URL, OUTPOST_METER_ID)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest

from outpost_emulator import Emulator
from tests.support.redis_server import RedisServer

API_CALLS_FILTER = {
    "conjunction": "and",
    "clauses": [{"property": "name", "operator": "eq", "value": "api_call"}],
}


@pytest.fixture
def meter_id(emulator: Emulator) -> str:
    """A meter counting `api_call` events, as the examples' READMEs create it."""
    meter = emulator.create_meter("API calls", API_CALLS_FILTER, {"func": "count"})
    return str(meter["id"])


@pytest.fixture
def app_env(
    monkeypatch: pytest.MonkeyPatch, redis_server: RedisServer, emulator: Emulator, meter_id: str
) -> str:
    """The environment an example app is started with; returns the meter id."""
    monkeypatch.setenv("POLAR_ACCESS_TOKEN", emulator.token)
    monkeypatch.setenv("POLAR_SERVER_URL", emulator.url)
    monkeypatch.setenv("REDIS_URL", redis_server.url)
    monkeypatch.setenv("OUTPOST_METER_ID", meter_id)
    return meter_id


def fresh_import(name: str) -> ModuleType:
    """Import a module that reads the environment at import time, re-running it if imported."""
    module = sys.modules.get(name)
    return importlib.reload(module) if module is not None else importlib.import_module(name)


def app_module(name: str) -> Iterator[ModuleType]:
    """For a fixture: the example's module imported afresh, its Outpost closed after the test."""
    module = fresh_import(name)
    yield module
    module.outpost.close()

"""The example apps are tested as a merchant tests an app: with the pytest plugin the package
installs (pytest_outpost: a private redis-server, the emulator in-process, the
environment the apps read), plus the meter the examples' READMEs create."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest

from pytest_outpost import Polar


@pytest.fixture
def meter_id(outpost_polar: Polar) -> str:
    """A meter counting `api_call` events, as the examples' READMEs create it."""
    return outpost_polar.create_meter("api_call", name="API calls")


@pytest.fixture
def app_env(monkeypatch: pytest.MonkeyPatch, outpost_env: dict[str, str], meter_id: str) -> str:
    """The environment an example app is started with; returns the meter id."""
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

"""examples/flask_app with Flask's test client, against the emulator and a real redis-server."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

from outpost_emulator import Emulator
from tests.examples._scenario import (
    WEBHOOK_SECRET,
    answers_webhooks,
    balance_reader,
    serves_until_the_credits_run_out,
)
from tests.examples.conftest import app_module, fresh_import


@pytest.fixture
def flask_module(app_env: str) -> Iterator[ModuleType]:
    yield from app_module("examples.flask_app.app")


def test_serves_until_the_credits_run_out(
    flask_module: ModuleType, outpost_emulator: Emulator, app_env: str
) -> None:
    client = flask_module.app.test_client()

    def get(path: str, headers: dict[str, str]) -> tuple[int, Any]:
        response = client.get(path, headers=headers)
        return response.status_code, response.get_json()

    reader = balance_reader(flask_module.outpost, app_env)
    serves_until_the_credits_run_out(get, outpost_emulator, app_env, reader)


def test_refuses_to_start_without_a_meter(app_env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OUTPOST_METER_ID")
    with pytest.raises(RuntimeError, match="OUTPOST_METER_ID"):
        fresh_import("examples.flask_app.app")


@pytest.fixture
def flask_with_webhooks(app_env: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.setenv("POLAR_WEBHOOK_SECRET", WEBHOOK_SECRET)
    yield from app_module("examples.flask_app.app")


def test_answers_polar_webhooks(
    flask_with_webhooks: ModuleType, outpost_emulator: Emulator
) -> None:
    client = flask_with_webhooks.app.test_client()

    def post(path: str, body: bytes, headers: dict[str, str]) -> int:
        return int(client.post(path, data=body, headers=headers).status_code)

    answers_webhooks(post)

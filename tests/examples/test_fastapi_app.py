"""examples/fastapi_app with Starlette's TestClient (lifespan included), against the emulator
and a real redis-server."""

from __future__ import annotations

import asyncio
import warnings
from typing import Any

import pytest
from starlette.exceptions import StarletteDeprecationWarning

from examples.fastapi_app.app import app
from outpost_async import AsyncOutpost, OutpostClosed
from outpost_core import Balance
from outpost_emulator import Emulator
from tests.examples._scenario import (
    WEBHOOK_SECRET,
    answers_webhooks,
    serves_until_the_credits_run_out,
)

with warnings.catch_warnings():
    # Starlette wants `httpx2` for its TestClient and warns when it finds only `httpx`.
    warnings.simplefilter("ignore", StarletteDeprecationWarning)
    from starlette.testclient import TestClient


def test_serves_until_the_credits_run_out(outpost_emulator: Emulator, app_env: str) -> None:
    with TestClient(app) as client:
        outpost: AsyncOutpost = app.state.outpost
        assert client.portal is not None
        portal = client.portal

        def get(path: str, headers: dict[str, str]) -> tuple[int, Any]:
            response = client.get(path, headers=headers)
            return response.status_code, response.json()

        def read_balance(customer: str) -> Balance:
            # The AsyncOutpost lives on the app's event loop: read it there.
            balance: Balance = portal.call(
                lambda: outpost.balance(app_env, external_customer_id=customer)
            )
            return balance

        serves_until_the_credits_run_out(get, outpost_emulator, app_env, read_balance)
    with pytest.raises(OutpostClosed):  # the lifespan closed it
        asyncio.run(outpost.balance(app_env, external_customer_id="alice"))


def test_refuses_to_start_without_a_meter(app_env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OUTPOST_METER_ID")
    with pytest.raises(RuntimeError, match="OUTPOST_METER_ID"), TestClient(app):
        pass


def test_answers_polar_webhooks(
    outpost_emulator: Emulator, app_env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POLAR_WEBHOOK_SECRET", WEBHOOK_SECRET)
    with TestClient(app) as client:

        def post(path: str, body: bytes, headers: dict[str, str]) -> int:
            return int(client.post(path, content=body, headers=headers).status_code)

        answers_webhooks(post)

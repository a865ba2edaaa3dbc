"""examples/django_app with Django's test client, against the emulator and a real redis-server."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType
from typing import Any

import django  # type: ignore[import-untyped]
import pytest
from django.conf import settings  # type: ignore[import-untyped]
from django.test import Client  # type: ignore[import-untyped]

from outpost_emulator import Emulator
from tests.examples._scenario import (
    WEBHOOK_SECRET,
    answers_webhooks,
    balance_reader,
    serves_until_the_credits_run_out,
)
from tests.examples.conftest import app_module


def _configure_django() -> None:
    """The example's settings, with its URLconf named from the repository root."""
    if settings.configured:
        return
    settings.configure(
        DEBUG=False,
        SECRET_KEY="outpost-tests",
        ALLOWED_HOSTS=["testserver"],
        ROOT_URLCONF="examples.django_app.outpost_site.urls",
        INSTALLED_APPS=[],
        MIDDLEWARE=["django.middleware.common.CommonMiddleware"],
        DATABASES={},
        USE_TZ=True,
    )
    django.setup()


@pytest.fixture
def metering(app_env: str) -> Iterator[ModuleType]:
    _configure_django()
    yield from app_module("examples.django_app.outpost_site.metering")


def test_serves_until_the_credits_run_out(
    metering: ModuleType, outpost_emulator: Emulator, app_env: str
) -> None:
    client = Client()

    def get(path: str, headers: dict[str, str]) -> tuple[int, Any]:
        response = client.get(path, headers=headers)
        return response.status_code, response.json()

    reader = balance_reader(metering.outpost, app_env)
    serves_until_the_credits_run_out(get, outpost_emulator, app_env, reader)


def test_other_methods_are_refused(metering: ModuleType) -> None:
    response = Client().post("/generate", headers={"X-Customer-Id": "alice"})
    assert response.status_code == 405


@pytest.fixture
def metering_with_webhooks(app_env: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.setenv("POLAR_WEBHOOK_SECRET", WEBHOOK_SECRET)
    _configure_django()
    yield from app_module("examples.django_app.outpost_site.metering")


def test_answers_polar_webhooks(
    metering_with_webhooks: ModuleType, outpost_emulator: Emulator
) -> None:
    client = Client()

    def post(path: str, body: bytes, headers: dict[str, str]) -> int:
        extra = {f"HTTP_{k.upper().replace('-', '_')}": v for k, v in headers.items()}
        response = client.post(path, data=body, content_type="application/json", **extra)
        return int(response.status_code)

    answers_webhooks(post)

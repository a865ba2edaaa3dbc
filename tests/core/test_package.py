"""The public surface of ``outpost_core``: exports and the error hierarchy."""

from __future__ import annotations

import importlib

import outpost_core
from outpost_core import errors


def test_every_export_resolves() -> None:
    assert len(outpost_core.__all__) == len(set(outpost_core.__all__))
    for name in outpost_core.__all__:
        assert getattr(outpost_core, name) is not None, name
    namespace: dict[str, object] = {}
    exec("from outpost_core import *", namespace)
    assert set(outpost_core.__all__) <= set(namespace)


def test_exports_come_from_their_modules() -> None:
    assert outpost_core.Session is importlib.import_module("outpost_core._session").Session
    assert outpost_core.SCRIPT_TEXT is importlib.import_module("outpost_core._scripts").TEXT
    assert outpost_core.SCRIPT_SHA1 is importlib.import_module("outpost_core._scripts").SHA1
    assert outpost_core.__version__ == "0.1.0"


def test_error_hierarchy() -> None:
    base = errors.OutpostError
    for name in (
        "InvalidEvent",
        "NotReady",
        "UnknownMeter",
        "UnsupportedMeter",
        "UsageError",
        "OutpostClosed",
        "RedisUnavailable",
        "NotDurable",
    ):
        error = getattr(outpost_core, name)
        assert error is getattr(errors, name)
        assert issubclass(error, base)
    assert issubclass(errors.OutpostClosed, errors.UsageError)
    assert issubclass(errors.InvalidEvent, ValueError)
    assert issubclass(errors.UnknownMeter, LookupError)
    assert not issubclass(errors.NotReady, errors.UsageError)
    assert issubclass(errors.NotDurable, errors.RedisUnavailable)  # caught where Redis failures are
    # What a caller retries with: the event's id, also when track() made it up.
    assert errors.NotDurable("on the primary only", "e1").event_id == "e1"
    assert errors.NotDurable("a hold on the primary only").event_id is None


def test_the_public_mode_module_exports_what_it_lists() -> None:
    from outpost_core import public_mode

    assert all(getattr(public_mode, name) is not None for name in public_mode.__all__)
    assert public_mode.anchor.__module__ == "outpost_core._public_anchoring"


def test_public_modules_export_what_they_name() -> None:
    """Each public module of the core re-exports what its drivers use, the same objects."""
    for public in ("doctor", "errors", "public_mode", "semconv", "telemetry", "traces"):
        module = importlib.import_module(f"outpost_core.{public}")
        for name in getattr(module, "__all__", ()):
            assert getattr(module, name) is not None, (public, name)
    traces = importlib.import_module("outpost_core.traces")
    assert traces.replay_session is importlib.import_module("outpost_core._trace").replay_session
    telemetry = importlib.import_module("outpost_core.telemetry")
    assert telemetry.Recorder is outpost_core.Recorder

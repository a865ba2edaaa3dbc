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

"""Telemetry names shared by both drivers and the TypeScript SDK (``semconv``)."""

from __future__ import annotations

from outpost_core import semconv


def names() -> dict[str, str]:
    return {k: v for k, v in vars(semconv).items() if k.isupper() and isinstance(v, str)}


def test_the_design_documents_names() -> None:
    assert semconv.INGEST_DURATION == "outpost.ingest.duration"
    assert semconv.READ_DURATION == "outpost.read.duration"
    assert semconv.SPAN_SNAPSHOT == "outpost.snapshot.received"
    assert semconv.INSTRUMENTATION == "outpost"


def test_instrument_span_and_attribute_names_are_distinct_and_namespaced() -> None:
    outcomes = {"OK", "WARM", "COLD", "INVALID", "NOT_READY", "REDIS_ERROR"}
    outcomes |= {"UNKNOWN_METER", "UNSUPPORTED_METER", "INSUFFICIENT_BALANCE", "CANNOT_ADMIT"}
    operations = {"RESERVE", "COMMIT", "RELEASE", "TRACK"}
    plain = outcomes | operations | {"INSTRUMENTATION"}
    named = {k: v for k, v in names().items() if k not in plain}
    assert len(set(named.values())) == len(named)
    for key, value in named.items():
        assert value.startswith(("outpost.", "polar.")), key
    assert {names()[k] for k in outcomes} == {
        "ok",
        "warm",
        "cold",
        "invalid",
        "not_ready",
        "redis_error",
        "unknown_meter",
        "unsupported_meter",
        "insufficient_balance",
        "cannot_admit",
    }
    assert {names()[k] for k in operations} == {"reserve", "commit", "release", "track"}


def test_no_name_is_about_metadata_or_the_token() -> None:
    for value in names().values():
        assert "metadata" not in value and "token" not in value


def test_duration_buckets_are_seconds_from_a_tenth_of_a_millisecond_to_one() -> None:
    bounds = semconv.DURATION_BOUNDARIES
    assert list(bounds) == sorted(set(bounds))
    assert (bounds[0], bounds[-1]) == (0.0001, 1.0)

"""The Python core's answers to a batch of questions, for the TypeScript differential tests: JSON
in on stdin, JSON out on stdout. Started with the repository's .venv."""

from __future__ import annotations

import json
import sys
from typing import Any

from outpost_core import Customer
from outpost_core._aggregate import format_number
from outpost_core._configuration import counts, safe_value
from outpost_core._event import build_event, customer_of
from outpost_core._filters import EventView, InvalidDefinition, parse_aggregation, parse_filter
from outpost_core._keys import state_key
from outpost_core._sql_filters import jsonb_text, sql_matches
from outpost_core.errors import OutpostError


def event_error(case: dict[str, Any]) -> Any:
    try:
        customer = customer_of(case.get("external_customer_id"), case.get("customer_id"))
        event = build_event(
            event_id="e1",
            name=case.get("name"),
            customer=customer,
            metadata=case.get("metadata"),
            timestamp_us=0,
        )
    except OutpostError as exc:
        return [type(exc).__name__, str(exc)]
    return event.ingest_item()["metadata"]


def matches(filter_: Any, event: dict[str, Any]) -> bool:
    view = EventView(name=event["name"], timestamp_s=0, metadata=event["metadata"])
    return parse_filter(filter_).matches(view)


def safe_side(case: dict[str, Any]) -> Any:
    """Polar's SQL matching, the safe side of both dialects and its value, and ->> texts."""
    filter_, event, aggregation = case["filter"], case["event"], case["aggregation"]
    view = EventView(
        name=event["name"],
        timestamp_s=event["timestamp_s"],
        metadata=event["metadata"],
        subsecond_us=event["subsecond_us"],
    )
    parsed = parse_filter(filter_)
    value = safe_value(parse_aggregation(aggregation), view) if counts(parsed, view) else None
    texts = [jsonb_text(v) for v in event["metadata"].values()]
    return [sql_matches(parsed, view), value, texts]


def definition(case: dict[str, Any]) -> Any:
    """What parsing a filter or an aggregation from Polar says: "ok" or the refusal."""
    try:
        if "filter" in case:
            parse_filter(case["filter"])
        else:
            parse_aggregation(case["aggregation"])
    except InvalidDefinition as exc:
        return str(exc)
    return "ok"


def main() -> None:
    batch = json.load(sys.stdin)
    out = {
        "numbers": [format_number(x) for x in batch["numbers"]],
        "keys": [state_key(Customer("external", i), "r") for i in batch["keys"]],
        "wide_keys": [
            state_key(Customer("external", i), "r", n)
            for i in batch["keys"]
            for n in batch.get("counts", [])
        ],
        "filters": [matches(f, e) for f, e in batch["filters"]],
        "events": [event_error(case) for case in batch["events"]],
        "sql": [safe_side(case) for case in batch.get("sql", [])],
        "definitions": [definition(case) for case in batch.get("definitions", [])],
    }
    sys.stdout.write(json.dumps(out))


if __name__ == "__main__":
    main()

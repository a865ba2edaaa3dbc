"""`outpost inspect`: one customer's local state beside Polar's own customer meter."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import httpx
import redis

from outpost_core import (
    CONFIGURATION_KEY,
    ConfigurationError,
    InvalidEvent,
    customer_of,
    events_keys,
    inspection,
    keys,
    parse_configuration,
    printable,
    redact_url,
)
from outpost_sync.cli._config import (
    add_connection_arguments,
    deployment_shards,
    fail,
    polar_client,
    print_json,
    redis_client,
    redis_failure,
    response_detail,
    text,
    text_map,
)


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "inspect",
        help="a customer's local balance beside Polar's, and why they differ",
        description="Read one customer's state for a meter from Redis (balance, Polar's part "
        "and the local part, buckets, pending events) and Polar's own customer meter, and "
        "explain the difference.",
    )
    parser.add_argument("meter_id", help="the Polar meter id")
    who = parser.add_mutually_exclusive_group(required=True)
    who.add_argument("--external-customer-id", help="the customer's external id")
    who.add_argument("--customer-id", help="the customer's Polar id (UUID)")
    add_connection_arguments(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        customer = customer_of(args.external_customer_id, args.customer_id)
    except InvalidEvent as exc:
        return fail("inspect", str(exc), args)
    client = redis_client(args)
    try:
        raw = client.get(CONFIGURATION_KEY)
        if raw is None:
            why = "no configuration in Redis: no instance with a token has run"
            return fail("inspect", why, args)
        configuration = parse_configuration(json.loads(text(raw)))
        reducer = configuration.reducer_for(args.meter_id)
        if reducer is None:
            return fail("inspect", f"meter {args.meter_id!r} is not in Polar's configuration", args)
        state_key = keys.state_key(customer, reducer.id, deployment_shards(client))
        state = text_map(client.hgetall(state_key))
        pipe = client.pipeline(transaction=False)
        for events_key in events_keys(state_key, state):
            pipe.hgetall(events_key)
        events = {
            name: value for fields in pipe.execute() for name, value in text_map(fields).items()
        }
    except (redis.RedisError, ConfigurationError) as exc:
        return fail("inspect", redis_failure(args, exc), args)
    finally:
        client.close()
    polar, polar_error = _polar_meter(args, customer.wire())
    report = inspection(
        meter_id=args.meter_id,
        customer=customer,
        reducer=reducer,
        state_fields=state,
        event_fields=events,
        now_us=time.time_ns() // 1000,
        polar_meter=polar,
    )
    report["state_key"] = state_key
    report["polar_error"] = polar_error
    if args.json:
        print_json(report)
    else:
        print(render(report))
    # Asked and not answered: the comparison with Polar is missing, which a script must see.
    return 1 if args.token and polar is None else 0


def _polar_meter(
    args: argparse.Namespace, identity: dict[str, str]
) -> tuple[dict[str, Any] | None, str | None]:
    if not args.token:
        return None, "no access token (POLAR_ACCESS_TOKEN or --token): Polar not asked"
    try:
        with polar_client(args) as http:
            response = http.get(
                "/v1/customer-meters/", params={"meter_id": args.meter_id, **identity}
            )
    except httpx.HTTPError as exc:
        return None, f"Polar at {redact_url(args.server_url)} could not be reached: {exc}"
    if response.status_code != 200:
        return None, f"Polar answered HTTP {response.status_code}: {response_detail(response)}"
    items = response.json().get("items") or []
    if not items:  # Polar creates the row on the first event or credit: none yet is all zeros
        return {"consumed_units": 0, "credited_units": 0, "balance": 0}, None
    item: dict[str, Any] = items[0]
    return item, None


def render(report: dict[str, Any]) -> str:
    local, polar = report["local"], report["polar"] or {}
    lines = [
        f"{report['customer']}, meter {report['meter_id']} "
        f"(reducer {report['reducer_id']}, {report['aggregation']})",
        f"  {'':10} {'local':>16} {'Polar':>16}",
    ]
    for name in ("balance", "credited", "consumed"):
        lines.append(f"  {name:10} {_n(local[name]):>16} {_n(polar.get(name)):>16}")
    if report["polar_error"]:
        lines.append(f"  (Polar: {report['polar_error']})")
    p, part = local["polar_part"], local["local_part"]
    lines += [
        f"  Polar's part: count {p['count']}, sum {_n(p['sum'])}; local part: count "
        f"{part['count']}, sum {_n(part['sum'])} ({local['pending']} pending, "
        f"{local['undelivered']} undelivered)",
        f"  cold_until {local['cold_until'] or '-'}; snapshot {local['snapshot_id'] or '-'}"
        + (f" ({local['snapshot_age_s']:.1f} s old)" if local["snapshot_age_s"] is not None else "")
        + f"; revision {local['revision']}",
    ]
    if report["buckets"]:
        lines.append("  buckets (local events Polar has not counted):")
        for b in report["buckets"]:
            lines.append(
                f"    {b['start']}  count {b['count']}  sum {_n(b['sum'])}  "
                f"min {_n(b['min'])}  max {_n(b['max'])}"
            )
    if report["pending_events"]:
        lines.append("  pending events:")
        for e in report["pending_events"][:50]:
            state = (
                f"acknowledged {e['acknowledged_age_s']:.1f} s ago"
                if e["acknowledged"]
                else "undelivered"
            )
            lines.append(
                f"    {e['event_id']}  bucket {e['bucket']}  value {_n(e['value'])}  {state}"
            )
        if len(report["pending_events"]) > 50:
            lines.append(f"    ... {len(report['pending_events']) - 50} more (--json lists all)")
    holds = report.get("holds") or []
    if holds:
        held, available = _n(local["held"]), _n(local["available"])
        lines.append(f"  open holds ({held} held, {available} available):")
        for h in holds:
            when = "expired" if h["expired"] else f"expires in {h['expires_in_s']:.1f} s"
            lines.append(f"    {h['hold_id']}  {_n(h['units'])} units  {when}")
    for problem in report["unreadable_fields"]:
        lines.append(f"  unreadable field: {problem}")
    lines.append(f"  {report['difference']['verdict'].upper()}: {report['difference']['text']}")
    return "\n".join(map(printable, lines))  # an id's newline or escape cannot forge a line


def _n(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return f"{value:g}" if isinstance(value, float) else str(value)

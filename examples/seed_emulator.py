"""Prepare a running `outpost emulator` for the examples: a meter and some credits.

    outpost emulator &          # Polar on http://127.0.0.1:8000, token polar_oat_local
    eval "$(python examples/seed_emulator.py --credits alice=3 --credits bob=0)"

creates a meter counting `api_call` events (as Polar's `POST /v1/meters/`), grants each customer
its credits (the emulator's admin API, `POST /__emulator/credits`), and prints the `export` lines
the examples read: POLAR_ACCESS_TOKEN, POLAR_SERVER_URL, REDIS_URL (unless already set) and
OUTPOST_METER_ID. With `--meter-id` it only grants credits to an existing meter.

The emulator takes about a second to start listening, so while the connection is refused the script
tries again, for up to `--wait` seconds (10 by default).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from collections.abc import Sequence
from typing import Any

import httpx

DEFAULT_SERVER = "http://127.0.0.1:8000"
DEFAULT_TOKEN = "polar_oat_local"
DEFAULT_WAIT = 10.0  # seconds to keep trying while the server refuses connections
RETRY_PAUSE = 0.2  # seconds between two connection attempts
API_CALLS = {
    "name": "API calls",
    "filter": {
        "conjunction": "and",
        "clauses": [{"property": "name", "operator": "eq", "value": "api_call"}],
    },
    "aggregation": {"func": "count"},
}


def _credit(text: str) -> tuple[str, int]:
    customer, sep, units = text.rpartition("=")
    if not sep or not customer:
        raise argparse.ArgumentTypeError(f"expected CUSTOMER=UNITS, got {text!r}")
    try:
        return customer, int(units)
    except ValueError:
        raise argparse.ArgumentTypeError(f"UNITS must be an integer, got {units!r}") from None


class NotListening(Exception):
    """The server still refused connections when the deadline passed."""


def _post(client: httpx.Client, path: str, body: dict[str, Any], deadline: float) -> httpx.Response:
    """POST `body`, trying again while the connection fails and `deadline` (monotonic) is ahead.

    Only connection errors are retried: the request was not sent, so sending it again is safe.
    """
    last: httpx.ConnectError | None = None
    while last is None or time.monotonic() < deadline:
        try:
            return client.post(path, json=body)
        except httpx.ConnectError as exc:
            last = exc
        time.sleep(max(0.0, min(RETRY_PAUSE, deadline - time.monotonic())))
    raise NotListening(str(last))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--server", default=os.environ.get("POLAR_SERVER_URL", DEFAULT_SERVER))
    parser.add_argument("--token", default=os.environ.get("POLAR_ACCESS_TOKEN", DEFAULT_TOKEN))
    parser.add_argument("--meter-id", help="grant credits on this meter instead of creating one")
    parser.add_argument(
        "--credits",
        type=_credit,
        action="append",
        default=[],
        metavar="CUSTOMER=UNITS",
        help="grant UNITS credits to the customer with this external id (repeatable)",
    )
    parser.add_argument(
        "--wait",
        type=float,
        default=DEFAULT_WAIT,
        metavar="SECONDS",
        help=f"retry refused connections this long (default {DEFAULT_WAIT:g})",
    )
    options = parser.parse_args(argv)
    server = options.server.rstrip("/")
    headers = {"Authorization": f"Bearer {options.token}"}
    deadline = time.monotonic() + options.wait
    with httpx.Client(base_url=server, headers=headers, timeout=10) as client:
        try:
            meter_id = options.meter_id
            if meter_id is None:
                created = _post(client, "/v1/meters/", API_CALLS, deadline)
                created.raise_for_status()
                meter_id = str(created.json()["id"])
                print(f"created meter {meter_id} (counts api_call events)", file=sys.stderr)
            for customer, units in options.credits:
                body = {"meter_id": meter_id, "external_customer_id": customer, "units": units}
                granted = _post(client, "/__emulator/credits", body, deadline)
                granted.raise_for_status()
                total = granted.json()["credited_units"]
                print(f"granted {units} to {customer} (credited: {total})", file=sys.stderr)
        except NotListening as exc:
            print(
                f"seed_emulator: cannot connect to {server} after {options.wait:g} s ({exc}); "
                "is `outpost emulator` running there?",
                file=sys.stderr,
            )
            return 1
        except httpx.HTTPError as exc:
            print(f"seed_emulator: {server}: {exc}", file=sys.stderr)
            return 1
    exports = {
        "POLAR_ACCESS_TOKEN": options.token,
        "POLAR_SERVER_URL": server,
        "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
        "OUTPOST_METER_ID": meter_id,
    }
    for name, value in exports.items():
        print(f"export {name}={shlex.quote(value)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

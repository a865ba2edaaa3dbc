"""What a driver of the public-API mode uses from the core: the mode's choice, the configuration
built from Polar's meters, the poll plan, the figures Polar reports (pages, webhooks, quantities
probes) and how one is written into a customer's state (``docs/public-mode.md``)."""

from __future__ import annotations

from ._budget import BudgetAnswered, take, wait_of
from ._event import customer_of
from ._public_anchoring import (
    Anchoring,
    anchor,
    asked_meters,
    cached_mode,
    check_mode,
    choose_mode,
    customer_of_reading,
    missing_rows,
    mode_conflict,
    no_row,
    parse_meters_page,
    public_configuration,
    urgent_requests,
)
from ._public_ledger import Outcome
from ._public_polls import (
    ID_PARAMS,
    CustomerMetersRequest,
    Followed,
    Key,
    PollPlanner,
    QuantitiesProbe,
)
from ._public_probes import (
    PROBE_LAG_US,
    followed_of,
    parse_quantities,
    probe_anchor,
    probe_params,
    quantities_path,
)
from ._public_readings import PolarReading, parse_customer_meters, parse_state_changed
from ._webhook_signature import secret_key, verify

__all__ = [
    "ID_PARAMS",
    "PROBE_LAG_US",
    "Anchoring",
    "BudgetAnswered",
    "CustomerMetersRequest",
    "Followed",
    "Key",
    "Outcome",
    "PolarReading",
    "PollPlanner",
    "QuantitiesProbe",
    "anchor",
    "asked_meters",
    "cached_mode",
    "check_mode",
    "choose_mode",
    "customer_of",
    "customer_of_reading",
    "followed_of",
    "missing_rows",
    "mode_conflict",
    "no_row",
    "parse_customer_meters",
    "parse_meters_page",
    "parse_quantities",
    "parse_state_changed",
    "probe_anchor",
    "probe_params",
    "public_configuration",
    "quantities_path",
    "secret_key",
    "take",
    "urgent_requests",
    "verify",
    "wait_of",
]

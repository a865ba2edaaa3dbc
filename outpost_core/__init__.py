"""Outpost's sans-IO core: the state machine both drivers share.

Nothing here opens a socket, starts a thread, reads a clock or draws a random number: time, event
ids and randomness come in as data, and what needs I/O goes out as effects.
"""

from __future__ import annotations

from ._aggregate import Aggregate
from ._balance import Balance
from ._configuration import Configuration, Reducer, parse_configuration
from ._echoes import Echoes
from ._effects import (
    CloseConnection,
    Effect,
    Fetch,
    ListPending,
    LoadIdentity,
    OpenConnection,
    RunScript,
    SendBytes,
    StoreConfiguration,
)
from ._event import event_id_of, timestamp_us_of
from ._inputs import (
    BytesReceived,
    ChangePublished,
    Closing,
    ConfigurationReceived,
    ConnectionFailed,
    ConnectionOpened,
    IdentityLoaded,
    Input,
    ListFailed,
    LoadFailed,
    PendingListed,
    ScriptFailed,
    ScriptReplied,
    SubscriberLost,
    SubscriberRestarted,
    SubscriptionConfirmed,
    Tick,
)
from ._keys import ALL_CHANNELS, CONFIGURATION_KEY, Customer
from ._outage import Outage, Report
from ._scripts import SHA1 as SCRIPT_SHA1
from ._scripts import TEXT as SCRIPT_TEXT
from ._session import Session, Settings
from ._time import BUCKET_US, floor_bucket, from_us, to_us
from .errors import (
    InvalidEvent,
    NotReady,
    OutpostClosed,
    OutpostError,
    RedisUnavailable,
    UnknownMeter,
    UnsupportedMeter,
    UsageError,
)

__version__ = "0.1.0"

__all__ = [
    "ALL_CHANNELS",
    "BUCKET_US",
    "CONFIGURATION_KEY",
    "SCRIPT_SHA1",
    "SCRIPT_TEXT",
    "Aggregate",
    "Balance",
    "BytesReceived",
    "ChangePublished",
    "CloseConnection",
    "Closing",
    "Configuration",
    "ConfigurationReceived",
    "ConnectionFailed",
    "ConnectionOpened",
    "Customer",
    "Echoes",
    "Effect",
    "Fetch",
    "IdentityLoaded",
    "Input",
    "InvalidEvent",
    "ListFailed",
    "ListPending",
    "LoadFailed",
    "LoadIdentity",
    "NotReady",
    "OpenConnection",
    "Outage",
    "OutpostClosed",
    "OutpostError",
    "PendingListed",
    "RedisUnavailable",
    "Reducer",
    "Report",
    "RunScript",
    "ScriptFailed",
    "ScriptReplied",
    "SendBytes",
    "Session",
    "Settings",
    "StoreConfiguration",
    "SubscriberLost",
    "SubscriberRestarted",
    "SubscriptionConfirmed",
    "Tick",
    "UnknownMeter",
    "UnsupportedMeter",
    "UsageError",
    "event_id_of",
    "floor_bucket",
    "from_us",
    "parse_configuration",
    "timestamp_us_of",
    "to_us",
]

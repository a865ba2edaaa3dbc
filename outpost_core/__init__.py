"""Outpost's sans-IO core: the state machine both drivers share.

Nothing here opens a socket, starts a thread, reads a clock or draws a random number: time, event
ids and randomness come in as data, and what needs I/O goes out as effects.
"""

from __future__ import annotations

from ._aggregate import Aggregate
from ._balance import Balance
from ._configuration import Configuration, Reducer, parse_configuration
from ._effects import Effect, LoadIdentity, RunScript, StoreConfiguration
from ._inputs import (
    ChangePublished,
    Closing,
    ConfigurationReceived,
    IdentityLoaded,
    Input,
    LoadFailed,
    ScriptReplied,
    SubscriberRestarted,
    Tick,
)
from ._keys import ALL_CHANNELS, CONFIGURATION_KEY, Customer
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
    "ChangePublished",
    "Closing",
    "Configuration",
    "ConfigurationReceived",
    "Customer",
    "Effect",
    "IdentityLoaded",
    "Input",
    "InvalidEvent",
    "LoadFailed",
    "LoadIdentity",
    "NotReady",
    "OutpostClosed",
    "OutpostError",
    "RedisUnavailable",
    "Reducer",
    "RunScript",
    "ScriptReplied",
    "Session",
    "Settings",
    "StoreConfiguration",
    "SubscriberRestarted",
    "Tick",
    "UnknownMeter",
    "UnsupportedMeter",
    "UsageError",
    "floor_bucket",
    "from_us",
    "parse_configuration",
    "to_us",
]

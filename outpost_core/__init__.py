"""Outpost's sans-IO core: the state machine both drivers share.

Nothing here opens a socket, starts a thread, reads a clock or draws a random number: time, event
ids and randomness come in as data, and what needs I/O goes out as effects.

Besides what this module exports, ``errors``, ``semconv`` and ``doctor`` (the operator commands'
verdicts) are public modules; the modules whose name starts with ``_`` are not.
"""

from __future__ import annotations

from . import _admission as admission
from . import _keys as keys
from . import _shards as shards
from ._aggregate import Aggregate
from ._backoff import backoff
from ._balance import Balance
from ._budget import BudgetAnswered, TakeRequest
from ._changes import reply_of
from ._configuration import Configuration, Reducer, parse_configuration
from ._delivery import (
    GROUP,
    BatchAnswered,
    BatchFailed,
    ClaimStale,
    Delivery,
    DeliveryEffect,
    DeliveryInput,
    DeliverySettings,
    Done,
    OutboxRead,
    PostAndSettle,
    PostBatch,
    PostedAlongside,
    ReadOutbox,
    RefreshClaim,
    ReportDropped,
    Reported,
    Settled,
    SettleScript,
    SettleScripts,
    Sleep,
    nothing_done,
    retry_after,
    with_known_revs,
)
from ._durability import Durability
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
from ._event import customer_of, event_id_of, timestamp_us_of
from ._inputs import (
    BytesReceived,
    ChangePublished,
    ChannelsLost,
    ChannelSubscribed,
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
from ._inspect import events_keys, inspection
from ._keys import CONFIGURATION_KEY, DEFAULT_SHARDS, MAX_SHARDS, SHARDS_KEY, Customer
from ._link import Link, LinkSettings, LinkState, Target
from ._liveness import (
    Beat,
    CheckHeartbeats,
    ConsumersListed,
    ForgetHeartbeat,
    HeartbeatsChecked,
    Reclaim,
    Reclaimed,
    SurveyConsumers,
    hand_back,
)
from ._options import DEFAULT_REDIS_URL, DEFAULT_SERVER_URL, ConnectionOptions, cluster_node_url
from ._outage import Outage, Report
from ._peer import printable
from ._redact import redact_url, scrub, url_secrets
from ._replies import (
    StreamEntry,
    claimed_entries,
    lost_its_data,
    published_data,
    stream_entries,
    text_of,
)
from ._scripts import SHA1 as SCRIPT_SHA1
from ._scripts import TEXT as SCRIPT_TEXT
from ._session import Session, Settings
from ._status import Status
from ._telemetry import Recorder, admission_outcome, read_outcome, track_outcome
from ._time import BUCKET_US, floor_bucket, from_us, to_us
from .errors import (
    CannotAdmit,
    ConfigurationError,
    InsufficientBalance,
    InvalidEvent,
    InvalidWebhook,
    NotDurable,
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
    "BUCKET_US",
    "CONFIGURATION_KEY",
    "DEFAULT_REDIS_URL",
    "DEFAULT_SERVER_URL",
    "DEFAULT_SHARDS",
    "GROUP",
    "MAX_SHARDS",
    "SCRIPT_SHA1",
    "SCRIPT_TEXT",
    "SHARDS_KEY",
    "Aggregate",
    "Balance",
    "BatchAnswered",
    "BatchFailed",
    "Beat",
    "BudgetAnswered",
    "BytesReceived",
    "CannotAdmit",
    "ChangePublished",
    "ChannelSubscribed",
    "ChannelsLost",
    "CheckHeartbeats",
    "ClaimStale",
    "CloseConnection",
    "Closing",
    "Configuration",
    "ConfigurationError",
    "ConfigurationReceived",
    "ConnectionFailed",
    "ConnectionOpened",
    "ConnectionOptions",
    "ConsumersListed",
    "Customer",
    "Delivery",
    "DeliveryEffect",
    "DeliveryInput",
    "DeliverySettings",
    "Done",
    "Durability",
    "Echoes",
    "Effect",
    "Fetch",
    "ForgetHeartbeat",
    "HeartbeatsChecked",
    "IdentityLoaded",
    "Input",
    "InsufficientBalance",
    "InvalidEvent",
    "InvalidWebhook",
    "Link",
    "LinkSettings",
    "LinkState",
    "ListFailed",
    "ListPending",
    "LoadFailed",
    "LoadIdentity",
    "NotDurable",
    "NotReady",
    "OpenConnection",
    "Outage",
    "OutboxRead",
    "OutpostClosed",
    "OutpostError",
    "PendingListed",
    "PostAndSettle",
    "PostBatch",
    "PostedAlongside",
    "ReadOutbox",
    "Reclaim",
    "Reclaimed",
    "Recorder",
    "RedisUnavailable",
    "Reducer",
    "RefreshClaim",
    "Report",
    "ReportDropped",
    "Reported",
    "RunScript",
    "ScriptFailed",
    "ScriptReplied",
    "SendBytes",
    "Session",
    "Settings",
    "SettleScript",
    "SettleScripts",
    "Settled",
    "Sleep",
    "Status",
    "StoreConfiguration",
    "StreamEntry",
    "SubscriberLost",
    "SubscriberRestarted",
    "SubscriptionConfirmed",
    "SurveyConsumers",
    "TakeRequest",
    "Target",
    "Tick",
    "UnknownMeter",
    "UnsupportedMeter",
    "UsageError",
    "admission",
    "admission_outcome",
    "backoff",
    "claimed_entries",
    "cluster_node_url",
    "customer_of",
    "event_id_of",
    "events_keys",
    "floor_bucket",
    "from_us",
    "hand_back",
    "inspection",
    "keys",
    "lost_its_data",
    "nothing_done",
    "parse_configuration",
    "printable",
    "published_data",
    "read_outcome",
    "redact_url",
    "reply_of",
    "retry_after",
    "scrub",
    "shards",
    "stream_entries",
    "text_of",
    "timestamp_us_of",
    "to_us",
    "track_outcome",
    "url_secrets",
    "with_known_revs",
]

"""Traces: a language-neutral record of what a core was given and what it answered.

A trace is JSON lines. The first line is a header (format, version, which machine, its settings,
the seed of its random generator); each following line is one of:

* ``{"t": "input", "input": <value>}``: an input handed to ``Session.handle``;
* ``{"t": "call", "method": "track"|"read"|"read_fetched"|"script_sent", "args": {...},
  "result": <value>}`` or with ``"error": [<class name>, <message>]`` (``script_sent``: the ticket
  a script of this instance got, which its ``ScriptReplied`` or ``ScriptFailed`` names);
* ``{"t": "effects", "effects": [<value>, ...]}``: one drain of ``Session.effects()``;
* for a delivery loop, the same ``input`` and ``effects`` records (``Delivery.handle``,
  ``Delivery.effects()``). Version 1 recorded a loop in records of its own, which replays still
  read: ``{"t": "poll", "now": s, "flushing": bool, "action": <value>}`` (a :class:`Flushing`, a
  :class:`Tick` at ``now`` and one drain) and ``{"t": "outcome", "now": s, "wall_us": µs,
  "outcome": <value>}`` (a :class:`Tick` and the answer).

Values are JSON with tagged objects: an attrs instance is ``{"$kind": <class>, <field>: ...}``,
bytes are ``{"$bytes": <hex>}``, mappings with non-string keys ``{"$map": [[k, v], ...]}``,
datetimes ``{"$datetime": <ISO>}``. Bytes the client writes to the WebSocket are recorded decoded
(``{"$kind": "SendBytes", "handshake": {...}}`` or ``"frames": [[opcode, payload], ...]``), because
the WebSocket masks them with random keys; replays compare the decoded form. See
``conformance/README.md``.

Recording and replaying are pure: the recorder hands each record to a sink the driver provides.
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

import attrs
from wsproto.frame_protocol import FrameProtocol

from . import _budget, _delivery, _effects, _inputs, _liveness
from ._aggregate import Aggregate
from ._balance import Balance
from ._keys import Customer
from ._random import Random
from ._session import Settings
from .errors import OutpostError

FORMAT = "outpost-trace"
VERSION = 2
"""The version recorded. 2: delivery loops recorded as sessions are (``input``, ``effects``);
replays read 1 too."""
READS = (1, 2)
TraceRecord = dict[str, Any]
Sink = Callable[[TraceRecord], None]

_CLASSES: dict[str, type] = {
    cls.__name__: cls
    for module in (_inputs, _effects, _delivery, _liveness, _budget)
    for cls in vars(module).values()
    if isinstance(cls, type) and attrs.has(cls)
}
_CLASSES.update(
    {c.__name__: c for c in (Aggregate, Balance, Customer, Settings, _delivery.DeliverySettings)}
)
_WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def encode(value: Any) -> Any:
    if isinstance(value, _effects.SendBytes):
        return {"$kind": "SendBytes", **_decode_client_bytes(value.data)}
    if attrs.has(type(value)):
        out: dict[str, Any] = {"$kind": type(value).__name__}
        for field in attrs.fields(type(value)):
            out[field.name] = encode(getattr(value, field.name))
        return out
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$bytes": bytes(value).hex()}
    if isinstance(value, datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, float) and not math.isfinite(value):
        return {"$float": repr(value)}
    if isinstance(value, Mapping):
        if all(isinstance(k, str) for k in value):
            return {k: encode(v) for k, v in value.items()}
        return {"$map": [[encode(k), encode(v)] for k, v in value.items()]}
    if isinstance(value, list | tuple):
        return [encode(v) for v in value]
    return value


def decode(value: Any) -> Any:
    if isinstance(value, list):
        return [decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    if "$bytes" in value:
        return bytes.fromhex(value["$bytes"])
    if "$datetime" in value:
        return datetime.fromisoformat(value["$datetime"])
    if "$float" in value:
        return float(value["$float"])
    if "$map" in value:
        return {_hashable(decode(k)): decode(v) for k, v in value["$map"]}
    kind = value.get("$kind")
    if isinstance(kind, str) and kind in _CLASSES:
        cls = _CLASSES[kind]
        fields = {f.name: f for f in attrs.fields(cls)}
        kwargs = {k: _as_field(decode(v), fields[k]) for k, v in value.items() if k in fields}
        return cls(**kwargs)
    return {k: decode(v) for k, v in value.items()}


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _as_field(value: Any, field: attrs.Attribute[Any]) -> Any:
    """JSON has no tuples: give tuple-typed fields their tuples back."""
    if isinstance(value, list) and "tuple" in str(field.type):
        return tuple(tuple(v) if isinstance(v, list) else v for v in value)
    return value


def _decode_client_bytes(data: bytes) -> dict[str, Any]:
    if data.startswith(b"GET "):
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = sorted(
            [k.strip().lower(), "<redacted>" if k.strip().lower() == "authorization" else v.strip()]
            for k, _, v in (line.partition(":") for line in lines[1:])
            if k.strip().lower() != "sec-websocket-key"  # random per connection
        )
        out: dict[str, Any] = {"handshake": {"request": lines[0], "headers": headers}}
        if rest:
            out["frames"] = _frames(rest)
        return out
    return {"frames": _frames(data)}


def _frames(data: bytes) -> list[list[Any]]:
    parser = FrameProtocol(client=False, extensions=[])
    parser.receive_bytes(data)
    out: list[list[Any]] = []
    for frame in parser.received_frames():
        payload = frame.payload
        if isinstance(payload, tuple):  # a close frame: (code, reason)
            out.append([frame.opcode.name, [int(payload[0]), payload[1]]])
        elif isinstance(payload, str):
            out.append([frame.opcode.name, payload])
        else:
            out.append([frame.opcode.name, bytes(payload).hex()])
    return out


class _RecordingMachine:
    """A sans-IO machine that records its inputs and effects to a sink; other attributes pass
    through to the machine."""

    records_no_effects = True  # whether an empty effects() is recorded too

    def __init__(self, machine: Any, sink: Sink) -> None:
        self._machine = machine
        self._sink = sink

    def __getattr__(self, name: str) -> Any:
        return getattr(self._machine, name)

    def handle(self, event: Any) -> None:
        self._sink({"t": "input", "input": encode(event)})
        self._machine.handle(event)

    def effects(self) -> list[Any]:
        out: list[Any] = self._machine.effects()
        if out or self.records_no_effects:
            self._sink({"t": "effects", "effects": encode(out)})
        return out


class RecordingSession(_RecordingMachine):
    """A ``Session`` that records its inputs, calls and effects to a sink (an empty effects()
    leaves no record)."""

    records_no_effects = False

    def track(self, **args: Any) -> Any:
        return self._call("track", args)

    def read(
        self,
        meter_id: str,
        external_customer_id: Any = None,
        customer_id: Any = None,
        *,
        fresh: bool = False,
    ) -> Any:
        args = _read_args(meter_id, external_customer_id, customer_id, fresh=fresh)
        return self._call("read", args)

    def read_fetched(
        self, meter_id: str, external_customer_id: Any, customer_id: Any, fields: Any
    ) -> Any:
        args = _read_args(meter_id, external_customer_id, customer_id, fields=fields)
        return self._call("read_fetched", args)

    def script_sent(self) -> Any:
        return self._call("script_sent", {})

    def _call(self, method: str, args: dict[str, Any]) -> Any:
        record: TraceRecord = {"t": "call", "method": method, "args": encode(args)}
        try:
            result = getattr(self._machine, method)(**args)
        except OutpostError as exc:
            record["error"] = [type(exc).__name__, str(exc)]
            self._sink(record)
            raise
        record["result"] = encode(result)
        self._sink(record)
        return result


def _read_args(
    meter_id: str, external_customer_id: Any, customer_id: Any, **more: Any
) -> dict[str, Any]:
    """A read's arguments, in the order a trace records them."""
    return {
        "meter_id": meter_id,
        "external_customer_id": external_customer_id,
        "customer_id": customer_id,
        **more,
    }


class RecordingDelivery(_RecordingMachine):
    """A ``Delivery`` that records its inputs and effects to a sink."""


def header(machine: str, settings: Any, seed: int, extra: Mapping[str, Any]) -> TraceRecord:
    return {
        "format": FORMAT,
        "version": VERSION,
        "machine": machine,
        "settings": encode(settings),
        "seed": seed,
        **extra,
    }


# -- replay -----------------------------------------------------------------------------------


@attrs.frozen
class Mismatch:
    line: int
    what: str
    expected: Any
    actual: Any


RandomFactory = Callable[[int], Random]
"""Makes the generator of a machine from its trace's seed (``random.Random`` does)."""


def replay_session(records: Iterable[TraceRecord], rng: RandomFactory) -> list[Mismatch]:
    """Feed a session trace through a fresh core; return where it answers differently."""
    from ._link import Link, Target
    from ._session import Session

    lines = iter(records)
    head = next(lines)
    _check_header(head, "session")
    settings = decode(head["settings"])
    link = None
    if head.get("server_url"):
        link = Link(Target.of(head["server_url"]), "replay", rng(head["seed"]))
    session = Session(settings, link=link)
    mismatches: list[Mismatch] = []
    nonce: bytes | None = None
    for number, record in enumerate(lines, start=2):
        kind = record["t"]
        if kind == "input":
            event = decode(record["input"])
            if isinstance(event, _inputs.BytesReceived) and nonce is not None:
                event = attrs.evolve(event, data=_reaccept(event.data, nonce))
            session.handle(event)
        elif kind == "effects":
            effects = session.effects()
            for effect in effects:
                if isinstance(effect, _effects.SendBytes) and effect.data.startswith(b"GET "):
                    nonce = _nonce_of(effect.data) or nonce
            if encode(effects) != record["effects"]:
                mismatches.append(Mismatch(number, "effects", record["effects"], encode(effects)))
        elif kind == "call":
            args = decode(record["args"])
            try:
                result = encode(getattr(session, record["method"])(**args))
                got: dict[str, Any] = {"result": result}
            except OutpostError as exc:
                got = {"error": [type(exc).__name__, str(exc)]}
            wanted = {k: record[k] for k in ("result", "error") if k in record}
            if got != wanted:
                mismatches.append(Mismatch(number, record["method"], wanted, got))
    return mismatches


def replay_delivery(records: Iterable[TraceRecord], rng: RandomFactory) -> list[Mismatch]:
    """Feed a delivery trace through a fresh ``Delivery``; return where it acts differently."""
    lines = iter(records)
    head = next(lines)
    _check_header(head, "delivery")
    settings = decode(head["settings"])
    first = head.get("started_at", 0.0)
    delivery = _delivery.Delivery(settings, rng(head["seed"]), first)
    wall_us = 0  # (version 1: a poll dates from the latest outcome's wall clock)
    mismatches: list[Mismatch] = []
    for number, record in enumerate(lines, start=2):
        kind = record["t"]
        if kind == "input":
            delivery.handle(decode(record["input"]))
        elif kind == "outcome":
            wall_us = record["wall_us"]
            delivery.handle(_inputs.Tick(record["now"], wall_us))
            delivery.handle(decode(record["outcome"]))
        elif kind in ("effects", "poll"):
            if kind == "poll":
                delivery.handle(_delivery.Flushing(bool(record.get("flushing"))))
                delivery.handle(_inputs.Tick(record["now"], wall_us))
                recorded = [record["action"]]
            else:
                recorded = record["effects"]
            effects = encode(delivery.effects())
            if not recorded_as(recorded, effects):
                mismatches.append(Mismatch(number, "effects", recorded, effects))
                break  # the recorded inputs answer the recorded effects, not these
    return mismatches


def recorded_as(recorded: Any, actual: Any) -> bool:
    """Whether a value a replay made is the one recorded. A field the record lacks was added to
    its class after the recording: it matches when the replay left it null."""
    if isinstance(recorded, dict) and isinstance(actual, dict):
        return recorded.keys() <= actual.keys() and all(
            recorded_as(recorded[k], v) if k in recorded else v is None for k, v in actual.items()
        )
    if isinstance(recorded, list) and isinstance(actual, list):
        return len(recorded) == len(actual) and all(map(recorded_as, recorded, actual))
    return bool(recorded == actual)


def _check_header(head: TraceRecord, machine: str) -> None:
    if head.get("format") != FORMAT or head.get("version") not in READS:
        raise ValueError(f"not an {FORMAT} v1 or v2 trace: {head!r:.200}")
    if head.get("machine") != machine:
        raise ValueError(f"a {head.get('machine')} trace, not a {machine} trace")


_KEY_HEADER = re.compile(rb"(?im)^sec-websocket-key:[ \t]*([^\r\n]+?)[ \t]*\r?$")


def _nonce_of(request: bytes) -> bytes | None:
    match = _KEY_HEADER.search(request)
    return match.group(1) if match else None


def _reaccept(data: bytes, nonce: bytes) -> bytes:
    """Rewrite a recorded 101 answer for the replay's own random handshake key."""
    marker = b"sec-websocket-accept:"
    lower = data.lower()
    start = lower.find(marker)
    if start < 0:
        return data
    end = data.find(b"\r\n", start)
    accept = base64.b64encode(hashlib.sha1(nonce + _WS_GUID).digest())
    return data[: start + len(marker)] + b" " + accept + data[end:]

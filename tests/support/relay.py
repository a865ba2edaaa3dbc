"""What the emulator's telemetry relay received, decoded (OTLP/protobuf)."""

from __future__ import annotations

import base64

from outpost_core import semconv
from outpost_emulator import Emulator


def relayed_customers(emulator: Emulator) -> list[dict[str, set[str]]]:
    """Per metrics export the relay received: the customers each instrument names, and the
    left-out counter's total under ``semconv.SERIES_LEFT_OUT`` (as a one-element set)."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
    )

    exports: list[dict[str, set[str]]] = []
    for item in emulator.telemetry()["metrics"]:
        request = ExportMetricsServiceRequest()
        request.ParseFromString(base64.b64decode(str(item["body_base64"])))
        named: dict[str, set[str]] = {}
        for resource_metrics in request.resource_metrics:
            for scope in resource_metrics.scope_metrics:
                for metric in scope.metrics:
                    kind = metric.WhichOneof("data")
                    points = getattr(metric, kind).data_points
                    if metric.name == semconv.SERIES_LEFT_OUT:
                        named[metric.name] = {str(sum(p.as_int for p in points))}
                        continue
                    named[metric.name] = {
                        a.value.string_value
                        for p in points
                        for a in p.attributes
                        if a.key == semconv.CUSTOMER
                    }
        exports.append(named)
    return exports

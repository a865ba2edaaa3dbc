"""I/O helpers that both drivers use as they are, owned by neither.

They hold no ``async`` code, so nothing generates them: TLS contexts (``tls``), the WebSocket's
proxy tunnel (``proxy``), event ids (``ids``), reading raw pub/sub replies (``pubsub``), the
OpenTelemetry adapter for the core's telemetry policy (``telemetry``) and conformance trace files
(``traces``). They cannot live in ``outpost_core``, which does no I/O; a package of their own keeps
``import outpost_sync`` from loading the async driver, and the other way round.
"""

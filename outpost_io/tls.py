"""The one TLS context an instance opens Polar's WebSocket and its ingestion requests with.

``verify`` takes what httpx's ``verify`` takes, so both connections trust the same certificates:
``True`` is httpx's own default (``SSL_CERT_FILE`` or ``SSL_CERT_DIR`` when set, else certifi's
bundle), a path is a CA bundle file (or a directory of hashed certificates), and an
``ssl.SSLContext`` is used as it is. ``False`` is refused: an SDK that bills must not talk to
whoever answers; a context with verification off can still be passed, deliberately.
"""

from __future__ import annotations

import os
import socket
import ssl

import certifi

from outpost_core import UsageError

Verify = ssl.SSLContext | str | os.PathLike[str] | bool


def tls_context(verify: Verify) -> ssl.SSLContext:
    """The context, at construction (a missing or unreadable bundle raises here), shared by the
    instances of a process that name the same bundle."""
    if isinstance(verify, ssl.SSLContext):
        return verify
    if verify is False:
        raise UsageError(
            "verify=False is not supported: pass a CA bundle, or an ssl.SSLContext built for it"
        )
    if verify is True:
        cafile = os.environ.get("SSL_CERT_FILE") or None
        capath = None if cafile else os.environ.get("SSL_CERT_DIR") or None
        if cafile is None and capath is None:
            cafile = certifi.where()
        return _load(cafile, capath)
    if not isinstance(verify, str | os.PathLike):
        raise UsageError(f"verify must be a bool, a path or an ssl.SSLContext, not {verify!r}")
    path = os.fspath(verify)
    return _load(None, path) if os.path.isdir(path) else _load(path, None)


def _load(cafile: str | None, capath: str | None) -> ssl.SSLContext:
    """The context of a bundle, made once a process for each version of it: loading certifi's
    bundle takes about 20 ms, nearly all of an instance's construction. A bundle whose file
    changed (its size or time) is loaded again and replaces the one kept (a process that sees
    its bundle rotated keeps one context, not one per version); a context is only read once
    made, so instances share it."""
    path = cafile or capath
    try:
        seen = os.stat(path) if path is not None else None
        version = None if seen is None else (seen.st_mtime_ns, seen.st_size, seen.st_ino)
        kept = _CONTEXTS.get((cafile, capath))
        if kept is not None and kept[0] == version:
            return kept[1]
        context = ssl.create_default_context(cafile=cafile, capath=capath)
        _CONTEXTS[(cafile, capath)] = (version, context)
        return context
    except (OSError, ssl.SSLError) as exc:
        raise UsageError(f"cannot load the CA certificates {path!r}: {exc}") from exc


_CONTEXTS: dict[tuple[str | None, str | None], tuple[tuple[int, int, int] | None, ssl.SSLContext]]
_CONTEXTS = {}


def ca_bundle(verify: Verify) -> str | None:
    """The bundle's path, for clients that take only a path (the telemetry exporter)."""
    if isinstance(verify, str | os.PathLike):
        return os.fspath(verify)
    return None


def describe(exc: BaseException, host: str) -> str | None:
    """A sentence naming a certificate that did not verify, when ``exc`` (or what caused it) is
    one; ``None`` otherwise."""
    seen: BaseException | None = exc
    for _ in range(8):  # httpx wraps httpcore's error, which wraps ssl's
        if seen is None:
            return None
        if isinstance(seen, ssl.SSLCertVerificationError):
            why = seen.verify_message or str(seen)
            return (
                f"the TLS certificate of {host} did not verify ({why}): pass the CA that signed "
                "it with verify="
            )
        seen = seen.__cause__ or seen.__context__
    return None


def cannot_connect(exc: BaseException, host: str, port: int) -> str:
    """Why a connection to ``host:port`` could not be opened, in the words an operator searches
    for (a certificate that did not verify says how to fix it)."""
    return describe(exc, host) or f"cannot connect to {host}:{port}: {_reason(exc)}"


def _reason(exc: BaseException) -> str:
    """What went wrong opening a connection, in the words an operator searches for."""
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (nothing listens there)"
    if isinstance(exc, socket.gaierror):
        return f"the name does not resolve ({exc.strerror or exc})"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS certificate not trusted ({exc.verify_message or exc})"
    if isinstance(exc, ssl.SSLError):
        return f"TLS failed ({exc})"
    if isinstance(exc, TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__

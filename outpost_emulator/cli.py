"""The emulator's command line (`outpost emulator`): its flags and its foreground run."""

from __future__ import annotations

import argparse
import functools
import importlib
import ipaddress
import logging
import socket
import sys

from outpost_emulator._defaults import DEFAULT_TOKEN
from outpost_emulator._limits import DEFAULT_REQUESTS_PER_MINUTE

EXTRA = ("starlette", "uvicorn")  # what the `emulator` extra installs


def add_emulator_arguments(emulator: argparse.ArgumentParser) -> None:
    """The `emulator` command's flags (the `outpost` command line adds the same)."""
    emulator.add_argument("--host", default="127.0.0.1", help="address to listen on")
    emulator.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow a --host other than a loopback address (the admin API has no authentication)",
    )
    emulator.add_argument("--port", type=int, default=8000, help="port to listen on")
    emulator.add_argument("--speed", type=float, default=1.0, help="clock speed factor (>= 1)")
    emulator.add_argument(
        "--token", default=DEFAULT_TOKEN, help="the organization access token it accepts"
    )
    emulator.add_argument(
        "--sync-delay", type=float, default=10.0, help="seconds after a bucket closes to sync it"
    )
    emulator.add_argument(
        "--rate-limit",
        type=int,
        default=DEFAULT_REQUESTS_PER_MINUTE,
        help="API requests a minute Polar admits before 429 (Polar: 500, sandbox 100; 0: none)",
    )
    emulator.add_argument(
        "--public-only",
        action="store_true",
        help="serve Polar's public API only: no /v1/outpost/, customer meters recomputed by "
        "Polar's debounced job, signed customer.state_changed webhooks, meter quantities",
    )
    emulator.add_argument(
        "--recompute-delays",
        type=float,
        nargs=2,
        metavar=("MIN", "MAX"),
        default=(15.0, 10800.0),
        help="public API: seconds after the last ingest a customer meter is recomputed, and "
        "at most between recomputes under continuous traffic (Polar: 15 and 10800)",
    )
    emulator.add_argument(
        "--replica-lag",
        type=float,
        default=0.0,
        help="public API: seconds the replica that meter quantities read lags behind",
    )
    emulator.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning"], help="log level"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="outpost", description="The Polar emulator.")
    commands = parser.add_subparsers(dest="command", required=True)
    emulator = commands.add_parser(
        "emulator",
        help="run a local Polar emulator in the foreground (Ctrl-C stops it)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_emulator_arguments(emulator)
    return parser


def main(argv: list[str] | None = None) -> int:
    """`python -m outpost_emulator.cli emulator ...`: the emulator alone (the `outpost` command
    of the SDK offers the same `emulator` command beside its others)."""
    args = _parser().parse_args(argv)
    problem = missing_extra(args.command)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    try:
        return run_emulator(args)
    except KeyboardInterrupt:
        print("outpost emulator: stopped", file=sys.stderr)
        return 0


def missing_extra(command: str, modules: tuple[str, ...] = EXTRA) -> str | None:
    """What `outpost <command>` says when a module of the `emulator` extra is not installed
    (``None``: every one is); the `outpost` command line asks the same for `demo`."""
    missing: list[str] = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if not missing:
        return None
    return (
        f"outpost {command}: {' and '.join(missing)} not installed; they come with the "
        "emulator extra: pip install 'polar-outpost[emulator]'"
    )


def _loopback_address(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def run_emulator(args: argparse.Namespace) -> int:
    """Run the emulator in the foreground until Ctrl-C (or SIGTERM)."""
    import uvicorn

    from outpost_emulator._clock import EmulatorClock
    from outpost_emulator._server import transport_finder, uvicorn_config
    from outpost_emulator._state import Hub
    from outpost_emulator.app import create_app

    if not args.speed >= 1:
        print("outpost emulator: --speed must be >= 1", file=sys.stderr)
        return 2
    local = _loopback_address(args.host)
    if not local and not args.allow_remote:
        print(
            f"outpost emulator: --host {args.host} serves other machines, and the admin API "
            "(/__emulator/: clock, credits, tokens) has no authentication: pass --allow-remote "
            "to do it anyway",
            file=sys.stderr,
        )
        return 2
    if not local:
        print(
            f"outpost emulator: WARNING: serving {args.host} to other machines; the admin API "
            "(/__emulator/) has no authentication: anyone who reaches this port can set the clock, "
            "grant credits and read the tokens",
            file=sys.stderr,
        )
    level = getattr(logging, args.log_level.upper())
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    hub = Hub(
        clock=EmulatorClock(speed=args.speed),
        token=args.token,
        sync_delay=args.sync_delay,
        rate_limit=args.rate_limit,
        public_only=args.public_only,
        recompute_delays=tuple(args.recompute_delays),
        replica_lag=args.replica_lag,
    )
    hub.remote_admin = not local
    announce = functools.partial(
        logging.getLogger("outpost_emulator").info,
        "Polar emulator on http://%s:%d (%s, dashboard http://%s:%d/), token %r, speed %g",
        args.host,
        args.port,
        "public API only"
        if args.public_only
        else f"WebSocket ws://{args.host}:{args.port}/v1/outpost/",
        args.host,
        args.port,
        args.token,
        args.speed,
    )

    class AnnouncingServer(uvicorn.Server):
        """Says it is ready once it serves: by then Ctrl-C is uvicorn's to handle (a Ctrl-C
        while the event loop was still being built ended in a traceback)."""

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started:
                announce()

    server = AnnouncingServer(
        uvicorn_config(create_app(hub=hub), args.host, args.port, log_config=None, log_level=level)
    )
    hub.transport_finder = transport_finder(server)
    server.run()  # until Ctrl-C or SIGTERM, which uvicorn turns into a graceful shutdown
    print("outpost emulator: stopped", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

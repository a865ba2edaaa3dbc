"""The emulator's command line (`outpost emulator`): its flags and its foreground run."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from outpost_emulator._defaults import DEFAULT_TOKEN
from outpost_emulator._limits import DEFAULT_REQUESTS_PER_MINUTE

EXTRA = ("starlette", "uvicorn")  # what the `emulator` extra installs


def add_emulator_arguments(emulator: argparse.ArgumentParser) -> None:
    """The `emulator` command's flags (the `outpost` command line adds the same)."""
    emulator.add_argument("--host", default="127.0.0.1", help="address to listen on")
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
    missing = _missing(EXTRA)
    if missing:
        print(
            f"outpost {args.command}: {' and '.join(missing)} not installed; they come with the "
            "emulator extra: pip install 'polar-outpost[emulator]'",
            file=sys.stderr,
        )
        return 2
    try:
        return run_emulator(args)
    except KeyboardInterrupt:
        print("outpost emulator: stopped", file=sys.stderr)
        return 0


def _missing(modules: tuple[str, ...]) -> list[str]:
    missing: list[str] = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


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
    level = getattr(logging, args.log_level.upper())
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    hub = Hub(
        clock=EmulatorClock(speed=args.speed),
        token=args.token,
        sync_delay=args.sync_delay,
        rate_limit=args.rate_limit,
    )
    server = uvicorn.Server(
        uvicorn_config(create_app(hub=hub), args.host, args.port, log_config=None, log_level=level)
    )
    hub.transport_finder = transport_finder(server)
    logging.getLogger("outpost_emulator").info(
        "Polar emulator on http://%s:%d (WebSocket ws://%s:%d/v1/outpost/), token %r, speed %g",
        args.host,
        args.port,
        args.host,
        args.port,
        args.token,
        args.speed,
    )
    server.run()  # until Ctrl-C or SIGTERM, which uvicorn turns into a graceful shutdown
    print("outpost emulator: stopped", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

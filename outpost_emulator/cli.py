"""The `outpost` command line: `outpost emulator`, `outpost demo`."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable
from typing import Any

from outpost_emulator._defaults import DEFAULT_TOKEN
from outpost_emulator._limits import DEFAULT_REQUESTS_PER_MINUTE

EXTRA = ("starlette", "uvicorn")  # what the `emulator` extra installs


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="outpost", description="Polar Outpost tools.")
    commands = parser.add_subparsers(dest="command", required=True)

    emulator = commands.add_parser("emulator", help="run a local Polar emulator (foreground)")
    emulator.add_argument("--host", default="127.0.0.1")
    emulator.add_argument("--port", type=int, default=8000)
    emulator.add_argument("--speed", type=float, default=1.0, help="clock speed factor (>= 1)")
    emulator.add_argument("--token", default=DEFAULT_TOKEN, help="organization access token")
    emulator.add_argument(
        "--sync-delay", type=float, default=10.0, help="seconds after a bucket closes to sync it"
    )
    emulator.add_argument(
        "--rate-limit",
        type=int,
        default=DEFAULT_REQUESTS_PER_MINUTE,
        help="API requests a minute Polar admits before 429 (Polar: 500, sandbox 100; 0: none)",
    )
    emulator.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])

    # Every argument after `demo`, options and --help included, goes to the demo's own parser
    # (a subparser with no "-" options captures `--fast` instead of refusing it).
    demo = commands.add_parser(
        "demo",
        help="run the Outpost demo (`outpost demo --help` for its options)",
        prefix_chars="+",
        add_help=False,
    )
    demo.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the demo")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    missing = _missing(EXTRA)
    if missing:
        print(
            f"outpost {args.command}: {' and '.join(missing)} not installed; they come with the "
            "emulator extra: pip install 'polar-outpost[emulator]'",
            file=sys.stderr,
        )
        return 2
    if args.command == "demo":
        return _demo(list(args.args))
    return _emulator(args)


def _missing(modules: tuple[str, ...]) -> list[str]:
    missing: list[str] = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


def _emulator(args: argparse.Namespace) -> int:
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
    server.run()
    return 0


def _demo(args: list[str]) -> int:
    module = importlib.import_module("outpost_emulator.demo")
    demo_main: Callable[[list[str]], Any] = module.main
    result = demo_main(args)
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    raise SystemExit(main())

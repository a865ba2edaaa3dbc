"""The `outpost` command line: `emulator`, `demo`, and the operator's `inspect`, `doctor`,
`outbox` and `shards`. Each command reads the SDK's own configuration (`POLAR_ACCESS_TOKEN`,
`REDIS_URL`, `POLAR_SERVER_URL`, or the flags) and uses the SDK's code: the core computes, the
command prints.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from outpost_core import __version__, url_secrets
from outpost_emulator.cli import add_emulator_arguments, missing_extra, run_emulator
from outpost_sync.cli._scrub import scrubbed_output

Command = Callable[[argparse.Namespace], int]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="outpost",
        description="Polar Outpost: a local copy of usage in your Redis, and the tools around it.",
    )
    parser.add_argument("--version", action="version", version=f"outpost {__version__}")
    # Also accepted after the command; a separate name, since a subcommand's default would
    # overwrite a shared one.
    parser.add_argument(
        "--json",
        dest="json_before_command",
        action="store_true",
        help="print JSON for scripts (inspect, doctor, outbox, shards; also after the command)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _emulator_parser(commands)
    # Every argument after `demo`, options and --help included, goes to the demo's own parser
    # (a subparser with no "-" options captures `--fast` instead of refusing it).
    demo = commands.add_parser(
        "demo",
        help="run the demo: the emulator, two instances sharing a Redis, a verdict "
        "(`outpost demo --help` for its options)",
        prefix_chars="+",
        add_help=False,
    )
    demo.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the demo")
    from outpost_sync.cli import _doctor, _inspect, _outbox, _shards

    _inspect.add_parser(commands)
    _doctor.add_parser(commands)
    _outbox.add_parser(commands)
    _shards.add_parser(commands)
    return parser


def _emulator_parser(commands: Any) -> None:
    emulator = commands.add_parser(
        "emulator",
        help="run a local Polar emulator in the foreground (Ctrl-C stops it)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_emulator_arguments(emulator)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.json_before_command:
        if not hasattr(args, "json"):
            parser.error(f"--json: `outpost {args.command}` prints no JSON")
        args.json = True
    if args.command in ("emulator", "demo"):
        problem = missing_extra(args.command)
        if problem:
            print(problem, file=sys.stderr)
            return 2
    try:
        if args.command == "demo":
            module = importlib.import_module("outpost_sync.cli.demo")
            return int(module.main(list(args.args)))
        if args.command == "emulator":
            return run_emulator(args)
        run: Command = args.run
        with scrubbed_output(_secrets_of(args)):
            return run(args)
    except KeyboardInterrupt:
        print(f"outpost {args.command}: stopped", file=sys.stderr)
        return 0


if __name__ == "__main__":
    raise SystemExit(main())


def _secrets_of(args: argparse.Namespace) -> list[str]:
    """What the command must never print: the token, the Redis and proxies' passwords."""
    found = [getattr(args, "token", None) or ""]
    for url in (getattr(args, "redis_url", None), *urllib.request.getproxies().values()):
        found += url_secrets(url) if url else []
    return [s for s in found if s]

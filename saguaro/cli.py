"""The `saguaro` command: a thin layer from flags to library calls.

Each subcommand lives in `saguaro/commands/<name>.py` and exposes `add_parser(subparsers)` and
`run(args) -> int`. Heavy imports (torch, transformers) happen inside `run`, so `saguaro theory`
starts without torch.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

COMMANDS: tuple[str, ...] = ("generate", "models", "theory", "simulate", "plan", "bench", "report", "serve", "calibrate")


class CliError(Exception):
    """A user error found by a command: printed as one line, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="saguaro",
        description="Speculative Speculative Decoding: generation, simulation, theory and reports.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f"saguaro.commands.{name}")
        module.add_parser(sub).set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s: %(message)s",
    )
    try:
        return int(args._run(args) or 0)
    except (ValueError, CliError, FileNotFoundError) as err:
        # Bad input: one clear line, no traceback (exit 2, like argparse's own errors).
        print(f"saguaro {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("saguaro: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""The `saguaro` command: a thin layer from flags to library calls.

Each subcommand lives in `saguaro/commands/<name>.py` and exposes `add_parser(subparsers)` and
`run(args) -> int`. Heavy imports (torch, transformers) happen inside `run`, so `saguaro theory`
starts without torch.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import logging
import sys

from saguaro import version

COMMANDS: tuple[str, ...] = (
    "generate",
    "models",
    "theory",
    "simulate",
    "plan",
    "bench",
    "report",
    "serve",
    "calibrate",
    "validate",
)


class CliError(Exception):
    """A user error found by a command: printed as one line, exit status 2."""


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """--help that shows every option's default (when it has one: not None, False or an empty list) and keeps
    the description's line breaks. Commands pass it as formatter_class."""

    @staticmethod
    def default_text(action: argparse.Action) -> str | None:
        default = action.default
        if (
            not action.option_strings
            or default is None
            or default is False
            or default is argparse.SUPPRESS
            or action.help == argparse.SUPPRESS
            or "%(default)" in (action.help or "")
        ):
            return None
        if isinstance(default, (list, tuple)):
            return "default: " + " ".join(map(str, default)) if default else None
        return f"default: {default}"

    def _get_help_string(self, action: argparse.Action) -> str:
        text = (action.help or "").strip()
        default = self.default_text(action)
        if default is None:
            return text
        default = default.replace("%", "%%")  # the help text is %-formatted next
        return f"{text} ({default})" if text else default

    def _format_action(self, action: argparse.Action) -> str:
        if not action.help and self.default_text(action) is not None:
            action = copy.copy(action)  # an option without help text still shows its default
            action.help = self.default_text(action).replace("%", "%%")
            action.default = None  # shown already
        return super()._format_action(action)


PROGRESS_LOGGERS = ("saguaro", "engine", "server")  # the packages whose INFO lines are progress


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="saguaro",
        description="Speculative Speculative Decoding: generation, simulation, theory and reports.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {version()}",
        help="print the version (saguaro X.Y.Z) and exit",
    )
    _add_verbosity(parser, argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f"saguaro.commands.{name}")
        command = module.add_parser(sub)
        command.set_defaults(_run=module.run)
        _add_verbosity(command, argparse.SUPPRESS)  # `saguaro bench -q ...` works as well as `saguaro -q bench`
    return parser


def _add_verbosity(parser: argparse.ArgumentParser, default) -> None:
    taken = {s for action in parser._actions for s in action.option_strings}
    if taken & {"-v", "--verbose", "-q", "--quiet"}:
        return
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=default,
        help="progress lines on stderr even when it is not a terminal, with times and sources",
    )
    group.add_argument(
        "-q", "--quiet", action="store_true", default=default, help="no progress lines (warnings and errors only)"
    )


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time (a test's capture, a redirected stream)."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


class _Formatter(logging.Formatter):
    """Progress (INFO) lines as they are; warnings and errors with their level."""

    def __init__(self, verbose: bool) -> None:
        super().__init__("%(asctime)s %(name)s %(levelname)s: %(message)s" if verbose else None)
        self.verbose = verbose

    def format(self, record: logging.LogRecord) -> str:
        if self.verbose:
            return super().format(record)
        text = record.getMessage()
        return text if record.levelno < logging.WARNING else f"{record.levelname.lower()}: {text}"


def progress_shown(verbose: bool, quiet: bool, stderr=None) -> bool:
    """INFO progress lines: with -v always, with -q never, else when stderr is a terminal (so that a script's
    captured stderr holds only what went wrong)."""
    if quiet:
        return False
    if verbose:
        return True
    stream = sys.stderr if stderr is None else stderr
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def configure_logging(verbose: bool = False, quiet: bool = False) -> bool:
    """One stderr handler on the root logger (replacing one an earlier call installed): warnings from
    everything, and the progress lines of saguaro, engine and server unless they are off. Returns whether
    progress lines are shown."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, _StderrHandler)]:
        root.removeHandler(handler)
    show = progress_shown(verbose, quiet)
    handler = _StderrHandler()
    handler.setFormatter(_Formatter(verbose))
    handler.addFilter(
        lambda record: (
            record.levelno >= logging.WARNING
            or (show and record.levelno >= logging.INFO and record.name.split(".")[0] in PROGRESS_LOGGERS)
        )
    )
    root.addHandler(handler)
    if root.level == logging.NOTSET or root.level > logging.WARNING:
        root.setLevel(logging.WARNING)
    for name in PROGRESS_LOGGERS:
        logger = logging.getLogger(name)
        if show and (logger.level == logging.NOTSET or logger.level > logging.INFO):
            logger.setLevel(logging.INFO)
    return show


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args._progress = configure_logging(getattr(args, "verbose", False), getattr(args, "quiet", False))
    try:
        return int(args._run(args) or 0)
    except (ValueError, CliError, FileNotFoundError) as err:
        # Bad input: one clear line, no traceback (exit 2, like argparse's own errors).
        print(f"saguaro {args.command}: error: {err}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as err:
        from saguaro.commands.extras import missing_extra_message

        message = missing_extra_message(err)  # an optional dependency group (extra) that is not installed
        if message is None:
            raise
        print(f"saguaro {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("saguaro: interrupted", file=sys.stderr)
        return 130
    except RuntimeError as err:
        if not getattr(err, "one_line", False):  # a fault the engine words for the user (a rank that died)
            raise
        print(f"saguaro {args.command}: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

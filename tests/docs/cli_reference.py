"""docs/cli.md read as a reference: its command sections, the flags each names, and its example command lines;
and the flags saguaro.cli's parsers take, per command."""

from __future__ import annotations

import argparse
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from saguaro.cli import COMMANDS, build_parser
from tests.docs.references import blocks

ROOT = Path(__file__).resolve().parents[2]
CLI_MD = ROOT / "docs" / "cli.md"
ENGINE_COMMANDS = ("generate", "serve", "bench", "calibrate")  # "all four" in the shared flag tables
SPECULATION_COMMANDS = ("generate", "serve", "bench")
FLAG = re.compile(r"(?<![\w*-])(--?[A-Za-z][\w-]*)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")


@dataclass
class Section:
    title: str
    lines: list[tuple[int, str]] = field(default_factory=list)  # (line number, text) outside code blocks
    examples: list[tuple[int, str]] = field(default_factory=list)  # fenced `saguaro ...` command lines


def sections(text: str) -> list[Section]:
    """The `## ` sections of a Markdown text, with their prose (paragraphs and table rows) and their fenced
    command lines apart."""
    out = [Section("")]
    for number, block, fenced in blocks(text):
        if fenced:
            command = block.split("  #")[0].strip()
            if command.startswith("saguaro "):
                out[-1].examples.append((number, command))
        elif block.startswith("## "):
            out.append(Section(block[3:].strip()))
        else:
            out[-1].lines.append((number, block))
    return out


def command_of(section: Section) -> str | None:
    """The command a `## \\`saguaro X\\`` section documents."""
    match = re.fullmatch(r"`saguaro (\w[\w-]*)`", section.title)
    return match.group(1) if match else None


def named_flags(text: str) -> list[tuple[str | None, set[str]]]:
    """(command, flags) of each code span of a line that names flags: `--fanout F_0 .. F_K` and
    `-n/--num-prompts` (command None: the section's), `simulate --fit` or `saguaro calibrate --threads N`
    (that command's). A placeholder such as `--*-quant` names none; a `python -m` or `pip` line names another
    program's options."""
    out = []
    for _, span in CODE_SPAN.findall(text):
        words = span.split()
        if not words or words[0] in ("python", "python3", "pip", "bash"):
            continue
        words = words[1:] if words[0] == "saguaro" and len(words) > 1 else words
        command = words[0] if words[0] in COMMANDS else None
        flags = set(FLAG.findall(span))
        if flags:
            out.append((command, flags))
    return out


def flags_in(text: str) -> set[str]:
    """The flags a line's code spans name for the section's own command (see named_flags)."""
    return set().union(*(flags for command, flags in named_flags(text) if command is None))


def inherited(section: Section) -> list[str]:
    """The commands whose flags a section takes by reference ("the ... flags of `simulate`")."""
    return re.findall(r"flags of `(\w+)`", " ".join(line for _, line in section.lines))


def shared_flag_rows(section: Section) -> list[tuple[int, set[str], tuple[str, ...]]]:
    """(line, flags, commands) of each row of the shared tables: the model table's last column names its
    commands ("all four" = generate, serve, bench, calibrate); a speculation row is for generate, serve and
    bench, or for those its meaning starts with ("generate, serve: ...")."""
    rows = []
    for number, line in section.lines:
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) < 2 or not flags_in(cells[0]):
            continue
        if len(cells) >= 3:
            names = ENGINE_COMMANDS if cells[2] == "all four" else tuple(c.strip() for c in cells[2].split(","))
        else:
            lead = re.match(r"((?:generate|serve|bench)(?:, (?:generate|serve|bench))*): ", cells[1])
            names = tuple(lead.group(1).split(", ")) if lead else SPECULATION_COMMANDS
        rows.append((number, flags_in(cells[0]), names))
    return rows


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The optional arguments of `parser` and of its subcommands' parsers, --help included."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in {id(p): p for p in action.choices.values()}.values():
                out += options(sub)
        elif action.option_strings:
            out.append(action)
    return out


def parser_flags(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string `parser` or one of its subcommands takes."""
    return {flag for action in options(parser) for flag in action.option_strings}


def command_parsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {name: sub.choices[name] for name in COMMANDS}


def top_level_flags() -> set[str]:
    return {
        s for a in build_parser()._actions if not isinstance(a, argparse._SubParsersAction) for s in a.option_strings
    }


def example_argv(line: str) -> list[str]:
    """A documented command line as the argv `saguaro` gets (without the program name)."""
    return shlex.split(line)[1:]


SHARED = "What every command shares"  # its flags (-v, -q, --json, ...) hold for every command that takes them
SHARED_TABLES = "Flags shared by the engine commands"


def documented_flags(text: str) -> dict[str, set[str]]:
    """command -> the flags the text documents for it: in its own section, in a shared table row naming it,
    in a span naming it anywhere (`simulate --fit`), by reference ("flags of `simulate`"), and the shared
    section's."""
    parsers = command_parsers()
    out: dict[str, set[str]] = {name: set() for name in parsers}
    shared: set[str] = set()
    references = []
    for section in sections(text):
        own = command_of(section)
        if section.title == SHARED_TABLES:
            for _, flags, names in shared_flag_rows(section):
                for name in names:
                    out[name] |= flags
        for _, line in section.lines:
            for command, flags in named_flags(line):
                if command is not None:
                    out[command] |= flags
                elif own is not None:
                    out[own] |= flags
                elif section.title == SHARED:
                    shared |= flags
        if own is not None:
            references += [(own, other) for other in inherited(section)]
    for own, other in references:
        out[own] |= out[other] & parser_flags(parsers[own])
    for name, parser in parsers.items():
        out[name] |= shared & parser_flags(parser)
    return out


def unknown_flags(text: str) -> list[str]:
    """A line for each flag the text names that the command it names it for does not take."""
    parsers, top = command_parsers(), top_level_flags()
    anywhere = top.union(*(parser_flags(p) for p in parsers.values()))
    problems = []
    for section in sections(text):
        own = command_of(section)
        if section.title == SHARED_TABLES:
            for number, flags, names in shared_flag_rows(section):
                problems += [
                    f"line {number}: saguaro {name} has no {flag}"
                    for name in names
                    for flag in sorted(flags - parser_flags(parsers[name]))
                ]
        for number, line in section.lines:
            for command, flags in named_flags(line):
                command = command or own
                known = anywhere if command is None else parser_flags(parsers[command]) | top
                problems += [
                    f"line {number}: {'saguaro ' + command if command else 'no command'} has no {flag}"
                    for flag in sorted(flags - known)
                ]
    return problems


def undocumented_flags(text: str) -> list[str]:
    """A line for each option of a command's parser that the text does not name (an option whose help is
    suppressed, an old spelling kept working, needs none; one of an option's spellings is enough)."""
    documented = documented_flags(text)
    return [
        f"saguaro {name}: {'/'.join(action.option_strings)}"
        for name, parser in command_parsers().items()
        for action in options(parser)
        if action.help != argparse.SUPPRESS
        and action.dest != "help"
        and not set(action.option_strings) & documented[name]
    ]


def missing_sections(text: str) -> list[str]:
    documented = {command_of(s) for s in sections(text)} - {None}
    return [f"no section for saguaro {name}" for name in COMMANDS if name not in documented] + [
        f"a section for saguaro {name}, which is no command" for name in sorted(documented - set(COMMANDS))
    ]


def bad_examples(text: str) -> list[str]:
    """A line for each example command line the parser refuses."""
    problems = []
    for section in sections(text):
        for number, line in section.examples:
            try:
                build_parser().parse_args(example_argv(line))
            except SystemExit:
                problems.append(f"line {number}: {line}")
    return problems

"""CHANGELOG.md keeps keepachangelog.com's form (Unreleased first, then releases newest first, each with a date
and only the six kinds of change), and its newest release is the version pyproject.toml states."""

from __future__ import annotations

import datetime
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHANGELOG = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
KINDS = ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security")
RELEASE = re.compile(r"^\[(\d+)\.(\d+)\.(\d+)\] - (\d{4}-\d{2}-\d{2})$")


def sections() -> list[tuple[str, dict[str, str]]]:
    """(the `## ` heading, {kind: its text}) in order."""
    out = []
    for block in re.split(r"^## ", CHANGELOG, flags=re.M)[1:]:
        heading, _, body = block.partition("\n")
        kinds = {}
        for part in re.split(r"^### ", body, flags=re.M)[1:]:
            kind, _, text = part.partition("\n")
            kinds[kind.strip()] = text.strip()
        out.append((heading.strip(), kinds))
    return out


def releases() -> list[tuple[tuple[int, int, int], datetime.date, dict[str, str]]]:
    out = []
    for heading, kinds in sections()[1:]:
        match = RELEASE.match(heading)
        assert match, f"a release heading reads '## [X.Y.Z] - YYYY-MM-DD', not '## {heading}'"
        major, minor, patch, date = match.groups()
        out.append(((int(major), int(minor), int(patch)), datetime.date.fromisoformat(date), kinds))
    return out


def test_unreleased_comes_first():
    assert sections()[0][0] == "[Unreleased]"


def test_releases_run_newest_first_with_dates_that_do_not_rise():
    found = releases()
    assert len(found) >= 2
    assert [v for v, _, _ in found] == sorted((v for v, _, _ in found), reverse=True)
    assert [d for _, d, _ in found] == sorted((d for _, d, _ in found), reverse=True)


def test_every_section_is_one_of_the_six_kinds_and_says_something():
    for heading, kinds in sections():
        for kind, text in kinds.items():
            assert kind in KINDS, f"'### {kind}' under '## {heading}': use one of {', '.join(KINDS)}"
            assert text.startswith("- "), f"'### {kind}' under '## {heading}' lists nothing"


def test_the_newest_release_is_the_version_of_pyproject():
    stated = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    newest = releases()[0][0]
    assert ".".join(map(str, newest)) == stated


def test_each_deprecated_argument_is_in_the_deprecations_of_its_release():
    from engine.config import DEPRECATED_IN, REMOVED_IN, REMOVED_QUANT_ARGUMENTS

    release = {".".join(map(str, v)): kinds for v, _, kinds in releases()}[DEPRECATED_IN]
    for name in REMOVED_QUANT_ARGUMENTS:
        assert name in release.get("Deprecated", ""), name
    assert REMOVED_IN in release["Deprecated"]

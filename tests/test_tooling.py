"""The lint configuration is in force: the tree passes `ruff check`, the rules pyproject.toml selects catch what they
name, and ruff and mypy are pinned alike in the test extra, the constraints and the environment. (mypy itself runs
in scripts/test.sh: its first run takes about 40 s, too long for a test.)"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
CONSTRAINTS = (ROOT / "requirements" / "constraints.txt").read_text(encoding="utf-8")
TOOLS = ("ruff", "mypy")


def ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_tree_passes_ruff_check():
    result = ruff(".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_selected_rules_flag_an_unused_import_a_long_line_and_a_zip_without_strict(tmp_path):
    """The negative control: pyproject.toml's rules, applied to a file outside the tree, find its three faults."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        f'import os\n\n\ndef pairs(a, b):\n    return list(zip(a, b))\n\n\nNAME = "{"x" * 120}"\n', encoding="utf-8"
    )
    result = ruff("--config", str(ROOT / "pyproject.toml"), "--output-format", "concise", str(bad), cwd=tmp_path)
    assert result.returncode == 1
    assert set(re.findall(r": ([A-Z]+[0-9]+) ", result.stdout)) == {"F401", "B905", "E501"}


@pytest.mark.parametrize("tool", TOOLS)
def test_the_tool_is_pinned_alike_in_the_test_extra_the_constraints_and_the_environment(tool):
    extra = [r for r in PYPROJECT["project"]["optional-dependencies"]["test"] if re.match(rf"{tool}\b", r)]
    assert len(extra) == 1 and extra[0].startswith(f"{tool}=="), extra
    pinned = extra[0].removeprefix(f"{tool}==")
    assert re.findall(rf"^{tool}==(\S+)$", CONSTRAINTS, flags=re.M) == [pinned]
    assert version(tool) == pinned

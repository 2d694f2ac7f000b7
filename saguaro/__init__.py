"""saguaro: the `saguaro` command line (cli, commands/) and what it runs on: the benchmark harness (bench/),
calibration of the simulator (calibration/), reports (reporting/), the simulator checked against measured runs
(validation/), and one table and number format (formatting).

`saguaro.__version__` is the installed distribution's version (saguaro-ssd), or the checkout's
pyproject.toml where it is not installed."""

from __future__ import annotations

import tomllib
from functools import cache
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "saguaro-ssd"
UNKNOWN_VERSION = "0+unknown"


@cache
def version() -> str:
    """The installed distribution's version, else the version in the checkout's pyproject.toml (code run from a
    source tree that was never installed), else UNKNOWN_VERSION."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return source_version(Path(__file__).resolve().parents[1] / "pyproject.toml")


def source_version(pyproject: Path) -> str:
    """The version a pyproject.toml of this distribution states; UNKNOWN_VERSION if it is missing or another's."""
    try:
        project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        return UNKNOWN_VERSION
    return project.get("version", UNKNOWN_VERSION) if project.get("name") == DISTRIBUTION else UNKNOWN_VERSION


def __getattr__(name: str):
    if name == "__version__":  # looked up on first use, not at import
        return version()
    raise AttributeError(f"module 'saguaro' has no attribute {name!r}")

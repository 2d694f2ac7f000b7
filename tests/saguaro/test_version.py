"""The version: `saguaro --version` prints the installed distribution's, a checkout never installed reads its
pyproject.toml, and the installed metadata agrees with the checkout it was installed from."""

from __future__ import annotations

import json
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

import saguaro
from saguaro.cli import main

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT_VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]


@pytest.fixture
def fresh_version():
    """saguaro.version() looked up again in the test, and again after it (it is cached per process)."""
    saguaro.version.cache_clear()
    yield
    saguaro.version.cache_clear()


def test_saguaro_version_prints_the_name_and_the_version(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"saguaro {saguaro.__version__}\n"


def test_the_version_is_the_installed_distributions(monkeypatch, fresh_version):
    monkeypatch.setattr(metadata, "version", lambda name: {"saguaro-ssd": "9.8.7"}[name])
    assert saguaro.__version__ == "9.8.7"


def test_a_checkout_never_installed_reads_its_pyproject(monkeypatch, fresh_version):
    def not_installed(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", not_installed)
    assert saguaro.__version__ == PYPROJECT_VERSION


def test_another_projects_pyproject_gives_no_version(tmp_path):
    other = tmp_path / "pyproject.toml"
    other.write_text('[project]\nname = "other"\nversion = "3.0.0"\n', encoding="utf-8")
    assert saguaro.source_version(other) == saguaro.UNKNOWN_VERSION
    assert saguaro.source_version(tmp_path / "missing.toml") == saguaro.UNKNOWN_VERSION


def installed_from_this_checkout() -> bool:
    try:
        url = json.loads(metadata.distribution(saguaro.DISTRIBUTION).read_text("direct_url.json") or "{}")
    except metadata.PackageNotFoundError:
        return False
    return url.get("url") == ROOT.as_uri()


@pytest.mark.skipif(
    not installed_from_this_checkout(),
    reason="the installed saguaro-ssd was not installed from this checkout (or not at all)",
)
def test_the_installed_version_is_this_checkouts():
    assert metadata.version(saguaro.DISTRIBUTION) == PYPROJECT_VERSION, (
        "the installed metadata is older than pyproject.toml: reinstall (bash scripts/venv.sh)"
    )

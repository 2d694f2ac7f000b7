"""The engine on the oldest transformers it supports (requirements/transformers-lower.txt, installed by
scripts/venv.sh into .venv/transformers-lower): the KV-cache and greedy-equality tests run again in a child
process that imports that transformers first. Cheap (about 10 s) and it catches an API the lower bound lacks,
such as a cache keyword it silently drops."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SIDE = Path(sys.prefix) / "transformers-lower"
PINS = ROOT / "requirements" / "transformers-lower.txt"
TESTS = [
    "tests/engine/test_kv_cache.py",
    "tests/engine/test_static_cache.py",
    "tests/engine/test_greedy_equivalence.py",
    "tests/engine/test_ssd_greedy.py",
]


def _pinned_version() -> str:
    for line in PINS.read_text().splitlines():
        if line.startswith("transformers=="):
            return line.split("==", 1)[1].strip()
    raise AssertionError(f"{PINS} pins no transformers version")


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SIDE), str(ROOT)])
    return env


@pytest.fixture(scope="module")
def side_folder() -> Path:
    if not (SIDE / "transformers").is_dir():
        pytest.skip(f"no {SIDE}: run `bash scripts/venv.sh` (it installs the oldest supported transformers there)")
    return SIDE


def test_the_side_folder_holds_the_pinned_lower_bound(side_folder):
    out = subprocess.run(
        [sys.executable, "-c", "import transformers; print(transformers.__version__)"],
        env=_child_env(),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == _pinned_version()


def test_kv_cache_and_greedy_tests_pass_on_the_lower_bound(side_folder):
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *TESTS],
        env=_child_env(),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert " passed" in out.stdout

"""scripts/validation-runs.sh's calibrate part, run against a stand-in `saguaro` that records its arguments: the
calibration's batch sizes come from CALIBRATE_BATCH, 1 2 4 8 by default; an unknown part exits 2."""

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """The script from a copy of the tree under `tmp_path` (its root is where it lies), `saguaro` a stand-in."""
    (tmp_path / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "validation-runs.sh", tmp_path / "scripts")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    calls = tmp_path / "calls.txt"
    fake = bin_dir / "saguaro"
    fake.write_text(f'#!/usr/bin/env bash\necho "$*" >> {calls}\n')
    fake.chmod(0o755)
    base = {k: v for k, v in os.environ.items() if k not in ("PARTS", "CALIBRATE_BATCH", "DTYPE")}
    done = subprocess.run(
        ["bash", str(tmp_path / "scripts" / "validation-runs.sh")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**base, "OUT": str(tmp_path / "out"), **env},
    )
    return done, calls.read_text().splitlines() if calls.exists() else []


def test_the_calibration_takes_its_batch_sizes_from_calibrate_batch(tmp_path):
    done, calls = _run(tmp_path / "default", PARTS="calibrate")
    assert done.returncode == 0, done.stderr
    assert len(calls) == 1 and calls[0].startswith("calibrate ") and " --batch 1 2 4 8 --out " in calls[0]

    done, calls = _run(tmp_path / "given", PARTS="calibrate", CALIBRATE_BATCH="1 4")
    assert done.returncode == 0, done.stderr
    assert len(calls) == 1 and " --batch 1 4 --out " in calls[0]


def test_an_unknown_part_is_one_line_and_exit_2(tmp_path):
    done, calls = _run(tmp_path, PARTS="calibrat")
    assert done.returncode == 2 and calls == []
    assert "unknown part calibrat" in done.stderr and "Traceback" not in done.stderr

"""benchmarks/repeatability.py: the spread of one configuration's tokens/s across repeats of a bench run, and of its
ratio to the run's SD variants (what leveling a calibration cannot take out)."""

import json
import shutil
from pathlib import Path

import pytest

from benchmarks import repeatability
from saguaro.validation.measured import measured_tokens_per_s, variants
from saguaro.validation.studies import REPORTS, unpack


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """The bench runs of 2026-12-01 (reports/2026-12-cpu-prediction-accuracy), unpacked."""
    root = unpack(REPORTS, "2026-12-cpu-prediction-accuracy", tmp_path_factory.mktemp("studies"))
    return root / "2026-12-01-avx512" / "runs"


@pytest.fixture(scope="module")
def interleaved(runs) -> Path:
    return next(runs.glob("*-k35-interleaved"))


@pytest.fixture(scope="module")
def k235(runs) -> Path:
    return next(runs.glob("*-k235"))


def _slowed(src: Path, dst: Path, key: str, factor: float) -> Path:
    """A copy of a run folder with one variant's rounds `factor` times as long."""
    shutil.copytree(src, dst)
    rounds = dst / "rounds.jsonl"
    rows = [json.loads(line) for line in rounds.read_text().splitlines()]
    assert any(r["key"] == key for r in rows)
    for r in rows:
        if r["key"] == key:
            r["round_ms"] *= factor
    rounds.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return dst


def test_rows_are_the_measured_speeds_of_the_configurations_both_runs_have(interleaved, k235):
    rows = {r["configuration"]: r for r in repeatability.table([interleaved, k235])}
    # k235 also ran K 2 and budget 16: only what both ran is compared
    assert set(rows) == {
        "sd K=3 T=0 b=1",
        "sd K=5 T=0 b=1",
        "ssd K=3 B=8 geometric neural T=0 b=1",
        "ssd K=5 B=8 geometric neural T=0 b=1",
    }
    for run in (interleaved, k235):
        speeds = {key.split("/", 1)[1]: measured_tokens_per_s(r) for key, (_, r) in variants(run).items()}
        for name, row in rows.items():
            assert row["tokens_per_s"][run.name] == pytest.approx(speeds[name])
    for row in rows.values():
        speeds = list(row["tokens_per_s"].values())
        assert row["spread"] == pytest.approx(max(speeds) / min(speeds) - 1)
    # the SD reference is the SD variants both runs have (K 3 and 5), pooled: their ratios straddle 1
    sd = [rows[name]["over_sd"][interleaved.name] for name in rows if name.startswith("sd ")]
    assert min(sd) < 1 < max(sd)


def test_a_slowed_configuration_spreads_by_the_slowdown_and_nothing_else_does(interleaved, tmp_path):
    """Negative control: a copy of a run agrees with it exactly; slowing one SSD variant's rounds by 15% in the
    copy shows a 15% spread on that row alone, in tokens/s and over SD."""
    key = "ssd K=3 B=8 geometric neural T=0 b=1"
    same = repeatability.table([interleaved, _slowed(interleaved, tmp_path / "same", key, 1.0)])
    assert all(r["spread"] == pytest.approx(0, abs=1e-12) for r in same)
    rows = repeatability.table([interleaved, _slowed(interleaved, tmp_path / "slow", key, 1.15)])
    moved = [r for r in rows if r["spread"] > 1e-9]
    assert [r["configuration"] for r in moved] == [key]
    assert moved[0]["spread"] == pytest.approx(0.15, rel=1e-9)
    assert moved[0]["over_sd_spread"] == pytest.approx(0.15, rel=1e-9)


def test_bad_input_exits_2_with_a_line(runs, interleaved, tmp_path, capsys):
    assert repeatability.main([str(interleaved)]) == 2
    assert "two run folders" in capsys.readouterr().err
    assert repeatability.main([str(interleaved), str(interleaved)]) == 2
    assert "different names" in capsys.readouterr().err
    assert repeatability.main([str(interleaved), str(next(runs.glob("*-b4")))]) == 2
    assert "no configuration appears in two" in capsys.readouterr().err
    assert repeatability.main([str(interleaved), str(tmp_path)]) == 2
    assert "not a bench run folder" in capsys.readouterr().err


def test_the_table_and_json_are_written(interleaved, k235, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert repeatability.main([str(interleaved), str(k235), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "largest spread over the run's SD" in text
    data = json.loads(out.read_text())
    assert data["runs"] == [interleaved.name, k235.name] and len(data["rows"]) == 4

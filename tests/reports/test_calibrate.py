"""`saguaro calibrate` on tiny models: SD and SSD rounds at each batch size, the interference summary, and
records the timing fit reads (the verify alone from SD, SSD's slowdown as a factor)."""

import json

import pytest

from saguaro.cli import main
from simulator import fit_timing, read_records
from tests.engine.test_models import save_tiny


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    return save_tiny(root / "target", seed=0), save_tiny(root / "draft", seed=0)


def test_calibrate_records_sd_and_ssd_rounds_and_summarises_them(pair, tmp_path):
    target, draft = pair
    out = tmp_path / "calib.jsonl"
    argv = ["calibrate", "--target", str(target), "--draft", str(draft), "-K", "2", "--budget", "3",
            "--batch", "1", "2", "--tokens", "12", "--repeats", "2", "--prompt-ids", "1", "2", "3", "4", "5", "6", "7", "--dtype", "float32", "--out", str(out)]
    assert main(argv) == 0
    records = read_records(out)
    decode = [r for r in records if r.is_decode]
    kinds = {(r.strategy.value, r.batch_size) for r in decode}
    assert kinds == {(s, b) for s in ("ar", "sd", "ssd") for b in (1, 2)}
    # each engine's two calls per batch size are recorded (the warm-up is not): SD and SSD 12 tokens each
    for strategy in ("sd", "ssd"):
        for b in (1, 2):
            emitted = sum(sum(r.emitted) for r in decode if (r.strategy.value, r.batch_size) == (strategy, b))
            assert emitted == 2 * b * (12 - 1)  # the first token of each call comes from the prefill
    assert {r.branches for r in decode if r.strategy.value == "ssd" and r.round > 0} >= {3, 6}  # budget · batch
    summary = json.loads(out.with_suffix(".summary.json").read_text())
    assert set(summary["interference"]) == {"1", "2"} and summary["interference_factor"] > 0
    assert summary["settings"]["budget"] == 3 and set(summary["fast_backup_ms"]) == {"random", "lookup"}
    # simulate --fit reads the fast backups' times from the summary beside the records
    assert main(["simulate", "--fit", str(out), "--strategy", "ssd", "--backup", "random", "--K", "2",
                 "--budget", "3", "--rounds", "200", "--output-len", "16", "--prompt-len", "8"]) == 0
    fitted = fit_timing(records)
    assert fitted.counts["ssd_verify"] == sum(r.strategy.value == "ssd" for r in decode)
    assert fitted.ssd_verify_factor > 0


@pytest.mark.parametrize("flags, message", [
    (["-K", "0"], "-K must be >= 1"),
    (["--batch", "0"], "--batch sizes"),
    (["--tokens", "3"], "--tokens must be at least"),
    (["--repeats", "0"], "--repeats must be >= 1"),
])
def test_bad_settings_exit_2_with_a_line(flags, message, tmp_path, capsys):
    assert main(["calibrate", "--out", str(tmp_path / "x.jsonl"), *flags]) == 2
    assert message in capsys.readouterr().err

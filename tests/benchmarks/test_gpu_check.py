"""The offline GPU check's own test, on CPU: its script, its steps on tiny shapes, and a canary that can fail.
(The full dry run, `GPU_CHECK_DEVICE=cpu bash scripts/gpu-check.sh`, takes minutes: these take seconds each.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import gpu_check

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-check.sh"


def run_script(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    full = {
        **os.environ,
        "PYTHON": sys.executable,
        "OUT": str(tmp_path / "out"),
        "GPU_CHECK_DEVICE": "cpu",
        "GPU_CHECK_QUICK": "1",
        **env,
    }
    return subprocess.run(["bash", str(SCRIPT)], env=full, capture_output=True, text=True, timeout=300, cwd=ROOT)


def results(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())


def test_the_script_runs_the_chosen_steps_and_writes_the_summary_first(tmp_path):
    done = run_script(tmp_path, GPU_CHECK_STEPS="env canary")
    out = tmp_path / "out"
    assert done.returncode == 0, done.stderr[-3000:]
    summary = (out / "summary.md").read_text()
    assert summary.startswith("# GPU check on CPU (dry run)")
    assert "KV-cache canary ok" in summary and "every step passed" in summary
    assert set(results(out)) == {"env", "canary"}
    assert len(list(out.iterdir())) <= 8


def test_an_unknown_device_or_step_is_refused_with_exit_2(tmp_path):
    for env in ({"GPU_CHECK_DEVICE": "tpu"}, {"GPU_CHECK_STEPS": "nothing"}):
        done = run_script(tmp_path, **env)
        assert done.returncode == 2
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_the_canary_fails_when_the_cache_does_not_reach_the_forward(tmp_path, monkeypatch):
    """Negative control: a cache passed under a keyword the model ignores decodes without its context."""
    import engine.kv_cache

    monkeypatch.setattr(engine.kv_cache, "cache_keyword", lambda model: "not_a_cache_argument")
    assert gpu_check.main(["canary", "--out", str(tmp_path), "--device", "cpu"]) == 1
    assert "KV-cache canary FAILED" in (tmp_path / "summary.md").read_text()


def test_greedy_sd_and_ssd_equal_ar_and_the_dying_worker_falls_back(tmp_path):
    assert gpu_check.main(["greedy", "--out", str(tmp_path), "--device", "cpu", "--quick"]) == 0
    runs = results(tmp_path)["greedy"]["runs"]
    assert all(r["equal"] for r in runs.values())
    assert runs["ssd worker dies at round 3"]["strategy at the end"] == "sd"
    assert runs["ssd worker process"]["strategy at the end"] == "ssd"


def test_forced_agreement_makes_every_draft_token_accepted_and_every_outcome_cached(tmp_path):
    assert gpu_check.main(["e2e-agree", "--out", str(tmp_path), "--device", "cpu", "--quick"]) == 0
    rows = {(r["strategy"], r["batch"]): r for r in results(tmp_path)["e2e-agree"]["rows"]}
    assert {s for s, _ in rows} == {"ar", "sd", "ssd"}
    assert all(r["alpha"] == 1.0 for (s, _), r in rows.items() if s != "ar")
    assert all(r["hit_rate"] == 1.0 for (s, _), r in rows.items() if s == "ssd")
    assert all(r["ran_as"] == r["strategy"] for r in rows.values())


def test_timings_give_every_forward_a_time_at_every_batch(tmp_path):
    assert gpu_check.main(["timings", "--out", str(tmp_path), "--device", "cpu", "--quick"]) == 0
    rows = results(tmp_path)["timings"]["rows"]["tiny/tiny"]
    assert [r["batch"] for r in rows] == [1, 8]
    for row in rows:
        for key in (
            "verify K+1=2 ms",
            "verify K+1=4 ms",
            "draft step ms",
            "cache build budget 4 ms",
            "cache build budget 16 ms",
            "backup round (neural, K 4) ms",
        ):
            assert isinstance(row[key], float) and row[key] > 0, (key, row)


def test_sync_counting_sees_the_reads_each_strategy_makes(tmp_path):
    assert gpu_check.main(["syncs", "--out", str(tmp_path), "--device", "cpu"]) == 0
    counts = results(tmp_path)["syncs"]
    assert counts["ar"]["total per step"] > 0
    assert counts["ssd"]["total per step"] > counts["ar"]["total per step"]


def test_a_gpu_step_where_torch_sees_no_gpu_is_refused_with_exit_2(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert gpu_check.main(["env", "--out", str(tmp_path), "--device", "cuda"]) == 2


def test_compiled_forwards_are_timed_beside_eager_ones(tmp_path):
    assert gpu_check.main(["compiled", "--out", str(tmp_path), "--device", "cpu", "--quick"]) == 0
    summary = results(tmp_path)["compiled"]["summary"]
    assert {line["model"] for line in summary} == {"target", "draft"}
    assert all(line["eager_ms"] > 0 and line["compiled_ms"] > 0 for line in summary)


def test_overhead_puts_each_strategy_beside_its_ideal(tmp_path):
    assert gpu_check.main(["overhead", "--out", str(tmp_path), "--device", "cpu", "--quick"]) == 0
    (row,) = results(tmp_path)["overhead"]["rows"]
    assert set(row["engine"]) == {"ar", "sd", "ssd"}
    for strategy, run in row["engine"].items():
        assert run["best_tpot_ms"] > 0 and run["ideal_ms"] > 0, strategy
        assert run["fault"] is None and run["syncs_per_round"] >= 1, strategy
    assert "engine overhead, vocabulary 512" in (tmp_path / "summary.md").read_text()

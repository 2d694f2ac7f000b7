"""benchmarks/engine_overhead.py end to end on a small pair: the engine against its ideal, on the device asked for."""

import json

import pytest
import torch

from benchmarks import engine_overhead

SMALL = ["--vocab", "64", "-K", "2", "--new-tokens", "8", "--repeats", "1", "--branch-rows", "1", "4"]


def test_a_run_prints_each_strategy_beside_its_ideal_and_writes_the_device(tmp_path, capsys):
    assert engine_overhead.main([*SMALL, "--strategies", "ar", "sd", "--device", "cpu", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "bare loop" in out and "x ideal" in out
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["meta"]["args"]["device"] == "cpu"
    (row,) = results["rows"]
    for strategy in ("ar", "sd"):
        run = row["engine"][strategy]
        assert run["ideal_ms"] > 0 and run["best_tpot_ms"] > 0
        assert run["syncs_per_round"] == 1  # the budget tests/engine/test_host_syncs.py holds


@pytest.mark.parametrize("device", ["tpu", "cuda:x"])
def test_a_device_that_is_not_one_is_refused_with_status_2(device, capsys):
    with pytest.raises(SystemExit) as exit_info:
        engine_overhead.main([*SMALL, "--device", device])
    assert exit_info.value.code == 2
    assert "--device" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with CUDA runs it")
def test_cuda_without_a_gpu_is_refused_with_status_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        engine_overhead.main([*SMALL, "--device", "cuda"])
    assert exit_info.value.code == 2
    assert "no CUDA device" in capsys.readouterr().err

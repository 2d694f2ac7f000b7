"""Presets state their sources, and the roofline reproduces the numbers it was calibrated on."""

import contextlib
import dataclasses
import io
import json
import math
from pathlib import Path

import pytest

from simulator import Deployment, RooflineTiming
from simulator.presets import HARDWARE, MODELS, PAIR_SOURCES, PAIRS, hardware_preset, model_preset
from theory.glossary import Backup, Strategy


@pytest.mark.parametrize("preset", [*HARDWARE.values(), *MODELS.values()], ids=lambda p: p.name)
def test_every_preset_states_its_source(preset):
    assert len(preset.source) > 40


def test_pairs_name_known_models():
    for target, draft, tp in PAIRS.values():
        Deployment(model_preset(target), hardware_preset("h100"), tp)
        model_preset(draft)


# docs/models-and-data.md, one thread, bf16, prefix 200: forward time (ms) over n new tokens
MEASURED_CPU = {
    "qwen2.5-coder-1.5b": {1: 289, 4: 285, 5: 301, 8: 341},
    "qwen2.5-coder-0.5b": {1: 117, 4: 126, 8: 146, 12: 168, 16: 182, 24: 222},
}


@pytest.mark.parametrize("model", MEASURED_CPU)
def test_cpu_roofline_reproduces_measured_forwards_within_ten_percent(model):
    deployment = Deployment(model_preset(model), hardware_preset("cpu"))
    for n, measured_ms in MEASURED_CPU[model].items():
        assert deployment.forward_ms(n, 200, 200 * n) == pytest.approx(measured_ms, rel=0.10)


# TP-4 AR on H100s: the paper's Llama-3.1-70B (docs/ssd.md §7) and the reference's test log (Llama, Qwen3-32B),
# decode tokens/s at batch 1; the per-layer overhead at TP > 1 is fitted to the three (least squares)
PUBLISHED_TP4_AR = [("llama-3.1-70b", 54.7), ("llama-3.1-70b", 54.0), ("qwen3-32b", 89.0)]


@pytest.mark.parametrize(("model", "published"), PUBLISHED_TP4_AR)
def test_h100_roofline_matches_the_published_tp4_ar_figures(model, published):
    target = Deployment(model_preset(model), hardware_preset("h100"), 4)
    context = 128 + 256  # the benchmarks' prompt and half of their 512 tokens
    assert 1e3 / target.forward_ms(1, context, context + 1) == pytest.approx(published, rel=0.05)


def test_the_tp4_overhead_is_the_least_squares_one():
    # moving it 5 µs either way makes the three figures fit worse (a negative control on the fit)
    def misfit(us: float) -> float:
        hw = dataclasses.replace(hardware_preset("h100"), layer_overhead_us=us)
        return sum(
            (1e3 / Deployment(model_preset(m), hw, 4).forward_ms(1, 384, 385) / p - 1) ** 2 for m, p in PUBLISHED_TP4_AR
        )

    best = hardware_preset("h100").layer_overhead_us
    assert misfit(best) < misfit(best - 5) and misfit(best) < misfit(best + 5)


def test_an_eager_forward_pays_the_launch_overhead_per_layer():
    # the reference's eager ablation (test log): the draft's cycle of 7 forwards of Llama-3.2-1B's 16 layers
    # took 91.19 ms eager against 22.21 ms replayed from CUDA graphs
    hw = hardware_preset("h100")
    graph = Deployment(model_preset("llama-3.2-1b"), hw)
    eager = dataclasses.replace(graph, eager=True)
    assert 7 * (eager.forward_ms(1, 300, 300) - graph.forward_ms(1, 300, 300)) == pytest.approx(91.19 - 22.21, rel=1e-6)
    cpu = Deployment(model_preset("qwen2.5-coder-0.5b"), hardware_preset("cpu"))  # no launch figure: the same
    assert dataclasses.replace(cpu, eager=True).forward_ms(1, 64, 64) == cpu.forward_ms(1, 64, 64)


def test_an_eager_engine_makes_both_deployments_eager_and_adds_its_host_work():
    from simulator.presets import engine_preset
    from simulator.timing import EngineCosts

    hw = hardware_preset("h200")
    target = Deployment(model_preset("qwen2.5-coder-1.5b"), hw)
    draft = Deployment(model_preset("qwen2.5-coder-0.5b"), hw)
    costs = engine_preset("saguaro-eager-h200")
    timing = RooflineTiming(target, draft, engine=costs)
    assert timing.target.eager and timing.draft.eager  # what the plan's assumptions read
    plain = RooflineTiming(
        dataclasses.replace(target, eager=True), dataclasses.replace(draft, eager=True), engine=EngineCosts()
    )
    assert timing.verify_ms(1, 5, 256) == plain.verify_ms(1, 5, 256)
    assert timing.draft_ms(1, 4, 256) == pytest.approx(plain.draft_ms(1, 4, 256) + 4 * costs.draft_host_ms)
    assert timing.overhead_ms(Strategy.AR) == plain.overhead_ms(Strategy.AR) + costs.round_host_ms


# Hazy Research, "Look Ma, No Bubbles!" (https://hazyresearch.stanford.edu/blog/2025-05-27-no-bubbles):
# Llama-3.2-1B, one sequence, bf16, 32-token prompt, 128 generated tokens on an H100; the best of vLLM and
# SGLang (CUDA graphs) uses 50% of the 3.35 TB/s: 2.472 GB of weights / 1.675 TB/s = 1.476 ms per forward
PUBLISHED_1B_STEP_MS = 1.236e9 * 2 / (0.5 * 3.35e12) * 1e3


def test_h100_draft_step_matches_the_published_llama_1b_decode():
    draft = Deployment(model_preset("llama-3.2-1b"), hardware_preset("h100"))
    context = 32 + 64  # the prompt and half of the 128 generated tokens
    assert PUBLISHED_1B_STEP_MS == pytest.approx(1.476, abs=1e-3)
    assert draft.forward_ms(1, context, context) == pytest.approx(PUBLISHED_1B_STEP_MS, rel=0.05)
    # the target's calibration (40 µs per layer, fitted at TP 4) would miss it by more than 5%
    target_overhead = dataclasses.replace(hardware_preset("h100"), single_device_layer_overhead_us=None)
    assert Deployment(model_preset("llama-3.2-1b"), target_overhead).forward_ms(1, context, context) > (
        1.05 * PUBLISHED_1B_STEP_MS
    )


def test_the_single_device_overhead_applies_at_tp_1_only():
    hw = hardware_preset("h100")
    assert hw.single_device_layer_overhead_us != hw.layer_overhead_us
    assert hw.layer_overhead_for(1) == hw.single_device_layer_overhead_us
    assert hw.layer_overhead_for(4) == hw.layer_overhead_us
    cpu = hardware_preset("cpu")  # no separate figure: one overhead for every forward
    assert cpu.layer_overhead_for(1) == cpu.layer_overhead_us
    with pytest.raises(ValueError, match="single_device_layer_overhead_us must be >= 0"):
        dataclasses.replace(hw, single_device_layer_overhead_us=-1.0)


@pytest.mark.parametrize("name", ["h100", "h200", "a100"])
def test_gpu_presets_state_where_the_draft_overhead_comes_from(name):
    hw = hardware_preset(name)
    assert "single_device_layer_overhead_us" in hw.source and "no-bubbles" in hw.source


def test_roofline_costs_grow_with_work():
    t = RooflineTiming(
        Deployment(model_preset("qwen3-32b"), hardware_preset("h200"), 2),
        Deployment(model_preset("qwen3-0.6b"), hardware_preset("h200")),
    )
    assert t.verify_ms(1, 5, 1000) < t.verify_ms(64, 5, 1000) < t.verify_ms(64, 5, 8000)
    assert t.cache_build_ms(1, 4, 12, 500) < t.cache_build_ms(8, 4, 96, 500)
    assert t.backup_ms(Backup.RANDOM, 1, 4, 500) < t.backup_ms(Backup.NEURAL, 1, 4, 500)
    assert t.prefill_ms(Strategy.SSD, 1, 512) < t.prefill_ms(Strategy.SD, 1, 512)  # parallel vs in series


def test_a_model_that_does_not_fit_is_refused():
    with pytest.raises(ValueError, match="raise the tensor-parallel degree"):
        Deployment(model_preset("llama-3.1-70b"), hardware_preset("a100"), 1)


def test_unknown_presets_list_the_choices():
    with pytest.raises(ValueError, match="h100, h200"):
        hardware_preset("tpu")
    with pytest.raises(ValueError, match="llama-3.1-70b"):
        model_preset("gpt-5")


def test_bad_hardware_is_refused():
    with pytest.raises(ValueError, match="mem_efficiency"):
        dataclasses.replace(hardware_preset("h100"), mem_efficiency=1.5)


def test_the_qwen3_pair_runs_at_the_papers_tp_4():
    assert PAIRS["qwen3"][2] == 4 and PAIRS["llama"][2] == 4  # docs/ssd.md §7: target on 4×H100
    assert set(PAIR_SOURCES) == set(PAIRS)


@pytest.mark.parametrize("model", MODELS.values(), ids=lambda m: m.name)
def test_every_model_states_its_context_window(model):
    assert model.context_window and f"{model.context_window}" in model.source.replace(",", "")


H200_CHECK = Path(__file__).resolve().parents[2] / "reports" / "2026-12-h200-gpu-check" / "results.json"


def _h200_prediction_ratios(engine: str, tmp_path) -> dict[tuple[str, int], float]:
    """Predicted over measured tokens/s for the GPU check's AR and SD runs (models forced to agree: α = 1)."""
    from saguaro.cli import main

    out = tmp_path / f"{engine}.json"
    with contextlib.redirect_stdout(io.StringIO()):
        main(
            [
                "simulate",
                "--strategy",
                "ar",
                "sd",
                "--pair",
                "qwen-coder",
                "--hardware",
                "h200",
                "-K",
                "4",
                "--batch",
                "1",
                "8",
                "32",
                "--alpha",
                "1.0",
                "--output-len",
                "64",
                "--prompt-len",
                "128",
                "--engine",
                engine,
                "--json",
                str(out),
            ]
        )
    predicted = {
        (r["strategy"], r["settings"]["batch"]): r["tokens_per_s"] for r in json.loads(out.read_text())["results"]
    }
    measured = {
        (r["strategy"], r["batch"]): r["tokens_per_s"]
        for r in json.loads(H200_CHECK.read_text())["e2e-agree"]["rows"]
        if r["strategy"] in ("ar", "sd")
    }
    assert set(measured) == set(predicted)
    return {key: predicted[key] / measured[key] for key in measured}


def test_the_eager_h200_engine_reproduces_the_gpu_runs_it_was_calibrated_on(tmp_path):
    ratios = _h200_prediction_ratios("saguaro-eager-h200", tmp_path)
    for strategy in ("ar", "sd"):
        mine = [r for (s, _), r in ratios.items() if s == strategy]
        assert abs(math.exp(sum(map(math.log, mine)) / len(mine)) - 1) < 0.03, (strategy, ratios)
    assert all(abs(r - 1) < 0.35 for r in ratios.values()), ratios
    # the graph-captured costs, which the H200 preset states, are an order of magnitude off for eager forwards
    assert all(r > 10 for r in _h200_prediction_ratios("saguaro", tmp_path).values())


def test_every_engine_preset_is_named_in_the_help_and_an_unknown_one_is_refused_with_the_list(capsys):
    from saguaro.cli import main
    from simulator.presets import ENGINES, MEASURED_ENGINES, engine_names

    assert engine_names() == [*ENGINES, *MEASURED_ENGINES] and "saguaro-cpu" in MEASURED_ENGINES
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert all(f"({name})" in help_text for name in engine_names())
    assert main(["simulate", "--engine", "vllm", "--hardware", "h100", "--pair", "llama", "--rounds", "50"]) == 2
    err = capsys.readouterr().err
    assert "unknown engine 'vllm'" in err and all(name in err for name in engine_names())

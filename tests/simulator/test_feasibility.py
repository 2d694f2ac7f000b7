"""Feasibility: context window, tensor parallelism, memory per device, and overload of an open loop."""

import dataclasses
import math

import pytest

from simulator import ConstantTiming, Deployment, Lengths, RooflineTiming, Scenario, simulate
from simulator.feasibility import (
    capacity_per_s,
    check,
    honest,
    kv_bytes_per_token_per_device,
    overload,
    problems,
    tp_problems,
)
from simulator.presets import hardware_preset, model_preset


def roofline(pair=("llama-3.1-70b", "llama-3.2-1b"), tp=4, hardware="h100", draft_hardware=None):
    target, draft = (model_preset(name) for name in pair)
    draft_hw = draft_hardware or hardware_preset(hardware)
    return RooflineTiming(Deployment(target, hardware_preset(hardware), tp), Deployment(draft, draft_hw))


def config(strategy="ssd", batch=1, prompt=128, output=256, timing=None, rate=None, **kw):
    scenario = Scenario(
        timing or roofline(), prompt_len=Lengths(prompt), output_len=Lengths(output), rate_per_s=rate, rounds=400, **kw
    )
    return scenario.config(strategy, K=4, budget=12, batch=batch)


def test_kv_bytes_per_token_follow_the_config():
    llama = model_preset("llama-3.1-70b")  # 80 layers, 8 KV heads of 128, bf16: K and V
    assert llama.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2
    assert kv_bytes_per_token_per_device(llama, 4) == 2 * 80 * 2 * 128 * 2  # two KV heads per device
    assert kv_bytes_per_token_per_device(llama, 16) == 2 * 80 * 1 * 128 * 2  # one head, copied on two devices


def test_a_small_run_is_feasible():
    assert problems(config()) == []
    check(config())


def test_prompt_and_output_beyond_the_context_window_are_refused():
    # Qwen2.5-Coder: 32,768 positions (config.json)
    timing = roofline(("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"), tp=1, hardware="cpu")
    assert problems(config(timing=timing, prompt=30000, output=2768)) == []
    with pytest.raises(ValueError, match=r"34,000 tokens exceeds the context window of Qwen2\.5-Coder-1\.5B"):
        check(config(timing=timing, prompt=30000, output=4000))


def test_the_kv_cache_of_a_large_batch_does_not_fit():
    # 64 × 12,000 tokens × 81,920 B per device = 62.9 GB of KV plus 35.3 GB of weights > 72 GB usable
    with pytest.raises(ValueError, match=r"needs 98\.2 GB per device \(35\.3 GB weights \+ 62\.9 GB KV cache\)"):
        check(config(batch=64, prompt=8000, output=4000))
    assert problems(config(batch=16, prompt=8000, output=4000)) == []  # 15.7 GB of KV fits


def test_sds_draft_shares_the_targets_device_and_ssds_has_its_own():
    # batch 64 × 6,000 tokens: the target alone fits (66.8 GB), with SD's draft beside it (81.8 GB) not
    assert problems(config("ar", batch=64, prompt=4000, output=2000)) == []
    assert problems(config("ssd", batch=64, prompt=4000, output=2000)) == []
    (sd,) = problems(config("sd", batch=64, prompt=4000, output=2000))
    assert "with the SD draft Llama-3.2-1B" in sd and "81.8 GB" in sd


def test_ssds_draft_is_checked_on_its_own_hardware():
    small = dataclasses.replace(hardware_preset("h100"), name="tiny", memory_gb=3.0)
    timing = roofline(draft_hardware=small)
    (found,) = problems(config("ssd", batch=8, prompt=4000, output=2000, timing=timing))
    assert found.startswith("Llama-3.2-1B") and "tiny has 2.7 GB usable" in found and "--draft-hardware" in found
    assert problems(config("ar", batch=8, prompt=4000, output=2000, timing=timing)) == []  # AR has no draft


@pytest.mark.parametrize(
    "model, tp, message",
    [
        ("qwen3-32b", 3, "does not divide Qwen3-32B's 64 attention heads"),
        ("qwen2.5-coder-1.5b", 3, "neither divides Qwen2.5-Coder-1.5B-Instruct's 2 KV heads"),
    ],
)
def test_a_tp_degree_that_does_not_split_the_heads_is_refused(model, tp, message):
    (found,) = tp_problems(model_preset(model), tp)
    assert message in found and "choose a tensor-parallel degree" in found


@pytest.mark.parametrize("model, tp", [("qwen3-32b", 4), ("qwen3-32b", 16), ("qwen2.5-coder-1.5b", 4)])
def test_tp_degrees_that_split_or_copy_kv_heads_are_accepted(model, tp):
    assert tp_problems(model_preset(model), tp) == []  # 16 > 8 KV heads and 4 > 2: each device copies one


def test_timing_without_models_is_not_checked():
    assert problems(config(timing=ConstantTiming(), batch=10**6, prompt=10**6)) == []


# AR at a constant 10 ms per token, batch 1, 100-token requests: 99 rounds per request after the prefill's
# token, so about 1.01 requests per second at full load
CONSTANT = ConstantTiming(t_verify_ms=10.0)


def test_capacity_is_the_full_load_request_rate():
    assert capacity_per_s(config("ar", output=100, timing=CONSTANT, rate=0.5)) == pytest.approx(100 / 99, rel=0.02)


def test_arrivals_beyond_capacity_are_overloaded_and_quote_no_latency():
    over = config("ar", output=100, timing=CONSTANT, rate=5.0)
    found = overload(over)
    assert found.rate_per_s == 5.0 and found.capacity_per_s == pytest.approx(1.01, rel=0.02)
    assert str(found).startswith("overloaded: 5 requests/s arrive but this configuration serves at most 1.01")
    result, note = honest(over, simulate(over))
    assert note == found and result.settings["overloaded"] is True
    assert all(
        math.isnan(v) for name in ("ttft_ms", "itl_ms", "tpot_ms", "e2el_ms") for v in getattr(result, name).values()
    )


def test_arrivals_within_capacity_and_closed_loops_are_not_overloaded():
    # negative controls: the same configuration at half its capacity, and as a closed loop
    assert overload(config("ar", output=100, timing=CONSTANT, rate=0.5)) is None
    closed = config("ar", output=100, timing=CONSTANT)
    result = simulate(closed)
    assert overload(closed) is None and honest(closed, result) == (result, None)

"""A workload's shared prefix: requests after the first find it in the prefix cache and prefill only the rest."""

import json

import pytest

from engine.blocks.pool import DEFAULT_BLOCK_SIZE
from saguaro.cli import main
from simulator import (
    ClosedLoop,
    ConstantHit,
    ConstantTiming,
    IidAcceptance,
    Policy,
    Replayed,
    RooflineTiming,
    SimConfig,
    simulate,
)
from simulator.fit import FittedTiming
from simulator.presets import hardware_preset, model_preset
from simulator.scenario import Scenario
from simulator.timing import computed_share
from simulator.workload import PREFIX_BLOCK_TOKENS, OpenLoop, cached_tokens
from theory.glossary import Strategy


def test_the_simulator_matches_the_prefix_cache_in_the_engines_block_size():
    assert PREFIX_BLOCK_TOKENS == DEFAULT_BLOCK_SIZE


@pytest.mark.parametrize(
    ("prompt", "fraction", "cached"),
    [
        (1000, 0.0, 0),
        (1000, 0.5, 496),  # 500 tokens shared: 31 whole blocks
        (1000, 0.9, 896),
        (32, 0.99, 16),  # never the prompt's last token: 31 shared tokens make one whole block
        (16, 0.99, 0),  # the last token is in the only block
        (15, 0.5, 0),
    ],
)
def test_cached_tokens_are_whole_blocks_of_the_shared_part(prompt, fraction, cached):
    assert cached_tokens(prompt, fraction) == cached


@pytest.mark.parametrize("fraction", [-0.1, 1.0, 1.5, float("nan")])
def test_a_shared_fraction_outside_zero_to_one_is_refused(fraction):
    with pytest.raises(ValueError, match="shared_prefix"):
        ClosedLoop(1, shared_prefix=fraction)
    with pytest.raises(ValueError, match="shared_prefix"):
        OpenLoop(1.0, shared_prefix=fraction)
    with pytest.raises(ValueError, match="shared_prefix"):
        Scenario(timing=ConstantTiming(), shared_prefix=fraction)


def test_a_cached_count_must_leave_a_token_to_compute():
    assert computed_share(100, 0) == 1.0 and computed_share(100, 75) == 0.25
    for cached in (-1, 100, 101):
        with pytest.raises(ValueError, match="cached prompt tokens"):
            computed_share(100, cached)


def _roofline():
    hw = hardware_preset("h100")
    from simulator import Deployment

    return RooflineTiming(
        Deployment(model_preset("qwen2.5-coder-1.5b"), hw), Deployment(model_preset("qwen2.5-coder-0.5b"), hw)
    )


def test_the_roofline_prefills_the_computed_rows_against_the_cached_kv():
    timing = _roofline()
    whole = timing.prefill_ms(Strategy.SSD, 2, 1024)
    cached = timing.prefill_ms(Strategy.SSD, 2, 1024, cached=896)
    new = 1024 - 896
    assert cached == pytest.approx(timing.target.forward_ms(2 * new, 2 * 896, 2 * (new * 896 + new * (new + 1) // 2)))
    assert whole == pytest.approx(timing.target.forward_ms(2 * 1024, 0, 2 * 1024 * 1025 // 2))
    assert cached < whole
    assert timing.draft_prefill_ms(2, 1024, 896) < timing.draft_prefill_ms(2, 1024)
    # SD colocates its draft: its prefill is the target's and the draft's, each over the computed rows
    assert timing.prefill_ms(Strategy.SD, 2, 1024, 896) == pytest.approx(cached + timing.draft_prefill_ms(2, 1024, 896))


def test_the_fitted_prefill_line_counts_computed_rows_and_their_attention_pairs():
    fitted = FittedTiming(
        verify=(1.0, 0.1, 0.001),
        prefill_target=(5.0, 0.2, 0.0),
        prefill_draft=(2.0, 0.05, 0.0),
        prefill_attention=(1e-4, 2e-5),
    )
    b, n, c = 2, 512, 384
    assert fitted.prefill_ms(Strategy.AR, b, n, c) == pytest.approx(5.0 + 0.2 * b * (n - c) + 1e-4 * b * (n**2 - c**2))
    assert fitted.draft_prefill_ms(b, n, c) == pytest.approx(2.0 + 0.05 * b * (n - c) + 2e-5 * b * (n**2 - c**2))
    assert fitted.prefill_ms(Strategy.AR, b, n) == pytest.approx(5.0 + 0.2 * b * n + 1e-4 * b * n**2)


def test_a_stated_prefill_scales_with_the_computed_share():
    timing = ConstantTiming(t_prefill_ms=100.0, t_draft_prefill_ms=40.0)
    assert timing.prefill_ms(Strategy.AR, 1, 1000, 750) == pytest.approx(25.0)
    assert timing.prefill_ms(Strategy.SD, 1, 1000, 750) == pytest.approx(25.0 + 10.0)
    assert timing.draft_prefill_ms(1, 1000) == 40.0


def _ttfts(shared_prefix: float, strategy: str = "sd"):
    timing = ConstantTiming(t_verify_ms=10.0, t_draft_ms=1.0, t_prefill_ms=200.0, t_draft_prefill_ms=50.0)
    workload = Replayed((0.0, 1000.0, 2000.0), (1024, 1024, 1024), (4, 4, 4), max_batch=1, shared_prefix=shared_prefix)
    policy = Policy(strategy, K=2, fanout=(1, 1, 1) if strategy == "ssd" else None)
    hits = ConstantHit(0.5) if strategy == "ssd" else None
    return simulate(
        SimConfig(policy, timing, IidAcceptance(0.8), hits=hits, workload=workload, rounds=10_000, requests=3, seed=1)
    )


@pytest.mark.parametrize("strategy", ["sd", "ssd"])
def test_requests_after_the_first_reach_their_first_token_sooner(strategy):
    cold, warm = _ttfts(0.0, strategy), _ttfts(0.875, strategy)
    prefill = 200.0 + (50.0 if strategy == "sd" else 0.0)  # SSD's worker prefills the draft side meanwhile
    assert cold.ttft_ms["mean"] == pytest.approx(prefill)  # each arrives to an idle engine: TTFT is its prefill
    # the first fills the cache; the other two prefill 128 of 1024 tokens, an eighth of the stated prefill
    assert warm.ttft_ms["mean"] == pytest.approx((prefill + 2 * prefill / 8) / 3)


def test_simulate_takes_the_shared_fraction_and_echoes_it(tmp_path):
    path = tmp_path / "out.json"
    assert (
        main(
            [
                "simulate",
                "--strategy",
                "ar",
                "--prompt-len",
                "1024",
                "--shared-prefix",
                "0.9",
                "--rounds",
                "300",
                "--json",
                str(path),
            ]
        )
        == 0
    )
    assert json.loads(path.read_text())["inputs"]["workload"]["shared_prefix"] == 0.9


@pytest.mark.parametrize("value", ["1", "-0.5", "half"])
def test_simulate_refuses_a_shared_fraction_outside_zero_to_one(value, capsys):
    code = None
    try:
        code = main(["simulate", "--shared-prefix", value, "--rounds", "300"])
    except SystemExit as exit_info:  # argparse refuses a value that is not a number
        code = exit_info.code
    assert code == 2
    assert "shared" in capsys.readouterr().err

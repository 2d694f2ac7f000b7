"""K and budget "auto" in the simulator: settled as the engine's adaptive K and budget rule would settle them."""

import json
from dataclasses import replace

import pytest

from saguaro.cli import main
from simulator import ConstantTiming, FittedTiming, Grid, IidAcceptance, Lengths, Scenario, simulate, sweep
from simulator.scenario import AUTO, AUTO_K_MAX
from theory import Strategy
from theory.adaptive import best_K, round_rate


def _sd(alpha: float, draft_ms: float, verify_ms: float = 100.0) -> Scenario:
    timing = ConstantTiming(t_verify_ms=verify_ms, t_draft_ms=draft_ms)
    return Scenario(timing=timing, acceptance=IidAcceptance(alpha), output_len=None, rounds=4000, seed=3)


def _point(strategy="sd", K=AUTO, budget=0, batch=1):
    return {"strategy": Strategy(strategy), "K": K, "budget": budget, "backup": "neural", "batch": batch, "C": 1.0}


@pytest.mark.parametrize("alpha, draft_ms", [(0.5, 40.0), (0.9, 1.0)])
def test_sd_k_auto_is_the_closed_forms_best_k_where_it_wins_clearly(alpha, draft_ms):
    """A dear draft and a poor α: K = 1; a cheap draft and a good α: the cap. Each wins by more than 5% in
    the closed form (round_rate), far beyond 4,000 rounds' noise."""
    want = best_K(alpha, draft_ms, 100.0, AUTO_K_MAX)
    rates = sorted(round_rate(alpha, K, draft_ms, 100.0) for K in range(1, AUTO_K_MAX + 1))
    assert rates[-1] > 1.05 * rates[-2]
    chosen, line = _sd(alpha, draft_ms).resolve(_point())
    assert chosen["K"] == want
    assert line.startswith(f"sd batch 1: K auto -> {want} (decode tokens/s by K: 1: ")


def test_k_auto_keeps_the_fastest_of_the_fixed_k_simulations():
    scenario = _sd(0.8, 10.0)
    chosen, _ = scenario.resolve(_point())
    speeds = {K: simulate(scenario.config(**_point(K=K))).decode_tokens_per_s for K in range(1, AUTO_K_MAX + 1)}
    assert chosen["K"] == max(speeds, key=speeds.get)


def test_a_fixed_k_and_ar_are_left_as_they_are():
    scenario = _sd(0.8, 10.0)
    assert scenario.resolve(_point(K=3)) == (_point(K=3), None)
    assert scenario.resolve(_point("ar", K=0)) == (_point("ar", K=0), None)


# -- budget auto: the build within 90% of SSD's verify ------------------------------------------------------
# verify 100 ms flat; one draft step 10 ms + 1 ms a row; so a build at K, batch b, N branches takes
# (10 + b·(K + 1)) + K·(10 + N) ms (the glue forward, then K steps over the branches).
FITTED = FittedTiming(verify=(100.0, 0.0, 0.0), draft=(10.0, 1.0, 0.0))


def _ssd(timing=FITTED) -> Scenario:
    return Scenario(
        timing=timing, acceptance=IidAcceptance(0.8), prompt_len=Lengths(100), output_len=Lengths(100), rounds=2000
    )


def test_budget_auto_is_the_largest_budget_whose_build_fits_the_share_of_a_verify():
    # K = 3, batch 1: 14 + 3·(10 + B) <= 90  ->  B <= 15.3; batch 2: 18 + 3·(10 + 2B) <= 90  ->  B <= 7
    assert _ssd().auto_budget(3, 1) == 15
    assert _ssd().auto_budget(3, 2) == 7
    build = lambda B: FITTED.cache_build_ms(1, 3, B, 150)  # noqa: E731
    assert build(15) <= 90 < build(16)


def test_budget_auto_has_a_floor_and_a_cap():
    slow = FittedTiming(verify=(20.0, 0.0, 0.0), draft=(10.0, 1.0, 0.0))  # even one branch outlasts it
    assert replace(_ssd(slow), fanout_rule="uniform").auto_budget(3) == 4  # one guess per outcome
    assert _ssd(slow).auto_budget(3) == 1  # geometric: one guess in all
    free = FittedTiming(verify=(1e6, 0.0, 0.0), draft=(10.0, 1.0, 0.0))
    assert _ssd(free).auto_budget(3) == 64 * 4


@pytest.mark.parametrize("schedule", ["uniform", "geometric"])
@pytest.mark.parametrize("K", [1, 3, 6])
def test_budget_auto_floor_is_the_engines(schedule, K):
    """The simulator's floor is the engine's (`least_budget`): with the uniform floor for both, the int4 run at
    K 3 of 2026-12-02 (engine: one guess, 0-0-0-1) was predicted at budget 4, 33% slow."""
    from engine.config import SpeculativeConfig
    from engine.ssd.policy import least_budget

    spec = SpeculativeConfig(K=K, schedule=schedule, budget="auto")
    assert replace(_ssd(), fanout_rule=schedule).least_budget(K) == least_budget(spec, K)


def test_ssd_with_k_and_budget_auto_sizes_each_k_s_cache():
    chosen, line = _ssd().resolve(_point("ssd", K=AUTO, budget=AUTO))
    assert chosen["budget"] == _ssd().auto_budget(chosen["K"], 1)
    assert f"K auto -> {chosen['K']}, budget auto -> {chosen['budget']}" in line
    fixed, line = _ssd().resolve(_point("ssd", K=3, budget=AUTO))
    assert fixed["K"] == 3 and fixed["budget"] == 15 and line == "ssd K 3 batch 1: budget auto -> 15"


def test_a_sweep_resolves_auto_points():
    results = sweep(_sd(0.5, 40.0), Grid(strategies=(Strategy.SD,), K=(AUTO, 3)))
    assert [settings["K"] for settings, _ in results] == [1, 3]


def test_cli_k_auto(tmp_path, capsys):
    out = tmp_path / "out.json"
    argv = [
        "simulate",
        "--strategy",
        "sd",
        "-K",
        "auto",
        "--timing",
        "constant",
        "--t-verify-ms",
        "100",
        "--t-draft-ms",
        "40",
        "--alpha",
        "0.5",
        "--output-len",
        "inf",
        "--rounds",
        "2000",
        "--json",
        str(out),
    ]
    assert main(argv) == 0
    assert "auto: sd batch 1: K auto -> 1" in capsys.readouterr().err
    assert json.loads(out.read_text())["results"][0]["settings"]["K"] == 1


def test_cli_refuses_a_k_that_is_neither_a_number_nor_auto(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", "-K", "some"])
    assert exit_info.value.code == 2
    assert "expected a whole number or auto" in capsys.readouterr().err


def test_k_auto_refuses_replayed_records():
    from simulator import Replay
    from simulator.records import parse_record
    from tests.simulator.synthetic import engine_run

    records = tuple(parse_record(r, "synthetic") for r in engine_run("sd", 3, 1, 20))
    scenario = replace(_sd(0.8, 10.0), acceptance=Replay(records))
    with pytest.raises(ValueError, match="replayed records hold one"):
        scenario.resolve(_point())

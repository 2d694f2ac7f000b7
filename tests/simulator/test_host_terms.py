"""The simulator's host terms from the engine's rounds with the forwards taken out (simulator.host_terms): the
derivation is exact, the "saguaro-cpu" preset reads the committed measurement, and the terms lengthen rounds."""

import dataclasses
import json

import pytest

from simulator import ClosedLoop, ConstantHit, Deployment, IidAcceptance, Policy, RooflineTiming, SimConfig, simulate
from simulator.fit import FittedTiming
from simulator.host_terms import HOST_FIELDS, HostRound, HostTerms, engine_costs, outside_terms, read_host_terms
from simulator.presets import MEASURED_ENGINES, engine_preset, hardware_preset, model_preset
from simulator.timing import EngineCosts
from theory.glossary import Strategy

K = 4
TERMS = EngineCosts(
    round_host_ms=0.15,
    round_row_us=20.0,
    verify_host_ms=0.45,
    verify_row_us=45.0,
    draft_host_ms=0.09,
    draft_row_us=12.0,
    tree_step_overhead_ms=0.3,
    build_row_us=7.0,
)
BUDGET = 15  # branch rows a build decodes per sequence


def synthetic_rounds(costs: EngineCosts, batches=(1, 8), verify_share: float = 0.6) -> list[HostRound]:
    """Host rounds as the simulator's model of them says (simulator.host_terms' docstring), forwards at zero."""
    rounds = []
    for b in batches:
        A = costs.round_host_ms + b * costs.round_row_us * 1e-3
        V = costs.verify_host_ms + b * costs.verify_row_us * 1e-3
        D = costs.draft_host_ms + b * costs.draft_row_us * 1e-3
        n = b * BUDGET
        build = (K + 1) * D + K * (costs.tree_step_overhead_ms + n * costs.build_row_us * 1e-3)
        answer = 0.3
        sd_draft = K * D
        rounds += [
            HostRound("ar", b, A, verify_share * A, 0.0, A, (1 - verify_share) * A, 64),
            HostRound(
                "sd",
                b,
                A + V + sd_draft,
                verify_share * (A + V),
                sd_draft,
                A + V,
                (1 - verify_share) * (A + V),
                64,
                draft_forwards=K,
                accepted=1.0,
            ),
            HostRound(
                "ssd",
                b,
                A + V + answer + build,
                verify_share * (A + V),
                answer + build,
                A + V,
                (1 - verify_share) * (A + V),
                64,
                build_ms=build,
                branches=n,
                answer_ms=answer,
                accepted=1.0,
            ),
        ]
    return rounds


def test_the_terms_come_back_exactly_from_rounds_their_model_made():
    derived = engine_costs(synthetic_rounds(TERMS), K)
    for name in HOST_FIELDS:
        assert getattr(derived, name) == pytest.approx(getattr(TERMS, name), rel=1e-9, abs=1e-12), name


def test_three_batch_sizes_on_one_line_give_the_same_terms():
    derived = engine_costs(synthetic_rounds(TERMS, batches=(1, 4, 8)), K)
    for name in HOST_FIELDS:
        assert getattr(derived, name) == pytest.approx(getattr(TERMS, name), rel=1e-9, abs=1e-12), name


def test_the_roofline_with_the_terms_adds_exactly_the_measured_host_work():
    rounds = synthetic_rounds(TERMS)
    costs = engine_costs(rounds, K)
    hw = hardware_preset("h100")
    target, draft = (
        Deployment(model_preset("qwen2.5-coder-1.5b"), hw),
        Deployment(model_preset("qwen2.5-coder-0.5b"), hw),
    )
    timed, bare = RooflineTiming(target, draft, engine=costs), RooflineTiming(target, draft)
    at = {(r.strategy, r.batch): r for r in rounds}
    for b in (1, 8):
        ar, sd, ssd = at["ar", b], at["sd", b], at["ssd", b]
        assert timed.overhead_ms(Strategy.AR, b) - bare.overhead_ms(Strategy.AR, b) == pytest.approx(ar.step_ms)
        sd_host = (
            timed.overhead_ms(Strategy.SD, b)
            + timed.draft_ms(b, K, 100)
            - bare.overhead_ms(Strategy.SD, b)
            - bare.draft_ms(b, K, 100)
        )
        assert sd_host == pytest.approx(sd.step_ms)
        assert timed.overhead_ms(Strategy.SSD, b) - bare.overhead_ms(Strategy.SSD, b) == pytest.approx(ssd.target_ms)
        build = timed.cache_build_ms(b, K, ssd.branches, 100) - bare.cache_build_ms(b, K, ssd.branches, 100)
        assert build == pytest.approx(ssd.build_ms)


def test_rounds_at_one_batch_size_give_no_terms():
    with pytest.raises(ValueError, match="two common batch sizes"):
        engine_costs(synthetic_rounds(TERMS, batches=(1,)), K)


def test_a_term_the_rounds_would_put_below_zero_is_held_at_zero_and_the_rest_fitted():
    rounds = synthetic_rounds(TERMS)
    # AR at batch 1 slowed by 0.3 ms: its line through both points would start below zero per row
    slow = [
        dataclasses.replace(r, step_ms=r.step_ms + 0.3, target_ms=r.target_ms + 0.3)
        if r.strategy == "ar" and r.batch == 1
        else r
        for r in rounds
    ]
    derived = engine_costs(slow, K)
    assert derived.round_row_us == 0.0
    ar = {r.batch: r.step_ms for r in slow if r.strategy == "ar"}
    # the level line with the least squared miss as a fraction of each point
    assert derived.round_host_ms == pytest.approx((1 / ar[1] + 1 / ar[8]) / (1 / ar[1] ** 2 + 1 / ar[8] ** 2))


def test_the_work_outside_the_timers_is_a_line_in_the_batch_per_strategy():
    outside = outside_terms(synthetic_rounds(TERMS, verify_share=0.6))
    A = lambda b: TERMS.round_host_ms + b * TERMS.round_row_us * 1e-3  # noqa: E731
    fixed, per_row = outside["ar"]
    assert fixed + 8 * per_row == pytest.approx(0.4 * A(8))
    assert fixed + per_row == pytest.approx(0.4 * A(1))
    assert set(outside) == {"ar", "sd", "ssd"}


def test_a_measurement_round_trips_through_its_json():
    terms = HostTerms(K, tuple(synthetic_rounds(TERMS)), {"cpu": "a CPU", "commit": "abc", "date": "2026-12-05"})
    back = HostTerms.from_dict(json.loads(json.dumps(terms.to_dict())))
    assert back == terms
    assert back.costs() == terms.costs()


def test_a_file_that_is_not_a_measurement_is_refused_with_what_it_needs(tmp_path):
    path = tmp_path / "terms.json"
    path.write_text(json.dumps({"rounds": []}))
    with pytest.raises(ValueError, match="needs K and rounds"):
        read_host_terms(path)


def test_the_saguaro_cpu_preset_takes_its_terms_from_the_committed_measurement():
    path = MEASURED_ENGINES["saguaro-cpu"]
    measured = read_host_terms(path)
    assert engine_preset("saguaro-cpu") == measured.costs()
    assert all(measured.meta.get(key) for key in ("cpu", "commit", "date", "load_average_before"))
    assert measured.meta["vocab"] == model_preset("qwen2.5-coder-1.5b").vocab
    stored = json.loads(path.read_text())["engine_costs"]  # the file's own reading of its terms, kept in step
    assert stored == {name: round(getattr(measured.costs(), name), 4) for name in HOST_FIELDS}


def test_the_stated_engine_presets_have_no_measured_host_terms():
    for name in ("saguaro", "reference", "reference-log"):
        costs = engine_preset(name)
        assert all(getattr(costs, f) == 0 for f in ("round_row_us", "verify_host_ms", "verify_row_us", "draft_row_us"))


def _round_ms(strategy: str, costs: EngineCosts, batch: int) -> float:
    hw = hardware_preset("h100")
    timing = RooflineTiming(
        Deployment(model_preset("qwen2.5-coder-1.5b"), hw),
        Deployment(model_preset("qwen2.5-coder-0.5b"), hw),
        engine=costs,
    )
    K_of = {"ar": 0, "sd": K, "ssd": K}
    policy = Policy(strategy, K=K_of[strategy], fanout=(3,) * (K + 1) if strategy == "ssd" else None)
    result = simulate(
        SimConfig(
            policy,
            timing,
            IidAcceptance(0.8),
            ConstantHit(0.9) if strategy == "ssd" else None,
            workload=ClosedLoop(concurrency=batch),
            rounds=300,
            seed=0,
        )
    )
    return result.sim_ms / result.rounds


@pytest.mark.parametrize("strategy", ["ar", "sd", "ssd"])
@pytest.mark.parametrize("batch", [1, 8])
def test_a_simulation_with_the_measured_terms_predicts_longer_rounds(strategy, batch):
    assert _round_ms(strategy, engine_preset("saguaro-cpu"), batch) > _round_ms(strategy, EngineCosts(), batch)


def test_a_round_without_host_terms_is_as_long_at_any_batch_as_the_preset_said():
    timing = RooflineTiming(
        Deployment(model_preset("qwen2.5-coder-1.5b"), hardware_preset("h100")),
        Deployment(model_preset("qwen2.5-coder-0.5b"), hardware_preset("h100")),
        engine=engine_preset("saguaro-eager-h200"),
    )
    assert timing.overhead_ms(Strategy.SD, 8) == timing.overhead_ms(Strategy.SD, 1) == 58.0


def test_a_fit_counts_the_measured_host_work_where_its_records_time_none():
    fit = FittedTiming(verify=(1.0, 0.0, 0.0), overhead={"ar": 0.0, "sd": 5.0})
    host = fit.with_host_overhead({"ar": (0.2, 0.05), "sd": (0.3, 0.1)})
    assert host.overhead_ms(Strategy.AR, 8) == pytest.approx(0.2 + 8 * 0.05)
    assert host.overhead_ms(Strategy.SD, 8) == 5.0  # a real run's overhead, larger, stays
    assert host.overhead_ms(Strategy.SSD, 8) == 0.0  # nothing measured for it
    assert fit.overhead_ms(Strategy.AR, 8) == 0.0

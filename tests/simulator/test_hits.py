"""The empirical hit model: it reproduces the analytic power law from synthetic records drawn from it, tells
a different law apart (negative control), and reads the engine's outcome ranks the way the cache guesses."""

import json

import numpy as np
import pytest

from simulator.acceptance import PowerLawHit
from simulator.hits import KEPT, EmpiricalHit, RankCounts, alpha_per_position, from_records, measured
from simulator.records import parse_record
from theory.fanout import expected_hit_probability, outcome_probabilities

K = 3


def power_law_ranks(rng, n: int, r: float, scale: float) -> np.ndarray:
    """Ranks with P(rank ≥ F) = min(1, scale·F^(−r)) for F ≥ 1: inverse-CDF draws."""
    u = rng.random(n)
    # rank ≥ F iff u < scale·F^(−r) iff F ≤ (scale/u)^(1/r): rank = floor((scale/u)^(1/r)), 0 when u > scale
    return np.where(u < scale, np.floor((scale / u) ** (1 / r)), 0).astype(np.int64)


def synthetic_records(rng, rounds: int, r: float, scale: float, alpha: float = 0.7, batch: int = 4):
    lines = []
    for i in range(rounds):
        accepted = [int(min(rng.geometric(1 - alpha) - 1, K)) for _ in range(batch)]
        ranks = power_law_ranks(rng, batch, r, scale).tolist()
        lines.append(
            parse_record(
                {
                    "strategy": "sd",
                    "round": i,
                    "batch_size": batch,
                    "K": K,
                    "context_len": 10 + i,
                    "accepted": accepted,
                    "emitted": [k + 1 for k in accepted],
                    "draft_ms": 1.0,
                    "verify_ms": 2.0,
                    "round_ms": 3.0,
                    "draft_forwards": K,
                    "outcome_rank": ranks,
                    "prompt_index": list(range(batch)),
                }
            )
        )
    return lines


def test_synthetic_records_drawn_from_the_power_law_give_back_the_power_law():
    rng = np.random.default_rng(0)
    model = from_records(synthetic_records(rng, 5000, r=0.8, scale=0.6))
    analytic = PowerLawHit(0.8, 0.6)
    for fanout in [(1, 1, 1, 1), (3, 2, 2, 5), (8, 4, 2, 16), (0, 0, 0, 3)]:
        assert model.hit_prob(fanout, True) == pytest.approx(analytic.hit_prob(fanout, True), abs=0.02)
    fit = model.meta["power_law"]
    assert fit["r_ci95"][0] <= 0.8 <= fit["r_ci95"][1] and fit["scale"] == pytest.approx(0.6, rel=0.1)
    F = np.array([2, 3, 2, 6])  # the closed forms' p_hit agrees too
    assert model.hit_rate(0.7, tuple(F)) == pytest.approx(float(expected_hit_probability(F, 0.7, 0.8, 0.6)), abs=0.02)
    # beyond the kept ranks the fitted tail carries on
    big = (2 * KEPT, 4 * KEPT, KEPT, 10 * KEPT)
    assert model.hit_prob(big, True) == pytest.approx(analytic.hit_prob(big, True), abs=0.01)


def test_a_different_law_is_told_apart():
    """Negative control: records drawn with r = 0.4 do not reproduce r = 0.8 (same check as above)."""
    rng = np.random.default_rng(1)
    model = from_records(synthetic_records(rng, 5000, r=0.4, scale=0.6))
    fanout = (3, 2, 2, 5)
    gap = np.abs(model.hit_prob(fanout, True) - PowerLawHit(0.8, 0.6).hit_prob(fanout, True))
    assert gap.max() > 0.05
    assert not model.meta["power_law"]["r_ci95"][0] <= 0.8 <= model.meta["power_law"]["r_ci95"][1]


def test_rank_counts_measure_the_miss_curve():
    counts = RankCounts.of([0, 0, 1, 3, KEPT + 5])
    assert counts.total == 5 and counts.beyond == 1
    assert counts.miss(np.array([0, 1, 2, 4])).tolist() == pytest.approx([1.0, 0.6, 0.4, 0.2])


def test_fast_backup_rows_and_unknown_ranks_are_left_out_and_alpha_is_per_position():
    base = {
        "round": 0,
        "batch_size": 2,
        "K": 2,
        "context_len": 5,
        "accepted": [2, 0],
        "emitted": [3, 1],
        "draft_ms": 1.0,
        "verify_ms": 1.0,
        "round_ms": 2.0,
        "draft_forwards": 0,
    }
    ssd = {
        **base,
        "strategy": "ssd",
        "hit": [True, False],
        "backup": "random",
        "cache_build_ms": 1.0,
        "branches": 4,
        "wait_ms": 1.0,
        "fanout": [1, 1, 2],
        "outcome_rank": [4, 0],
    }
    sd = {**base, "strategy": "sd", "accepted": [1, 0], "emitted": [2, 1], "outcome_rank": [2, None]}
    records = [parse_record(ssd), parse_record(sd)]
    model = from_records(
        records + [parse_record({**sd, "accepted": [2, 2], "emitted": [3, 3], "outcome_rank": [0, 1]})]
    )
    assert model.all_accepted.total == 3 and model.pooled_rejected.total == 1  # the random-backup row is out
    assert alpha_per_position(records) == pytest.approx([2 / 3, 1 / 2], abs=1e-4)


def test_a_table_round_trips_and_the_shipped_one_is_chosen_by_temperature(tmp_path):
    rng = np.random.default_rng(2)
    model = from_records(synthetic_records(rng, 300, r=1.0, scale=0.5))
    again = EmpiricalHit.from_dict(json.loads(json.dumps(model.to_dict())))
    assert again.hit_prob((2, 2, 2, 2), True).tolist() == model.hit_prob((2, 2, 2, 2), True).tolist()
    path = tmp_path / "tables.json"
    entry = lambda T, C: {"workload": "w", "temperature": T, "C": C, "model": model.to_dict()}  # noqa: E731
    path.write_text(json.dumps({"pair": "p", "entries": [entry(0.0, 1.0), entry(0.7, 0.5)]}))
    assert "T=0.7, C=0.5" in measured("w", 0.8, 0.5, path).source
    with pytest.raises(ValueError, match="measured: w"):
        measured("other", 0.0, 1.0, path)


def test_the_best_schedule_is_the_best_of_all_schedules():
    import itertools

    from simulator.hits import best_schedule

    model = from_records(synthetic_records(np.random.default_rng(3), 1500, r=0.7, scale=0.8))
    for alpha, B in [(0.6, 0), (0.6, 3), (0.8, 7), (0.9, 10)]:
        chosen = best_schedule(model, alpha, K, B)
        schedules = [f for f in itertools.product(range(B + 1), repeat=K + 1) if sum(f) == B]
        assert sum(chosen) == B
        assert model.hit_rate(alpha, chosen) == pytest.approx(max(model.hit_rate(alpha, f) for f in schedules))


def test_a_budget_beyond_the_counted_ranks_is_split_in_the_power_laws_tail():
    """B = 10^6: no outcome can take it within KEPT counted ranks, so the schedule is the tail's proportional
    split, made without running the programme over a million budgets."""
    from simulator.hits import best_schedule

    model = from_records(synthetic_records(np.random.default_rng(3), 1500, r=0.7, scale=0.8))
    F = np.array(best_schedule(model, 0.8, K, 10**6))
    assert F.sum() == 10**6 and F.min() > KEPT
    share = outcome_probabilities(0.8, K) ** (1 / (1 + model.tail_r))
    assert np.all(np.abs(F - 10**6 * share / share.sum()) < 1)


def test_theory_simulate_and_plan_share_one_default_hit_model(capsys):
    """One default where no pair is named (the α-model at α): `theory fanout`'s hit probability of a schedule
    is the simulated SSD hit rate of that schedule (no new sequences: every lookup follows a verified round)."""
    from saguaro.cli import main
    from simulator import ClosedLoop, ConstantTiming, IidAcceptance, Policy, Scenario, SimConfig, simulate

    assert main(["theory", "fanout", "--alpha", "0.8", "--K", "4", "--B", "10", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    fanout = tuple(int(f) for f in out["schedules"]["optimal_integer"])
    model = Scenario(ConstantTiming()).hits  # the API's default model is the same α-model
    assert out["hit_model"].startswith(model.source)
    config = SimConfig(
        policy=Policy("ssd", K=4, fanout=fanout),
        timing=ConstantTiming(),
        acceptance=IidAcceptance(0.8),
        hits=model,
        workload=ClosedLoop(1, output_len=None),
        rounds=20_000,
        seed=2,
    )
    simulated = simulate(config).hit_rate
    assert simulated == pytest.approx(out["hit_probability"]["optimal_integer"], abs=0.01)


def _agreement_world(rng, rounds: int, agree: float | tuple[float, ...], batch: int = 4):
    """SD records from a world where, at position i, the target's token is the draft's first choice with
    probability `agree` (or `agree[i]`, i = 0..K, the last for the bonus after all K accepted; then accepted,
    at T = 0) and otherwise ranks 1 + Geometric(½) among the draft's guesses; a rejection records the rank
    with the rejected first choice left out (one place higher)."""
    agree = tuple(agree) if isinstance(agree, tuple) else (agree,) * (K + 1)
    lines = []
    for i in range(rounds):
        accepted, ranks = [], []
        for _ in range(batch):
            k = 0
            while k < K and rng.random() < agree[k]:
                k += 1
            accepted.append(k)
            below = int(rng.geometric(0.5))  # the target's rank among the draft's guesses when not the first
            ranks.append(below - 1 if k < K else (0 if rng.random() < agree[K] else below))
        lines.append(
            parse_record(
                {
                    "strategy": "sd",
                    "round": i,
                    "batch_size": batch,
                    "K": K,
                    "context_len": 10 + i,
                    "accepted": accepted,
                    "emitted": [k + 1 for k in accepted],
                    "draft_ms": 1.0,
                    "verify_ms": 2.0,
                    "round_ms": 3.0,
                    "draft_forwards": K,
                    "outcome_rank": ranks,
                    "prompt_index": list(range(batch)),
                }
            )
        )
    return lines


@pytest.mark.parametrize("F0", [1, 2, 3])
def test_after_a_fast_backup_a_rejection_says_nothing_against_the_drafts_first_choice(F0):
    """A random or looked-up token the target rejects was not the draft's guess: the bonus is in the draft's
    top F iff its rank, unconditioned, is below F: P = a + (1 − a)·(1 − ½^(F−1)). The rejection table alone
    (what the model gave before; `draft_sourced` True) is the rank after the draft's own guess failed."""
    agree = 0.8
    model = from_records(_agreement_world(np.random.default_rng(1), 4000, agree))
    fanout = (F0, 2, 2, 3)
    truth = agree + (1 - agree) * (1 - 0.5 ** (F0 - 1))
    after_fast = model.hit_prob(fanout, False, draft_sourced=False)
    assert after_fast[0] == pytest.approx(truth, abs=0.02)
    after_draft = model.hit_prob(fanout, False, draft_sourced=True)
    assert after_draft[0] == pytest.approx(1 - 0.5**F0, abs=0.02)  # the draft's own rejection: rank − 1
    assert abs(after_draft[0] - truth) > 0.05  # negative control: the rejection table misses the fast case
    assert after_fast[K] == after_draft[K]  # all accepted: the same table either way
    assert model.hit_prob(fanout, True).tolist() == after_draft.tolist()  # the default is the draft's case


@pytest.mark.parametrize("F", [1, 2, 3])
def test_all_accepted_below_the_measured_K_reads_the_position_the_records_drafted(F):
    """K 2 simulated from K 3 records: its all-accepted bonus stands at position 3, where the records drafted
    a token. There the target's token is the draft's first choice with α_3 and otherwise ranks
    1 + Geometric(½): P(hit) = α_3 + (1 − α_3)·(1 − ½^(F−1)). The records' own all-accepted ranks are at
    position 4 (α 0.6 here): the former reading, kept when a table has no α, is the negative control."""
    agree = (0.85, 0.85, 0.95, 0.6)
    model = from_records(_agreement_world(np.random.default_rng(3), 6000, agree))
    truth = agree[2] + (1 - agree[2]) * (1 - 0.5 ** (F - 1))
    hit = model.hit_prob((2, 1, F), True)
    assert hit[2] == pytest.approx(truth, abs=0.015)
    assert model.hit_prob((2, 1, 0), True)[2] == 0.0  # no guesses, no hit
    without_alpha = EmpiricalHit(model.rejected, model.all_accepted, model.tail_r)
    former = without_alpha.hit_prob((2, 1, F), True)[2]
    assert former == pytest.approx(agree[3] + (1 - agree[3]) * (1 - 0.5 ** (F - 1)), abs=0.015)
    assert abs(former - truth) > 0.05
    # at the measured K, and above it, the all-accepted ranks are what was measured
    assert model.hit_prob((1, 1, 1, F), True)[3] == pytest.approx(without_alpha.hit_prob((1, 1, 1, F), True)[3])
    assert model.hit_prob((1,) * 5 + (F,), True)[5] == without_alpha.hit_prob((1,) * 5 + (F,), True)[5]


def test_the_simulator_asks_for_the_fast_backup_table_only_after_a_fast_backup():
    from simulator.acceptance import PerPositionAcceptance, Source
    from simulator.draws import TableDraws

    calls = []

    class Spy:
        def hit_prob(self, fanout, from_cache, draft_sourced=True):
            calls.append((from_cache, draft_sourced))
            return np.full(len(fanout), 0.5)

    for source, sourced in ((Source.DRAFT, True), (Source.RANDOM, False), (Source.LOOKUP, False)):
        calls.clear()
        TableDraws(
            PerPositionAcceptance((0.8,) * K, alpha_random=0.1, alpha_lookup=0.3),
            Spy(),
            K,
            source,
            (2, 2, 2, 2),
            None,
            np.random.default_rng(0),
        )
        assert calls == [(True, True), (False, sourced)]

"""The α-model of cache hits (simulator/alpha_hits.py): what it was fitted to, how it moves with α, and its
place as the default where no pair's rank table applies."""

import json
from itertools import pairwise

import numpy as np
import pytest

from simulator import ConstantTiming, IidAcceptance, Scenario
from simulator.alpha_hits import AlphaHit, fit_tables, shipped_fit, table_points
from simulator.hits import TABLES, best_schedule, load_tables, measured

UNIFORM = (3,) * 8  # K 7, F 3: the paper's SSD


def test_the_shipped_fit_is_the_fit_of_the_shipped_tables():
    tables = load_tables(TABLES)
    refit = fit_tables(tables, tables["pair"], resamples=3)
    assert refit.params.as_tuple() == pytest.approx(shipped_fit().params.as_tuple(), abs=1e-3)
    assert refit.scatter == pytest.approx(shipped_fit().scatter, abs=1e-4)
    assert len(shipped_fit().resampled) == 200


def test_it_weighs_tables_without_saguaro_and_without_overlap():
    points = table_points(load_tables(TABLES))
    names = {(p.workload, p.temperature) for p in points}
    assert ("spec_bench", 0.0) not in names and ("spec_bench/mt_bench", 0.0) in names  # tasks, not their union
    assert all(p.rejections >= 10 for p in points) and ("humaneval", 0.0) in names


def test_a_better_aligned_draft_hits_more():
    rates = [AlphaHit(a).hit_rate(a, UNIFORM) for a in (0.6, 0.7, 0.8, 0.9, 0.95)]
    assert all(b > a for a, b in pairwise(rates))


def test_it_lands_within_its_stated_scatter_of_the_tables_it_was_fitted_on():
    # HumanEval (α 0.97) and Spec-Bench (α 0.72) at T 0, K 4, F 3 each: within twice the RMS it states
    scatter = shipped_fit().scatter
    assert 0.02 < scatter < 0.15
    for workload in ("humaneval", "spec_bench"):
        table = measured(workload, 0.0)
        alpha = float(np.mean(table.meta["alpha"]))
        fanout = (3,) * 5
        gap = AlphaHit(alpha).hit_rate(alpha, fanout) - table.hit_rate(alpha, fanout)
        assert abs(gap) < 2 * scatter


def test_its_interval_brackets_its_rate_and_is_wider_at_low_alpha():
    wide = AlphaHit(0.6).interval(UNIFORM)
    narrow = AlphaHit(0.95).interval(UNIFORM)
    for rate, low, high in (wide, narrow):
        assert low <= rate <= high
    assert wide[2] - wide[1] > narrow[2] - narrow[1]


def test_all_accepted_hits_with_the_drafts_first_choice():
    model = AlphaHit(0.9)
    assert model.hit_prob((0, 0, 1), True)[2] >= 0.9  # the bonus after all K is the draft's first choice at least α
    assert model.hit_prob((0, 0, 0), True)[2] == 0.0


def test_the_scenario_default_is_the_alpha_model_at_its_acceptance():
    hits = Scenario(ConstantTiming(), acceptance=IidAcceptance(0.85)).hits
    assert isinstance(hits, AlphaHit) and hits.alpha == 0.85


def test_the_best_schedule_searches_the_alpha_model_too():
    model = AlphaHit(0.8)
    schedule = best_schedule(model, 0.8, 4, 12)
    assert sum(schedule) == 12 and model.hit_rate(0.8, schedule) >= model.hit_rate(0.8, (3, 3, 2, 2, 2))


def test_an_alpha_of_one_is_refused():
    with pytest.raises(ValueError, match="acceptance rate in"):
        AlphaHit(1.0)


def test_a_fit_file_that_is_not_one_is_refused(tmp_path):
    from simulator.alpha_hits import AlphaHitFit

    with pytest.raises(ValueError, match="not an α hit-model fit"):
        AlphaHitFit.from_dict(json.loads('{"params": [0, 0, 0, 1]}'))

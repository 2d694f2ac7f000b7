"""Capacity planning on constant timings, where the answer can be checked by hand, and on the roofline where
some grid points cannot run."""

import json
import math

import pytest

from simulator import (
    ConstantTiming,
    Deployment,
    Grid,
    LatencyTarget,
    Lengths,
    RooflineTiming,
    Scenario,
    plan,
    write_chrome_trace,
)
from simulator.plan import missed, shortfall
from simulator.presets import hardware_preset, model_preset
from simulator.trace import chrome_trace

# AR: 10 ms per token; SD K=4 at α=0.8: (4·1 + 10) = 14 ms per round for 3.36 tokens.
SCENARIO = Scenario(
    ConstantTiming(t_verify_ms=10.0, t_draft_ms=1.0), prompt_len=Lengths(64), output_len=Lengths(100), rounds=1500
)


def test_plan_sizes_replicas_from_full_load_capacity():
    result = plan(
        SCENARIO,
        Grid(strategies=("ar",), batch=(4,)),
        rate_per_s=10.0,
        target=LatencyTarget("itl", 99, 50.0),
        headroom=1.0,
        check_requests=200,
    )
    best = result.best
    # 4 sequences at 100 tokens/s each, 100-token requests: 4 requests/s per replica
    assert best.capacity_per_s == pytest.approx(4.0, rel=0.02)
    assert best.replicas == math.ceil(10.0 / best.capacity_per_s) == 3
    assert best.checked_latency_ms <= 50.0 and best.accelerators == 3


def test_plan_prefers_the_strategy_that_needs_fewer_accelerators():
    result = plan(
        SCENARIO,
        Grid(strategies=("ar", "sd"), K=(4,), batch=(1,)),
        rate_per_s=3.0,
        target=LatencyTarget("tpot", 50, 20.0),
        check_requests=100,
    )
    assert result.best.settings["strategy"] == "sd"  # ~4.2 ms per token against AR's 10 ms
    assert result.best.accelerators < next(c for c in result.candidates if c.settings["strategy"] == "ar").accelerators


def test_an_unreachable_target_gives_no_plan():
    result = plan(SCENARIO, Grid(strategies=("ar",), batch=(1,)), rate_per_s=1.0, target=LatencyTarget("itl", 99, 5.0))
    assert result.best is None and result.rejected


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"rate_per_s": 0.0}, "arrival rate"),
        ({"objective": "cheapest"}, "objective"),
        ({"headroom": 1.5}, "headroom"),
    ],
)
def test_bad_plan_inputs_are_refused(kwargs, message):
    args = {"rate_per_s": 1.0, "target": LatencyTarget(), **kwargs}
    with pytest.raises(ValueError, match=message):
        plan(SCENARIO, Grid(strategies=("ar",)), **args)


def test_plan_on_end_to_end_latency():
    # AR at batch 1: 100-token requests take about 99 × 10 ms; a 1.5 s E2EL target holds at a low rate
    result = plan(
        SCENARIO,
        Grid(strategies=("ar",), batch=(1,)),
        rate_per_s=0.2,
        target=LatencyTarget("e2el", 50, 1500.0),
        check_requests=30,
    )
    assert result.best is not None and 990.0 <= result.best.latency_ms <= 1500.0


def test_a_metric_without_samples_meets_no_target():
    assert not LatencyTarget("tpot", 99, 1e9).met_by(float("nan"))
    assert LatencyTarget("tpot", 99, 10.0).met_by(10.0)


def test_latency_targets_are_validated():
    with pytest.raises(ValueError, match="latency metric"):
        LatencyTarget("e2e", 99, 1.0)
    with pytest.raises(ValueError, match="percentile"):
        LatencyTarget("itl", 95, 1.0)


def test_chrome_trace_has_one_row_per_actor(tmp_path):
    timeline = [("target", "verify", 4.0, 14.0), ("draft", "backup", 0.5, 3.5)]
    trace = chrome_trace(timeline)
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [(e["name"], e["ts"], e["dur"]) for e in spans] == [("backup", 500.0, 3000.0), ("verify", 4000.0, 10000.0)]
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert names[spans[0]["tid"]] == "draft" and names[spans[1]["tid"]] == "target"
    path = write_chrome_trace(timeline, tmp_path / "t.json")
    assert json.loads(path.read_text()) == trace


# Llama-3.1-70B on 4×H100 (roofline): batch 256 × 4,050 tokens needs 120 GB per device, batch 1 fits
LLAMA = Scenario(
    RooflineTiming(
        Deployment(model_preset("llama-3.1-70b"), hardware_preset("h100"), 4),
        Deployment(model_preset("llama-3.2-1b"), hardware_preset("h100")),
    ),
    prompt_len=Lengths(4000),
    output_len=Lengths(50),
    target_devices=4,
    rounds=300,
)


def test_points_that_cannot_run_are_dropped_with_their_reason():
    result = plan(
        LLAMA,
        Grid(strategies=("ar",), batch=(1, 256)),
        rate_per_s=0.5,
        target=LatencyTarget("itl", 99, 100.0),
        check_requests=20,
    )
    (dropped,) = result.infeasible
    assert dropped.settings["batch"] == 256 and "GB per device" in dropped.reason
    assert [c.settings["batch"] for c in (*result.candidates, *result.rejected)] == [1]
    assert result.best is not None and result.best.settings["batch"] == 1


def test_a_grid_where_nothing_can_run_is_refused():
    with pytest.raises(ValueError, match="none of the 2 configurations can run; the first, strategy=ar"):
        plan(LLAMA, Grid(strategies=("ar",), batch=(256, 512)), rate_per_s=0.5, target=LatencyTarget())


def test_every_target_of_the_slo_must_hold():
    # AR at batch 1: ITL 10 ms meets 50 ms, but 100-token requests take about 990 ms end to end
    grid = Grid(strategies=("ar",), batch=(1,))
    slo = [LatencyTarget("itl", 50, 50.0), LatencyTarget("e2el", 50, 500.0)]
    result = plan(SCENARIO, grid, rate_per_s=0.2, target=slo, check_requests=30)
    assert result.best is None and not result.candidates and len(result.rejected) == 1
    assert result.closest is result.rejected[0] and result.target == slo[0]
    assert missed(slo, result.closest.screened) == (slo[1],)
    assert shortfall(slo, result.closest.screened) == pytest.approx(990 / 500, rel=0.02)
    relaxed = [slo[0], LatencyTarget("e2el", 50, 1500.0)]
    assert plan(SCENARIO, grid, rate_per_s=0.2, target=relaxed, check_requests=30).best is not None


def test_one_target_per_metric():
    with pytest.raises(ValueError, match="one target per latency metric"):
        plan(SCENARIO, Grid(strategies=("ar",)), 1.0, [LatencyTarget("itl", 99, 5.0), LatencyTarget("itl", 50, 9.0)])

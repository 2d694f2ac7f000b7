"""The fitted timing model recovers known coefficients from synthetic engine records."""

import pytest

from simulator import fit_timing
from simulator.records import parse_record
from theory.glossary import Backup, Strategy
from tests.simulator.synthetic import TRUE, engine_run


def _records(*runs):
    return [parse_record(r, f"synthetic record {i}") for run in runs for i, r in enumerate(run)]


def _calibration(noise=0.0):
    return _records(
        engine_run("ar", 0, 1, 60, seed=1, noise=noise),
        engine_run("ar", 0, 4, 60, seed=2, noise=noise),
        engine_run("sd", 2, 1, 80, seed=3, noise=noise),
        engine_run("sd", 4, 2, 80, seed=4, noise=noise),
        engine_run("ssd", 2, 1, 80, fanout=(2, 2, 2), seed=5, noise=noise),
        engine_run("ssd", 3, 2, 80, fanout=(3, 2, 2, 3), seed=6, noise=noise),
        engine_run("ssd", 3, 2, 80, fanout=(1, 1, 1, 1), backup="random", seed=7, noise=noise),
    )


def test_noise_free_records_give_back_the_true_coefficients():
    fitted = fit_timing(_calibration())
    assert fitted.verify == pytest.approx(TRUE["verify"], rel=1e-6)
    assert fitted.draft == pytest.approx(TRUE["draft"], rel=1e-6)
    assert fitted.prefill_target == pytest.approx(TRUE["prefill"], rel=1e-6)
    assert fitted.prefill_draft == pytest.approx(TRUE["prefill_draft"], rel=1e-6)
    assert fitted.overhead == pytest.approx(TRUE["overhead"], rel=1e-6)
    assert fitted.fast_backup_ms == pytest.approx({"random": TRUE["random_ms"]})
    assert fitted.link_latency_ms == pytest.approx(TRUE["link_ms"])
    assert max(fitted.errors.values()) < 1e-9


def test_noisy_records_give_the_coefficients_within_a_few_percent():
    fitted = fit_timing(_calibration(noise=0.03))
    v0, v_row, v_kv = fitted.verify
    # the intercept and the per-row slope carry most of the time; the context slope is small and looser
    assert (v0, v_row) == pytest.approx(TRUE["verify"][:2], rel=0.05)
    assert fitted.draft[:2] == pytest.approx(TRUE["draft"][:2], rel=0.05)
    assert 0.02 < fitted.errors["verify"] < 0.05  # the 3% noise shows up as the residual


def test_fitted_model_predicts_the_forwards_it_was_fitted_on():
    fitted = fit_timing(_calibration())
    v0, v_row, v_kv = TRUE["verify"]
    assert fitted.verify_ms(4, 5, 300) == pytest.approx(v0 + v_row * 20 + v_kv * 1200)
    d0, d_row, d_kv = TRUE["draft"]
    step = lambda rows: d0 + d_row * rows + d_kv * 2 * 300  # noqa: E731
    assert fitted.cache_build_ms(2, 3, 24, 300) == pytest.approx(step(8) + 3 * step(24))
    assert fitted.backup_ms(Backup.NEURAL, 1, 3, 300) == pytest.approx(3 * (d0 + d_row + d_kv * 300))
    assert fitted.overhead_ms(Strategy.SD) == pytest.approx(TRUE["overhead"]["sd"])


def test_ar_only_records_cannot_time_the_draft():
    fitted = fit_timing(_records(engine_run("ar", 0, 1, 30), engine_run("ar", 0, 2, 30, seed=1)))
    with pytest.raises(ValueError, match="draft's time was not fitted"):
        fitted.draft_ms(1, 4, 100)
    with pytest.raises(ValueError, match="random backup"):
        fitted.backup_ms(Backup.RANDOM, 1, 4, 100)


def test_too_few_rounds_is_refused():
    with pytest.raises(ValueError, match="at least 3 decode rounds"):
        fit_timing(_records(engine_run("ar", 0, 1, 2)))


def test_calibration_measures_alpha_and_the_power_law():
    from simulator.calibrate import calibrate

    run = engine_run("ssd", 4, 2, 4000, fanout=(6, 4, 3, 2, 8), alpha=0.7, power_law=(1.2, 0.5), seed=9)
    measured = calibrate(_records(run))
    # α from 8,000 sequence-rounds: standard error about 0.006; r and the scale from ~8,000 lookups
    assert measured.acceptance.alpha == pytest.approx(0.7, abs=0.03)
    assert measured.hits.r == pytest.approx(1.2, abs=0.25)
    assert measured.hits.scale == pytest.approx(0.5, rel=0.3)


def test_the_ssd_workers_interference_is_measured_against_the_verify_alone():
    """SSD rounds whose verify runs 1.25x slower (the worker next door) give a factor of 1.25 that only SSD sees."""
    plain = _records(engine_run("sd", 2, 1, 80, seed=3), engine_run("sd", 4, 2, 80, seed=4))
    slowed = []
    for r in engine_run("ssd", 3, 2, 80, fanout=(3, 2, 2, 3), seed=6):
        if r["phase"] == "decode":
            r = {**r, "verify_ms": 1.25 * r["verify_ms"], "round_ms": r["round_ms"] + 0.25 * r["verify_ms"]}
        slowed.append(r)
    fitted = fit_timing(plain + _records(slowed))
    assert fitted.verify == pytest.approx(TRUE["verify"], rel=1e-6)  # fitted on the SD rounds alone
    assert fitted.ssd_verify_factor == pytest.approx(1.25)
    ssd = fitted.for_strategy(Strategy.SSD)
    assert ssd.verify_ms(2, 4, 300) == pytest.approx(1.25 * fitted.verify_ms(2, 4, 300))
    assert fitted.for_strategy(Strategy.SD) is fitted
    # records of SSD alone cannot tell the verify alone: the fit already holds the slowdown, no factor
    assert fit_timing(_records(slowed)).ssd_verify_factor == 1.0

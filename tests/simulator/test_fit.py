"""The fitted timing model recovers known coefficients from synthetic engine records."""

from dataclasses import replace

import pytest

from simulator import fit_timing
from simulator.fit import _fit_linear, sd_first_widths
from simulator.records import parse_record
from tests.simulator.synthetic import TRUE, engine_run
from theory.glossary import Backup, Strategy


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
    # The verify is fitted on SD's verifies alone (3 and 10 rows; the AR steps have their own fit): its
    # predictions at the verified shapes hold, and the intercept, which carries most of the time.
    v0, v_row, v_kv = TRUE["verify"]
    assert fitted.verify[0] == pytest.approx(v0, rel=0.05)
    for b, K in ((1, 2), (2, 4), (2, 2)):
        assert fitted.verify_ms(b, K + 1, 150) == pytest.approx(v0 + v_row * b * (K + 1) + v_kv * b * 150, rel=0.05)
    # The draft step is fitted on SD's drafts and the backups (batch 1-2), the build on its own: their
    # predictions at the measured shapes hold, though the split between intercept and slope is looser.
    d0, d_row, d_kv = TRUE["draft"]
    step = lambda rows, kv: d0 + d_row * rows + d_kv * kv  # noqa: E731
    for b in (1, 2):
        assert fitted.draft_ms(b, 4, 150) == pytest.approx(4 * step(b, b * 150), rel=0.05)
    assert fitted.cache_build_ms(2, 3, 20, 150) == pytest.approx(step(8, 300) + 3 * step(20, 300), rel=0.05)
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


# -- records that span contexts, as `saguaro calibrate --context` writes them --------------------------------
V_TRUE = (150.0, 4.0, 0.08)  # ms, ms per row, ms per cached token read (batch·context)
D_TRUE = (12.0, 1.5, 0.01)
# s, e_row, e_kv, e_crowd: the build over its draft steps (it copies each branch's KV), and its crowding term
BUILD_TRUE = (1.15, 0.3, 0.004, 0.2)  # e_crowd as the default pair's calibrations fit it (0.08-0.40)


def _true_build(b, K, N, c, build=None):
    d0, d_row, d_kv = D_TRUE
    step = lambda rows: d0 + d_row * rows + d_kv * b * c  # noqa: E731
    s, e_row, e_kv, e_crowd = build or BUILD_TRUE
    return (
        s * (step(b * (K + 1)) + K * step(N))
        + e_row * K * N
        + e_kv * (K + 1) * N * c
        + e_crowd * (K + 1) * (N * c) ** 2 / 1e6
    )


def _point(strategy, b, c, K=4, **fields):
    r = dict(
        strategy=strategy,
        round=1,
        batch_size=b,
        K=0 if strategy == "ar" else K,
        context_len=c,
        accepted=[0] * b,
        emitted=[1] * b,
        draft_ms=0.0,
        verify_ms=0.0,
        round_ms=0.0,
        draft_forwards=0,
        phase="decode",
    )
    r.update(fields)
    return r


def _spanning(contexts, noise=0.0, seed=0, interference=1.0, build=None, beside=None):
    """AR, verify, SD draft and busy SSD builds at every (batch, context), with multiplicative noise. With
    `beside` (a function of the context), the builds beside the verify take beside(c) times the line and two
    builds a point are timed alone (level "alone") on it, as `saguaro calibrate` records them."""
    import numpy as np

    rng = np.random.default_rng(seed)
    jitter = lambda: 1.0 + noise * rng.standard_normal()  # noqa: E731
    v0, v_row, v_kv = V_TRUE
    d0, d_row, d_kv = D_TRUE
    K, out = 4, []
    for c in contexts:
        for b in (1, 4):
            verify = lambda T, b=b, c=c: (v0 + v_row * b * T + v_kv * b * c) * jitter()  # noqa: E731
            for _ in range(3):
                out.append(_point("ar", b, c, verify_ms=verify(1)))
                draft = K * (d0 + d_row * b + d_kv * b * c) * jitter()
                out.append(_point("sd", b, c, verify_ms=verify(K + 1), draft_ms=draft))
            for B in (8, 16):
                N = b * B
                built = _true_build(b, K, N, c, build)
                hits = dict(branches=N, hit=[True] * b, backup=None, wait_ms=0.0, fanout=[2, 2, 2, 1, 1])
                for _ in range(2):
                    out.append(
                        _point(
                            "ssd",
                            b,
                            c,
                            verify_ms=interference * verify(K + 1),
                            cache_build_ms=built * (beside(c) if beside else 1.0) * jitter(),
                            **hits,
                        )
                    )
                    if beside:
                        out.append(_point("ssd", b, c, cache_build_ms=built * jitter(), level="alone", **hits))
    return _records(out)


@pytest.mark.parametrize("build", [BUILD_TRUE, BUILD_TRUE[:3] + (0.0,)], ids=["crowded", "linear"])
def test_points_spanning_contexts_recover_the_context_coefficients(build):
    fitted = fit_timing(_spanning([64, 512, 1024], build=build))
    assert fitted.verify == pytest.approx(V_TRUE, rel=1e-6)
    assert fitted.draft == pytest.approx(D_TRUE, rel=1e-6)
    assert fitted.build == pytest.approx(build, rel=1e-6, abs=1e-9)
    # the build at batch 4, 64 branches and context 300 grows with branches × context
    assert fitted.cache_build_ms(4, 4, 64, 300) == pytest.approx(_true_build(4, 4, 64, 300, build))
    assert fitted.cache_build_ms(4, 4, 64, 600) - fitted.cache_build_ms(4, 4, 64, 300) > 5 * 64 * 300 * build[2]


def test_a_build_that_crowds_the_caches_is_missed_by_a_line_in_branches_x_context():
    """The negative control of the crowding term: builds whose cost grows with the square of the branches' KV
    (the default pair's calibrations: 64 branches at context 512 took 4.3-4.7 s, 128 took 12-14 s), fitted
    without it, are off at both ends of the range (one line through them), and with it, exact."""
    from simulator.fit import FittedTiming, _builds

    records = _spanning([64, 512, 1024])
    builds = _builds(records)
    partial = FittedTiming(verify=(0.0, 0.0, 0.0), draft=D_TRUE)
    line = [
        [
            partial.cache_build_ms(r.batch_size, r.K, r.branches, r.context_len),
            r.K * r.branches,
            (r.K + 1) * r.branches * r.context_len,
        ]
        for r in builds
    ]
    _, line_error = _fit_linear(line, [r.cache_build_ms for r in builds])
    assert line_error > 0.10, line_error
    assert fit_timing(records).errors["build"] < 1e-9


def test_noisy_points_spanning_contexts_give_the_context_term_within_a_few_percent():
    """3% noise: the context term comes back within 10% from 64-1024, and the predictions at context 300,
    batch 4 within 3%; from 60-100 alone (the former calibration) the term is off by far more."""
    spanning = fit_timing(_spanning([64, 512, 1024], noise=0.03, seed=1))
    assert spanning.verify[2] == pytest.approx(V_TRUE[2], rel=0.10)
    assert spanning.draft[2] == pytest.approx(D_TRUE[2], rel=0.10)
    v0, v_row, v_kv = V_TRUE
    assert spanning.verify_ms(4, 5, 300) == pytest.approx(v0 + v_row * 20 + v_kv * 1200, rel=0.03)
    assert spanning.cache_build_ms(4, 4, 64, 300) == pytest.approx(_true_build(4, 4, 64, 300), rel=0.03)
    short = [fit_timing(_spanning([60, 80, 100], noise=0.03, seed=s)).verify[2] for s in range(1, 6)]
    assert max(abs(v / V_TRUE[2] - 1) for v in short) > 0.10


def test_the_interference_factor_comes_from_verifies_next_to_the_builds():
    fitted = fit_timing(_spanning([64, 512], interference=1.15))
    assert fitted.verify == pytest.approx(V_TRUE, rel=1e-6)  # from the AR and SD points, alone
    assert fitted.ssd_verify_factor == pytest.approx(1.15)


def test_builds_timed_alone_give_the_line_and_the_builds_beside_the_verify_its_factor():
    """The calibration's builds beside its verify ran x1.05-2.2 their time alone, by context (2026-12-04), the
    engine's x1.1-1.2: the line is fitted on the builds alone (exact here, though the builds beside are not a
    line in the context) and scaled by the median of the builds beside over it; without builds alone, the line
    is fitted on the builds beside and bends with them."""
    beside = {64: 1.1, 512: 1.3, 1024: 1.9}.get
    fitted = fit_timing(_spanning([64, 512, 1024], beside=beside))
    assert fitted.build == pytest.approx(BUILD_TRUE, rel=1e-6)
    assert fitted.build_beside == pytest.approx(1.3)
    assert fitted.counts["build"] == fitted.counts["build_beside"] == 24
    for c in (64, 300, 1024):
        assert fitted.cache_build_ms(4, 4, 64, c) == pytest.approx(1.3 * _true_build(4, 4, 64, c))
    # nothing else moves: the alone records inform the build line only
    plain = fit_timing(_spanning([64, 512, 1024]))
    for name in ("verify", "draft", "ssd_verify_factor", "overhead", "link_latency_ms"):
        assert getattr(fitted, name) == pytest.approx(getattr(plain, name)), name
    without = fit_timing([r for r in _spanning([64, 512, 1024], beside=beside) if r.level != "alone"])
    assert without.build_beside == 1.0 and "build_beside" not in without.counts
    assert without.build != pytest.approx(BUILD_TRUE, rel=0.05)
    assert without.errors["build"] > 0.05  # the context-dependent factor is not a line in the build's terms


def test_one_token_steps_get_their_own_fit():
    """A step's fixed cost is shared by its rows, a verify's per-row cost is not: one linear model for both
    predicted AR at batch 2 and 4 24% too slow on the default pair. AR rounds at two batch sizes fit apart."""

    def record(strategy, b, K, ms):
        return parse_record(
            {
                "strategy": strategy,
                "round": 1,
                "batch_size": b,
                "K": K,
                "context_len": 100,
                "accepted": [0] * b,
                "emitted": [1] * b,
                "draft_ms": 5.0 if K else 0.0,
                "verify_ms": ms,
                "round_ms": ms + 1,
                "draft_forwards": K,
            }
        )

    step = lambda b: 300.0 + 10.0 * b  # noqa: E731
    verify = lambda b, K: 300.0 + 40.0 * b * (K + 1)  # noqa: E731
    records = [record("ar", b, 0, step(b)) for b in (1, 1, 4, 4)]
    records += [record("sd", b, K, verify(b, K)) for b in (1, 2, 4) for K in (2, 4)]
    fitted = fit_timing(records)
    assert fitted.decode is not None
    assert fitted.verify_ms(2, 1, 100) == pytest.approx(step(2), rel=1e-3)
    assert fitted.verify_ms(2, 5, 100) == pytest.approx(verify(2, 4), rel=0.1)
    without = fit_timing([r for r in records if r.batch_size == 1 or r.strategy.value != "ar"])
    assert without.decode is None  # AR at one batch size only: the verify's model serves the step


def _ar_step(b, c, ms):
    return parse_record(
        {
            "strategy": "ar",
            "round": 1,
            "batch_size": b,
            "K": 0,
            "context_len": c,
            "accepted": [0] * b,
            "emitted": [1] * b,
            "draft_ms": 0.0,
            "verify_ms": ms,
            "round_ms": ms,
            "draft_forwards": 0,
        }
    )


LINE, ONE_ROW = (300.0, 10.0, 0.02), (45.0, 0.12)  # the multi-row step, and what a one-row step adds


def _true_step(b, c):
    c0, c_seq, c_kv = LINE
    return c0 + c_seq * b + c_kv * b * c + ((ONE_ROW[0] + ONE_ROW[1] * c) if b == 1 else 0.0)


def test_a_one_row_step_dearer_than_two_rows_is_fitted():
    """On this CPU a one-row bf16 step can cost more than a multi-row one (1 × 512: 452 ms, 4 × 512: 422): the
    line in rows cannot bend that way; the one-row terms can, within a few % with 3% noise."""
    import numpy as np

    rng = np.random.default_rng(3)
    assert _true_step(1, 64) > _true_step(2, 64) and _true_step(1, 512) > _true_step(4, 512)
    records = [
        _ar_step(b, c, _true_step(b, c) * (1 + 0.03 * rng.standard_normal()))
        for b in (1, 2, 4)
        for c in (64, 512)
        for _ in range(3)
    ]
    fitted = fit_timing(records)
    assert fitted.decode_one_row is not None
    for b, c in ((1, 64), (1, 300), (1, 512), (2, 300), (3, 200), (4, 512)):  # (3, 200), (1, 300): not fitted on
        assert fitted.verify_ms(b, 1, c) == pytest.approx(_true_step(b, c), rel=0.03)
    # the former shape, a line in rows, is off by far more at batch 1 or 2
    line = lambda b, c: fitted.decode[0] + fitted.decode[1] * b + fitted.decode[2] * b * c  # noqa: E731
    exact = fit_timing([_ar_step(b, c, _true_step(b, c)) for b in (1, 2, 4) for c in (64, 512)])
    assert exact.decode == pytest.approx(LINE, rel=1e-6) and exact.decode_one_row == pytest.approx(ONE_ROW, rel=1e-6)
    assert line(1, 512) < 0.9 * _true_step(1, 512)  # the one-row terms are what carries batch 1


def test_without_two_other_batch_sizes_the_step_keeps_the_line():
    """Batch 1 and 4 alone cannot tell a one-row offset from the line's intercept and slope: the former shape."""
    records = [_ar_step(b, c, _true_step(b, c)) for b in (1, 4) for c in (64, 512)]
    fitted = fit_timing(records)
    assert fitted.decode_one_row is None
    assert fitted.verify_ms(1, 1, 64) == pytest.approx(fitted.decode[0] + fitted.decode[1] + 64 * fitted.decode[2])
    # one context at batch 1: the offset, no context term of its own
    one_context = fit_timing(
        [_ar_step(1, 64, _true_step(1, 64))] * 2 + [_ar_step(b, c, _true_step(b, c)) for b in (2, 4) for c in (64, 512)]
    )
    assert one_context.decode_one_row is not None and one_context.decode_one_row[1] == 0.0
    assert one_context.verify_ms(1, 1, 64) == pytest.approx(_true_step(1, 64), rel=1e-6)


def test_a_one_row_step_cheaper_than_the_line_gets_no_one_row_terms():
    records = [
        _ar_step(b, c, 300.0 + 10.0 * b + 0.02 * b * c - (20.0 if b == 1 else 0.0))
        for b in (1, 2, 4)
        for c in (64, 512)
    ]
    u0, u_kv = fit_timing(records).decode_one_row
    assert u0 >= 0.0 and u_kv >= 0.0


def _concave_step(b, c):
    """An AVX2-only host (float32, 2026-12-03): the second row doubles the step, the next two add a quarter."""
    return {1: 440.0, 2: 860.0, 4: 1060.0, 8: 1460.0}[b] + 0.07 * b * c


@pytest.mark.parametrize("batches", [(1, 2, 4), (1, 2, 4, 8)])
def test_a_step_concave_in_the_batch_gets_a_knee(batches):
    """450, 900 and 1150 ms at batch 1, 2 and 4: a line through them (the one-row terms can only raise batch 1)
    put batch 2 19% fast. The knee at batch 2 fits every batch size measured, and batch 3 between its
    neighbours; a straight step keeps the line (the tests above), and the level scales the knee."""
    records = [_ar_step(b, c, _concave_step(b, c)) for b in batches for c in (64, 512) for _ in range(2)]
    fitted = fit_timing(records)
    assert fitted.decode_knee is not None and fitted.decode_knee[0] == 2.0
    for b in batches:
        for c in (64, 300, 512):
            assert fitted.verify_ms(b, 1, c) == pytest.approx(_concave_step(b, c), rel=1e-3)
    assert _concave_step(2, 300) < fitted.verify_ms(3, 1, 300) < _concave_step(4, 300)
    assert fitted.errors["decode"] < 1e-3
    # the former shape cannot bend down: without the knee (never kept), batch 2 is off by more than 15%
    import simulator.fit as fit_module

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fit_module, "KNEE_GAIN", 2.0)
        line = fit_timing(records)
    assert line.decode_knee is None and abs(line.verify_ms(2, 1, 300) / _concave_step(2, 300) - 1) > 0.15

    def sd(level: float):
        return _records(
            [_point("sd", 1, c, K=K, verify_ms=level * 1300.0, draft_ms=300.0) for K in (2, 4) for c in (100, 200, 300)]
        )

    leveled = fit_timing(records + sd(1.0)).leveled(sd(1.5))
    assert leveled.levels["target"] == pytest.approx(1.5, rel=1e-6)
    assert leveled.verify_ms(2, 1, 300) == pytest.approx(1.5 * _concave_step(2, 300), rel=1e-3)


# -- the neural backup fitted apart from SD's drafting -------------------------------------------------------
SD_DRAFT, BACKUP = (44.0, 0.8, 0.0106), (41.0, 2.8, 0.0098)  # per draft forward; the default pair's calibration


def _draft_points():
    out = []
    for b in (1, 4):
        for c in (64, 512):
            step = lambda coef, b=b, c=c: 4 * (coef[0] + coef[1] * b + coef[2] * b * c)  # noqa: E731
            for _ in range(3):
                out.append(
                    _point("sd", b, c, verify_ms=400.0, draft_ms=step(SD_DRAFT), round_ms=400.0 + step(SD_DRAFT))
                )
            for _ in range(2):
                out.append(
                    _point(
                        "ssd",
                        b,
                        c,
                        verify_ms=420.0,
                        draft_ms=step(BACKUP),
                        wait_ms=step(BACKUP),
                        backup_ms=step(BACKUP),
                        hit=[False] * b,
                        backup="neural",
                        branches=8 * b,
                        fanout=[2, 2, 2, 1, 1],
                        cache_build_ms=0.0,
                    )
                )
    return out


def test_the_neural_backup_gets_its_own_fit():
    """The worker's backup costs more per row than SD's drafting: a pooled fit under-predicts it at batch 8."""
    fitted = fit_timing(_records(_draft_points()))
    assert fitted.backup == pytest.approx(BACKUP, rel=1e-6)
    want = lambda b, c: 4 * (BACKUP[0] + BACKUP[1] * b + BACKUP[2] * b * c)  # noqa: E731
    assert fitted.backup_ms(Backup.NEURAL, 8, 4, 113) == pytest.approx(want(8, 113), rel=1e-6)
    assert fitted.draft_ms(8, 4, 113) < 0.95 * want(8, 113)  # the pooled draft fit, SD's drafting mostly
    # backups at one batch size cannot give a per-row cost: the pooled fit serves them
    one_batch = fit_timing(_records([r for r in _draft_points() if r["batch_size"] == 4 or r["strategy"] == "sd"]))
    assert one_batch.backup is None
    assert one_batch.backup_ms(Backup.NEURAL, 2, 4, 100) == pytest.approx(one_batch.draft_ms(2, 4, 100))


def test_with_its_own_step_fit_the_verify_is_fitted_on_verifies_alone():
    """AR steps with a small context cost (the default pair: 4 × 512 422 ms, 4 × 64 383) do not pull the
    verify's context term down (its verify at 4 × 512: 822 ms, 4 × 64: 651)."""
    records = [_point("ar", b, c, verify_ms=380.0 + 0.02 * b * c) for b in (1, 2, 4) for c in (64, 512)]
    records += [
        _point("sd", b, c, verify_ms=V_TRUE[0] + V_TRUE[1] * 5 * b + V_TRUE[2] * b * c, draft_ms=100.0)
        for b in (1, 4)
        for c in (64, 512)
    ]
    fitted = fit_timing(_records(records))
    assert fitted.verify == pytest.approx(V_TRUE, rel=1e-6)
    assert fitted.verify_ms(1, 1, 512) == pytest.approx(380.0 + 0.02 * 512, rel=1e-6)
    # AR at one batch size: no step fit of its own, so its rows stay in the verify's
    single = fit_timing(_records([r for r in records if r["strategy"] == "sd" or r["batch_size"] == 4]))
    assert single.decode is None and single.counts["verify"] == 6


def test_the_prefill_gets_its_quadratic_attention_term():
    """1 × 512 tokens costs more than 4 × 128 (the default pair: 8119 against 7427 ms): causal attention grows
    with each sequence's length squared, which a line in batch × tokens cannot tell apart."""
    p0, p_row, p_att = 250.0, 13.5, 0.0035
    true = lambda b, t: p0 + p_row * b * t + p_att * b * t * t  # noqa: E731

    def prefill(b, t):
        return {
            "strategy": "sd",
            "round": 0,
            "batch_size": b,
            "K": 0,
            "context_len": 0,
            "accepted": [0] * b,
            "emitted": [1] * b,
            "draft_ms": 0.0,
            "verify_ms": true(b, t),
            "round_ms": true(b, t),
            "draft_forwards": 0,
            "phase": "prefill",
            "tokens": t,
        }

    shapes = [(1, 64), (1, 288), (4, 64), (4, 128), (1, 512)]
    decode = [_point("ar", b, 100, verify_ms=400.0) for b in (1, 2, 4)]
    fitted = fit_timing(_records([prefill(b, t) for b, t in shapes] + decode))
    assert fitted.prefill_target == pytest.approx((p0, p_row), rel=1e-6)
    assert fitted.prefill_attention[0] == pytest.approx(p_att, rel=1e-6)
    for b, t in ((1, 51), (1, 86), (7, 86), (2, 1024)):
        assert fitted.prefill_ms(Strategy.SSD, b, t) == pytest.approx(true(b, t), rel=1e-6)
    # two prefills cannot tell the attention from the line: the line alone
    two = fit_timing(_records([prefill(1, 64), prefill(1, 512)] + decode))
    assert two.prefill_attention == (0.0, 0.0)
    assert two.prefill_ms(Strategy.SSD, 1, 512) == pytest.approx(true(1, 512))


def test_one_stalled_repeat_does_not_pull_the_fit():
    """A calibration repeats each shape: a stalled forward among its repeats (4 × 64: 383, 824, 374 ms on the
    default pair) enters through the shape's median, and the error is what the model misses on the shapes."""
    records = [_ar_step(b, c, _true_step(b, c)) for b in (1, 2, 4) for c in (64, 512) for _ in range(3)]
    records[3 * 4 + 1] = _ar_step(4, 64, 2.2 * _true_step(4, 64))  # the second repeat of 4 × 64
    assert records[3 * 4 + 1].batch_size == 4 and records[3 * 4 + 1].context_len == 64
    fitted = fit_timing(records)
    assert fitted.decode == pytest.approx(LINE, rel=1e-6) and fitted.decode_one_row == pytest.approx(ONE_ROW, rel=1e-6)
    assert fitted.errors["decode"] < 1e-9


# -- the level: a calibration's shapes, an SD run's level --------------------------------------------------
def _sd_run(target=1.0, draft=1.0, K=5, contexts=(180, 240, 300)):
    """An SD run's decode rounds at batch 1 whose forwards cost `target` / `draft` times the true ones."""
    v0, v_row, v_kv = V_TRUE
    d0, d_row, d_kv = D_TRUE
    return _records(
        [
            _point(
                "sd",
                1,
                c,
                K=K,
                verify_ms=target * (v0 + v_row * (K + 1) + v_kv * c),
                draft_ms=draft * K * (d0 + d_row + d_kv * c),
            )
            for c in contexts
            for _ in range(2)
        ]
    )


def test_leveling_scales_the_target_and_the_draft_to_the_sd_runs_rounds():
    calib = fit_timing(_spanning([64, 512], interference=1.1))
    leveled = calib.leveled(_sd_run(target=1.12, draft=1.14))
    assert leveled.levels["target"] == pytest.approx(1.12) and leveled.levels["draft"] == pytest.approx(1.14)
    assert leveled.levels["rounds"] == 6
    # every target forward (verify, step, prefill) by the target's level, every draft forward by the draft's
    assert leveled.verify_ms(4, 5, 300) == pytest.approx(1.12 * calib.verify_ms(4, 5, 300))
    assert leveled.verify_ms(2, 1, 300) == pytest.approx(1.12 * calib.verify_ms(2, 1, 300))
    assert leveled.prefill_ms(Strategy.AR, 1, 200) == pytest.approx(1.12 * calib.prefill_ms(Strategy.AR, 1, 200))
    assert leveled.draft_ms(1, 3, 300) == pytest.approx(1.14 * calib.draft_ms(1, 3, 300))
    assert leveled.cache_build_ms(4, 4, 64, 300) == pytest.approx(1.14 * calib.cache_build_ms(4, 4, 64, 300))
    assert leveled.backup_ms(Backup.NEURAL, 2, 4, 300) == pytest.approx(
        1.14 * calib.backup_ms(Backup.NEURAL, 2, 4, 300)
    )
    # the shapes stay the calibration's: interference, link, fast backups
    assert leveled.ssd_verify_factor == calib.ssd_verify_factor == pytest.approx(1.1)
    assert leveled.fast_backup_ms == calib.fast_backup_ms and leveled.link_latency_ms == calib.link_latency_ms


def test_an_sd_run_at_the_calibrations_level_changes_nothing():
    """The negative control: rounds that cost what the fit says leave every prediction as it was."""
    calib = fit_timing(_spanning([64, 512]))
    leveled = calib.leveled(_sd_run())
    assert leveled.levels["target"] == pytest.approx(1.0) and leveled.levels["draft"] == pytest.approx(1.0)
    for b, K, N, c in ((1, 5, 8, 240), (4, 4, 64, 300)):
        assert leveled.cache_build_ms(b, K, N, c) == pytest.approx(calib.cache_build_ms(b, K, N, c))
        assert leveled.verify_ms(b, K + 1, c) == pytest.approx(calib.verify_ms(b, K + 1, c))


def test_a_level_within_the_dead_band_is_measured_but_not_applied():
    calib = fit_timing(_spanning([64, 512]))
    near = calib.leveled(_sd_run(target=1.03, draft=0.96))
    assert near.levels["measured"] == pytest.approx({"target": 1.03, "draft": 0.96})
    assert near.levels["target"] == near.levels["draft"] == 1.0
    assert near.verify_ms(1, 6, 240) == calib.verify_ms(1, 6, 240)
    assert near.level_text().startswith("target ×1.000, draft ×1.000 applied (measured ×1.030, ×0.960 over 6 SD")
    assert calib.level_text() == ""
    exact = calib.leveled(_sd_run(target=1.03, draft=0.96), dead_band=0.0)
    assert exact.verify_ms(1, 6, 240) == pytest.approx(1.03 * calib.verify_ms(1, 6, 240))
    assert exact.draft_ms(1, 5, 240) == pytest.approx(0.96 * calib.draft_ms(1, 5, 240))


def test_leveling_needs_sd_rounds_and_a_fitted_draft():
    calib = fit_timing(_spanning([64, 512]))
    with pytest.raises(ValueError, match="SD run's decode rounds"):
        calib.leveled(_sd_run(contexts=(200,)))  # 2 rounds
    with pytest.raises(ValueError, match="SD run's decode rounds"):
        calib.leveled([r for r in _spanning([64]) if r.strategy is not Strategy.SD])
    ar_only = fit_timing(_records(engine_run("ar", 0, 1, 60, seed=1), engine_run("ar", 0, 4, 60, seed=2)))
    with pytest.raises(ValueError, match="no draft time"):
        ar_only.leveled(_sd_run())


# -- the verify's knee: a few rows are not on the line through many ----------------------------------------
def _verifies(time_of, widths=(2, 3, 5, 8), batches=(4, 8), K=4, contexts=(64, 512)):
    """Verifies alone: batch 1 at several widths, the larger batches at K + 1, as `saguaro calibrate` times them."""
    out = []
    for c in contexts:
        shapes = [(1, w) for w in widths] + [(b, K + 1) for b in batches]
        for b, w in shapes:
            out += [_point("sd", b, c, K=w - 1, verify_ms=time_of(b * w, b * c))] * 2
    return _records(out)


def test_a_verify_that_bends_at_a_few_rows_gets_its_knee():
    knee = lambda rows, kv: 200 + 5 * min(rows, 8) + 17 * max(rows - 8, 0) + 0.01 * kv  # noqa: E731
    fitted = fit_timing(_verifies(knee))
    assert fitted.verify_knee == pytest.approx((8, 5.0)) and fitted.verify == pytest.approx((200, 17, 0.01))
    for b, w, c in ((1, 3, 240), (1, 6, 240), (4, 5, 300), (2, 4, 100)):
        assert fitted.verify_ms(b, w, c) == pytest.approx(knee(b * w, b * c))
    # the line it replaces misses the few-row verifies by far more
    line = fit_timing(_verifies(knee, widths=(5,)))
    assert line.verify_knee is None
    assert line.verify_ms(1, 3, 240) < 0.95 * knee(3, 240)
    # leveling and the worker's interference scale the knee's rows too
    assert fitted.for_strategy(Strategy.SSD).verify_ms(1, 3, 240) == pytest.approx(knee(3, 240))  # factor 1
    slower = replace(fitted, ssd_verify_factor=1.1).for_strategy(Strategy.SSD)
    assert slower.verify_ms(1, 3, 240) == pytest.approx(1.1 * knee(3, 240))


def test_a_straight_verify_keeps_its_line():
    """The negative control: verifies on a line get no knee (none cuts the error by a tenth)."""
    fitted = fit_timing(_verifies(lambda rows, kv: 180 + 17 * rows + 0.01 * kv))
    assert fitted.verify_knee is None and fitted.verify == pytest.approx((180, 17, 0.01))


def _sd_round(i, accepted, K=2, context=50, phase="decode"):
    return parse_record(
        {
            "strategy": "sd",
            "round": i,
            "batch_size": len(accepted),
            "K": K,
            "context_len": context,
            "accepted": list(accepted),
            "emitted": [k + 1 for k in accepted],
            "draft_ms": 5.0,
            "verify_ms": 10.0,
            "round_ms": 15.0,
            "draft_forwards": K,
            "phase": phase,
            "tokens": 4,
        },
        f"round {i}",
    )


def test_sd_first_widths_follow_the_round_before_in_the_same_call():
    records = [
        _sd_round(0, (0, 0), phase="prefill"),
        _sd_round(1, (2, 0)),
        _sd_round(2, (0, 1), context=52),
        _sd_round(3, (1, 2), context=54),
        _sd_round(4, (0, 0), context=57),
        _sd_round(1, (0, 0), context=40),
    ]  # a new generate() call: its first round feeds one token a row
    assert sd_first_widths(records) == [1, 1, 2, 1, 2, 1]


def test_the_draft_fit_counts_the_two_wide_first_step():
    """Batch 4 at α 0.9: nearly every round has a row that accepted all K. The fit recovers the true draft
    step; the same rows fitted as K steps of `batch` rows (the former design) do not."""
    records = _records(
        engine_run("sd", 4, 4, 60, alpha=0.9, seed=1),
        engine_run("sd", 4, 1, 60, alpha=0.9, seed=2),
        engine_run("sd", 2, 2, 60, alpha=0.5, prompt=300, seed=3),
    )
    assert sum(w == 2 for w in sd_first_widths(records)) > 100
    assert fit_timing(records).draft == pytest.approx(TRUE["draft"], rel=1e-6)
    sd = [r for r in records if r.is_decode]
    former, _ = _fit_linear(
        [[r.K, r.K * r.batch_size, r.K * r.batch_size * r.context_len] for r in sd], [r.draft_ms for r in sd]
    )
    assert former != pytest.approx(TRUE["draft"], rel=0.05)


def test_a_proposals_own_cost_is_told_from_its_steps_at_two_lengths():
    """SD proposals at K 1 and K 3 (`saguaro calibrate` times both): the fit recovers a call's own cost and the
    step's, and SD's draft, the neural backup and the build each pay the call once. From K 3 alone the call
    cost cannot be told from a third of a step's (its column is dropped): K 3 is still right, K 1 comes out
    short, as the int4 pair's SD K 1 did on 2026-12-02 (predicted 8-9% fast from a calibration at K 3)."""
    call = 9.0
    step = lambda b, c: D_TRUE[0] + D_TRUE[1] * b + D_TRUE[2] * b * c  # noqa: E731
    points = [
        _point(
            "sd",
            b,
            c,
            K=K,
            verify_ms=V_TRUE[0] + V_TRUE[1] * b * (K + 1) + V_TRUE[2] * b * c,
            draft_ms=call + K * step(b, c),
        )
        for b in (1, 4)
        for c in (64, 512)
        for K in (1, 3)
    ]
    fitted = fit_timing(_records(points))
    assert fitted.draft_call == pytest.approx(call, rel=1e-6) and fitted.draft == pytest.approx(D_TRUE, rel=1e-6)
    assert fitted.draft_ms(2, 5, 300) == pytest.approx(call + 5 * step(2, 300), rel=1e-6)
    assert fitted.backup_ms(Backup.NEURAL, 2, 3, 300) == pytest.approx(call + 3 * step(2, 300), rel=1e-6)
    forward = lambda rows, kv: D_TRUE[0] + D_TRUE[1] * rows + D_TRUE[2] * kv  # noqa: E731
    assert fitted.cache_build_ms(1, 3, 8, 300) == pytest.approx(
        call + forward(4, 300) + 3 * forward(8, 300), rel=1e-6
    )  # no build records: its steps alone
    leveled = fitted.leveled([replace(r, draft_ms=1.2 * r.draft_ms) for r in _records(points)])
    assert leveled.draft_call == pytest.approx(1.2 * call) and leveled.draft_ms(1, 1, 64) == pytest.approx(
        1.2 * fitted.draft_ms(1, 1, 64)
    )
    # negative control: one length
    at_three = fit_timing(_records([p for p in points if p["K"] == 3]))
    assert at_three.draft_call == 0.0
    assert at_three.draft_ms(1, 3, 300) == pytest.approx(call + 3 * step(1, 300), rel=1e-6)
    assert at_three.draft_ms(1, 1, 300) < 0.85 * (call + step(1, 300))


def test_batch_one_steps_at_two_widths_give_the_per_row_cost():
    """A calibration at batch 1 times SD's one-step proposal feeding one token and two (`first_width`): the fit
    recovers the draft's per-row cost from them, and with it SD's dearer first step after all accepted. From
    width 1 alone the per-row cost is folded into the fixed one: a 2-wide step comes out short (the int4
    pair's SD K 1, predicted 7-9% fast on 2026-12-02)."""
    step = lambda rows, c: D_TRUE[0] + D_TRUE[1] * rows + D_TRUE[2] * c  # noqa: E731  (batch 1: kv = context)
    verify = lambda K, c: V_TRUE[0] + V_TRUE[1] * (K + 1) + V_TRUE[2] * c  # noqa: E731
    points = [
        _point("sd", 1, c, K=3, verify_ms=verify(3, c), draft_ms=3 * step(1, c), first_width=1) for c in (64, 512)
    ]
    points += [
        _point("sd", 1, c, K=1, verify_ms=verify(1, c), draft_ms=step(w, c), first_width=w)
        for c in (64, 512)
        for w in (1, 2)
    ]
    fitted = fit_timing(_records(points))
    assert fitted.draft == pytest.approx(D_TRUE, rel=1e-6) and fitted.draft_call == pytest.approx(0.0, abs=1e-6)
    assert fitted.draft_ms(1, 1, 300, first_width=2) == pytest.approx(step(2, 300), rel=1e-6)
    narrow = fit_timing(_records([p for p in points if p["first_width"] == 1]))
    assert narrow.draft_ms(1, 1, 300, first_width=2) < 0.95 * step(2, 300)


def test_a_records_first_width_overrides_the_inferred_one():
    rows = [_point("sd", 1, 100, K=2, first_width=2), _point("sd", 1, 100, K=2)]
    assert sd_first_widths(_records(rows)) == [2, 1]
    with pytest.raises(ValueError, match="first_width"):
        parse_record(_point("sd", 1, 100, K=2, first_width=0))


def test_the_link_comes_from_rounds_the_engine_ran():
    """A calibration's build-beside-verify points record no wait (0.0); the engine's rounds that hit with a
    build inside the verify waited for the link both ways (6 ms here). The link is half their wait however
    many timed points there are; counting the points too (the former rule) put it at 0."""
    pairs = [
        _point(
            "ssd",
            1,
            64,
            verify_ms=300.0,
            hit=[True],
            cache_build_ms=200.0,
            branches=4,
            backup=None,
            wait_ms=0.0,
            fanout=[1] * 5,
        )
        for _ in range(30)
    ]
    engine = [
        _point(
            "ssd",
            1,
            64,
            K=1,
            round=i,
            verify_ms=250.0,
            round_ms=257.0,
            draft_ms=6.0,
            hit=[True],
            cache_build_ms=80.0,
            branches=2,
            backup=None,
            wait_ms=6.0,
            fanout=[1, 1],
            prompt_index=[0],
        )
        for i in range(2, 12)
    ]
    verifies = [
        _point("sd", 1, 64, K=K, verify_ms=V_TRUE[0] + V_TRUE[1] * (K + 1) + V_TRUE[2] * 64, draft_ms=50.0)
        for K in (1, 2, 4)
    ]
    assert fit_timing(_records(pairs + engine + verifies)).link_latency_ms == pytest.approx(3.0)
    assert fit_timing(_records(pairs + verifies)).link_latency_ms == 0.0


def test_the_level_counts_a_runs_slow_rounds_as_its_tokens_per_s_does():
    """Tokens/s is a ratio of totals, and so is the level: 20 SD rounds at the fit's cost and 4 at twice it
    level the target by 28/24 (7/6), which a median of per-round ratios (1.0, the former rule) misses."""
    calib = fit_timing(_spanning([64, 512]))
    steady = _sd_run(contexts=(180, 200, 220, 240, 260, 280, 300, 320, 340, 360))
    slow = [replace(r, verify_ms=2 * r.verify_ms, draft_ms=2 * r.draft_ms) for r in _sd_run(contexts=(250, 270))]
    leveled = calib.leveled(steady + slow)
    assert leveled.levels["measured"]["target"] == pytest.approx(
        sum(r.verify_ms for r in steady + slow) / sum(calib.verify_ms(1, 6, r.context_len) for r in steady + slow)
    )
    assert leveled.levels["target"] > 1.10 and leveled.levels["draft"] > 1.10
    import numpy as np

    per_round = np.median([r.verify_ms / calib.verify_ms(1, 6, r.context_len) for r in steady + slow])
    assert per_round == pytest.approx(1.0)  # the former rule: no level at all


def _engine_builds(b, scale, contexts=(70, 80, 90, 100), B=8, K=4, joined=False):
    """The engine's SSD rounds at batch b as `saguaro calibrate` marks them (level "build"), their builds `scale`
    times the true line's; `joined`: rounds a sequence joined, reporting the build of one row fewer."""
    rows = b - 1 if joined else b
    return [
        _point(
            "ssd",
            b,
            c,
            K=K,
            round=i + 2,
            verify_ms=300.0,
            round_ms=340.0,
            draft_ms=40.0,
            hit=[True] * b,
            cache_build_ms=scale * _true_build(b, K, rows * B, c),
            branches=rows * B,
            backup=None,
            wait_ms=40.0,
            fanout=[2, 2, 2, 1, 1],
            prompt_index=list(range(b)),
            level="build",
        )
        for i, c in enumerate(contexts)
    ]


def test_the_engines_build_rounds_level_the_build_line_by_batch():
    """Engine builds at 0.8 times the calibration's line at batch 1 and 1.2 times at batch 4: the build level is
    each batch's ratio of totals, measured always and applied on request (linear in between, held beyond), and
    nothing else in the fit moves."""
    calib = _spanning([64, 512])
    plain = fit_timing(calib)
    engine = _engine_builds(1, 0.8) + _engine_builds(4, 1.2)
    measured = fit_timing(calib + _records(engine))
    assert [b for b, _ in measured.build_level] == [1, 4]
    assert [x for _, x in measured.build_level] == pytest.approx([0.8, 1.2])
    assert measured.counts["build_level"] == len(engine)
    assert measured.cache_build_ms(1, 4, 8, 300) == pytest.approx(_true_build(1, 4, 8, 300))  # not applied
    assert measured.build_level_text().endswith("not applied")
    fitted = measured.with_build_level()
    assert fitted.build_level_text().endswith(", applied") and "×0.800 at batch 1" in fitted.build_level_text()
    assert fitted.cache_build_ms(1, 4, 8, 300) == pytest.approx(0.8 * _true_build(1, 4, 8, 300))
    assert fitted.cache_build_ms(2, 4, 16, 300) == pytest.approx((0.8 + 0.4 / 3) * _true_build(2, 4, 16, 300))
    assert fitted.cache_build_ms(8, 4, 64, 300) == pytest.approx(1.2 * _true_build(8, 4, 64, 300))
    for name in ("verify", "draft", "build", "ssd_verify_factor", "overhead", "link_latency_ms", "backup"):
        assert getattr(fitted, name) == getattr(plain, name), name  # the level rounds inform the level only
    assert plain.build_level == () and plain.build_level_at(4) == 1.0 and plain.build_level_text() == ""
    with pytest.raises(ValueError, match="--build-tokens"):
        plain.with_build_level()
    # the SD level scales the leveled builds by the draft's ratio on top
    leveled = fitted.leveled(_sd_run(draft=1.5))
    assert leveled.cache_build_ms(1, 4, 8, 300) == pytest.approx(
        0.8 * leveled.levels["draft"] * _true_build(1, 4, 8, 300)
    )


def test_rounds_reporting_another_batchs_build_do_not_level():
    """A round that a sequence joined looked up the cache built for the batch before it: its branches are not its
    batch times the fan-out, so it does not count; nor does a batch size with fewer than three rounds."""
    calib = _spanning([64, 512])
    fitted = fit_timing(calib + _records(_engine_builds(1, 0.8) + _engine_builds(2, 3.0, joined=True)))
    assert len(fitted.build_level) == 1 and fitted.build_level[0] == (1, pytest.approx(0.8))
    assert fitted.counts["build_level"] == 4  # the rounds it used
    few = fit_timing(calib + _records(_engine_builds(1, 0.8, contexts=(70, 80))))
    assert few.build_level == () and "build_level" not in few.counts

"""Validation machinery, on synthetic engine runs: fit on a calibration run, predict six other runs.

Synthetic runs follow the round structure the engine records (tests/simulator/synthetic.py), so the
fitted simulator must predict their tokens/s within 10%; `saguaro validate` does the same on real engine runs
(tests/saguaro/validation/test_validate_engine.py).
"""

from dataclasses import replace

import pytest

from simulator import fit_timing, read_records, validate
from tests.simulator.synthetic import TRUE, engine_run, write_jsonl

CALIBRATION = [
    engine_run("ar", 0, 1, 60, seed=1, noise=0.03),
    engine_run("ar", 0, 4, 60, seed=2, noise=0.03),
    engine_run("sd", 2, 1, 80, seed=3, noise=0.03),
    engine_run("sd", 4, 2, 80, seed=4, noise=0.03),
    engine_run("ssd", 2, 1, 80, fanout=(2, 2, 2), seed=5, noise=0.03),
    engine_run("ssd", 3, 2, 80, fanout=(3, 2, 2, 3), seed=6, noise=0.03),
    engine_run("ssd", 3, 2, 80, fanout=(1, 1, 1, 1), backup="random", seed=7, noise=0.03),
]
# configurations not used for fitting: other K, fan-outs, batch sizes, hit rates ("temperatures")
VALIDATION = [
    engine_run("ar", 0, 2, 150, seed=11, noise=0.03),
    engine_run("sd", 3, 1, 150, seed=12, noise=0.03, alpha=0.6),
    engine_run("sd", 5, 4, 150, seed=13, noise=0.03),
    engine_run("ssd", 4, 1, 150, fanout=(3, 3, 2, 2, 4), seed=14, noise=0.03),
    engine_run("ssd", 2, 4, 150, fanout=(2, 2, 3), seed=15, noise=0.03),
    engine_run("ssd", 4, 2, 150, fanout=(2, 2, 2, 2, 2), backup="random", p_hit=0.6, seed=16, noise=0.03),
    engine_run("ssd", 5, 1, 150, fanout=(4,) * 6, p_hit=0.95, seed=17, noise=0.03),
]


@pytest.fixture
def files(tmp_path):
    return write_jsonl(tmp_path / "calibration.jsonl", *CALIBRATION), write_jsonl(tmp_path / "runs.jsonl", *VALIDATION)


def test_fitted_simulator_predicts_unseen_runs_within_ten_percent(files):
    calibration, runs = files
    rows = validate(fit_timing(read_records(calibration)), read_records(runs))
    assert len(rows) == len(VALIDATION)
    assert {(r.strategy, r.K, r.batch) for r in rows} == {
        ("ar", 0, 2),
        ("sd", 3, 1),
        ("sd", 5, 4),
        ("ssd", 4, 1),
        ("ssd", 2, 4),
        ("ssd", 4, 2),
        ("ssd", 5, 1),
    }
    assert all(r.within_tolerance for r in rows), [(r.strategy, r.K, r.batch, round(r.error, 3)) for r in rows]


def test_negative_control_wrong_timings_fail_validation(files):
    calibration, runs = files
    fitted = fit_timing(read_records(calibration))
    # every forward twice as slow (doubling only the verify would hide behind builds that outlast it)
    assert fitted.decode is not None  # the AR runs at batch 1 and 4 give one-token steps their own fit
    slow = replace(
        fitted,
        verify=tuple(2 * c for c in fitted.verify),
        draft=tuple(2 * c for c in fitted.draft),
        decode=tuple(2 * c for c in fitted.decode),
    )
    rows = validate(slow, read_records(runs))
    assert not any(r.within_tolerance for r in rows)


def test_engine_style_records_validate_too(tmp_path):
    """Today's engine writes the SSD wait into draft_ms and null backups on all-hit rounds."""
    ssd = dict(engine_style=True, noise=0.03)
    calibration = [
        *CALIBRATION[:4],
        engine_run("ssd", 2, 1, 80, fanout=(2, 2, 2), seed=5, **ssd),
        engine_run("ssd", 3, 2, 80, fanout=(1, 1, 1, 1), backup="random", seed=7, **ssd),
    ]
    runs = [
        engine_run("ssd", 4, 1, 150, fanout=(3, 3, 2, 2, 4), seed=14, **ssd),
        engine_run("ssd", 4, 2, 150, fanout=(2, 2, 2, 2, 2), backup="random", p_hit=0.6, seed=16, **ssd),
    ]
    fitted = fit_timing(read_records(write_jsonl(tmp_path / "cal.jsonl", *calibration)))
    rows = validate(fitted, read_records(write_jsonl(tmp_path / "runs.jsonl", *runs)))
    assert [r.backup for r in rows] == ["neural", "random"]
    assert all(r.within_tolerance for r in rows), [round(r.error, 3) for r in rows]


def test_fast_backup_time_leaves_out_the_build_that_outlasts_the_verify(tmp_path):
    """Engine-style records hold only the wait; with a build of ~54 ms against a ~26 ms verify, the wait of a
    missed round is the rest of the build plus the backup (per-row: the build finishes first)."""
    ssd = dict(engine_style=True, noise=0.03)
    calibration = [
        *CALIBRATION[:4],
        engine_run("ssd", 2, 1, 80, fanout=(2, 2, 2), seed=5, **ssd),
        engine_run("ssd", 4, 2, 80, fanout=(3,) * 5, backup="random", seed=7, **ssd),
    ]
    fitted = fit_timing(read_records(write_jsonl(tmp_path / "cal.jsonl", *calibration)))
    assert fitted.fast_backup_ms["random"] == pytest.approx(TRUE["random_ms"], rel=0.1)
    run = engine_run("ssd", 4, 2, 150, fanout=(2,) * 5, backup="random", p_hit=0.6, seed=16, **ssd)
    rows = validate(fitted, read_records(write_jsonl(tmp_path / "runs.jsonl", run)))
    assert all(r.within_tolerance for r in rows), [round(r.error, 3) for r in rows]


def test_replaying_rounds_of_several_K_is_refused_with_a_reason():
    """Adaptive speculation changes K round by round; a one-K replay of its accepted counts once crashed
    `saguaro report` (IndexError: a round accepted more than the first round's K)."""
    from simulator.records import parse_record
    from simulator.validate import simulate_like

    def record(K, accepted, ms):
        return parse_record(
            {
                "strategy": "sd",
                "round": 1,
                "batch_size": 1,
                "K": K,
                "context_len": 100,
                "accepted": [accepted],
                "emitted": [accepted + 1],
                "draft_ms": 5.0 * K,
                "verify_ms": ms,
                "round_ms": ms + 1,
                "draft_forwards": K,
            }
        )

    rounds = [record(2, 2, 300.0), record(5, 5, 420.0), record(3, 1, 330.0), record(4, 0, 380.0)]
    timing = fit_timing(
        rounds
        + [
            parse_record(
                {
                    "strategy": "ar",
                    "round": 1,
                    "batch_size": 1,
                    "K": 0,
                    "context_len": 100,
                    "accepted": [0],
                    "emitted": [1],
                    "draft_ms": 0.0,
                    "verify_ms": 250.0,
                    "round_ms": 251.0,
                    "draft_forwards": 0,
                }
            )
        ]
    )
    with pytest.raises(ValueError, match="several K"):
        simulate_like(timing, [rounds])
    assert simulate_like(timing, [[r for r in rounds if r.K == 2]]) > 0  # one K replays

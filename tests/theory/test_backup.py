"""Backup choice by the Cor. 16 speedup and our closed form for the critical batch size b*, per miss policy."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from theory import Backup, BackupOption, MissPolicy, backup_speedups, best_backup, critical_batch_size, ssd_speedup
from theory.backup import fast_beats_neural

FAST = settings(deadline=None, max_examples=160)
E_SD = 3.3616  # E(0.8, 4)
NEURAL = BackupOption(Backup.NEURAL, E_miss=E_SD, T_b=0.3)
RANDOM = BackupOption(Backup.RANDOM, E_miss=1.0, T_b=0.0)
CASES = dict(  # a round's measured quantities and the two backups' yields and times, over their ranges
    p_hit=st.floats(0.0, 1.0),
    E_hit=st.floats(1.0, 8.0),
    T_p=st.floats(0.0, 3.0),
    E_neural=st.floats(1.0, 8.0),
    T_neural=st.floats(0.0, 2.0),
    E_fast=st.floats(1.0, 8.0),
    T_fast=st.floats(0.0, 2.0),
    policy=st.sampled_from(list(MissPolicy)),
)


def brute_force_b_star(p_hit, E_hit, T_p, neural, fast, b_max, miss_policy) -> int | None:
    b = np.arange(1, b_max + 1)
    speeds = backup_speedups(p_hit, E_hit, T_p, [neural, fast], b, miss_policy)
    wins = np.flatnonzero(fast_beats_neural(speeds))
    return int(b[wins[0]]) if wins.size else None


@pytest.mark.parametrize("policy", list(MissPolicy))
def test_speedups_are_cor16_per_backup(policy) -> None:
    b = np.array([1, 4, 16])
    speeds = backup_speedups(0.9, E_SD, 1.5, [NEURAL, RANDOM], b, policy)
    assert speeds.shape == (2, 3)
    assert np.allclose(speeds[0], ssd_speedup(0.9, E_SD, E_SD, 1.5, 0.3, b, miss_policy=policy))
    assert np.allclose(speeds[1], ssd_speedup(0.9, E_SD, 1.0, 1.5, 0.0, b, miss_policy=policy))


def test_neural_backup_at_batch_one_fast_backup_at_large_batch() -> None:
    b = np.array([1, 2, 3, 8, 64])
    assert best_backup(0.9, E_SD, 1.0, [NEURAL, RANDOM], b).tolist() == [0, 0, 1, 1, 1]
    assert critical_batch_size(0.9, E_SD, 1.0, NEURAL, RANDOM) == 3
    assert critical_batch_size(0.9, E_SD, 1.0, NEURAL, RANDOM, b_max=2) is None


def test_whole_batch_random_backup_never_wins_here() -> None:
    # Any miss hands every row the random backup's single token: at T_p = 1 both backups cost the same round
    # time once a miss happens, and the neural one yields 3.4 tokens a row there against 1.
    b = np.array([1, 3, 64])
    assert best_backup(0.9, E_SD, 1.0, [NEURAL, RANDOM], b, MissPolicy.WHOLE_BATCH).tolist() == [0, 0, 0]
    assert critical_batch_size(0.9, E_SD, 1.0, NEURAL, RANDOM, miss_policy=MissPolicy.WHOLE_BATCH) is None


def test_per_row_b_star_moves_with_a_long_build() -> None:
    # T_p = 2: every round pays the build, so the neural backup's 0.3 weighs less and fast wins later (3 at
    # T_p = 1). By hand: N_n = 3.3616, N_f = 0.9·3.3616 + 0.1 = 3.1254; fast wins iff N_f·(2 + 0.3u) > 2·N_n,
    # u > 0.5037, 0.9^b < 0.4963, b > 6.65.
    assert (
        critical_batch_size(0.9, E_SD, 2.0, NEURAL, RANDOM)
        == brute_force_b_star(0.9, E_SD, 2.0, NEURAL, RANDOM, 512, MissPolicy.PER_ROW)
        == 7
    )


def test_b_star_edge_cases() -> None:
    assert critical_batch_size(1.0, E_SD, 1.0, NEURAL, RANDOM) is None  # never misses: more tokens wins
    assert critical_batch_size(0.0, E_SD, 1.0, NEURAL, RANDOM) is None  # 1 token in 1 vs 3.4 in 1.3
    cheap_neural = BackupOption(Backup.NEURAL, E_miss=E_SD, T_b=0.0)
    assert critical_batch_size(0.9, E_SD, 1.0, cheap_neural, RANDOM) is None  # free and better: never lose
    good_fast = BackupOption(Backup.LOOKUP, E_miss=E_SD, T_b=0.05)
    assert critical_batch_size(0.9, E_SD, 1.0, NEURAL, good_fast) == 1  # as good and quicker: always win


@FAST
@given(**CASES)
# Found by Hypothesis: p_hit one ulp below 1, where the line says fast always wins but the speedups tie in
# floating point (the formula gave b* < 0 and an error); and a tie at u = 1 exactly, which rounding made a win.
@example(1 - 2**-53, 1.0, 0.0, 1.0, 1.0, 2.0, 0.0, MissPolicy.WHOLE_BATCH)
@example(1 - 2**-53, 1.0, 0.0, 1.0, 0.0, 2.0, 0.0, MissPolicy.WHOLE_BATCH)
@example(0.5, 3.0, 0.0, 2.0, 0.0, 3.0, 0.5, MissPolicy.WHOLE_BATCH)
def test_closed_form_b_star_matches_brute_force(p_hit, E_hit, T_p, E_neural, T_neural, E_fast, T_fast, policy) -> None:
    neural = BackupOption(Backup.NEURAL, E_neural, T_neural)
    fast = BackupOption(Backup.LOOKUP, E_fast, T_fast)
    want = brute_force_b_star(p_hit, E_hit, T_p, neural, fast, 512, policy)
    assert critical_batch_size(p_hit, E_hit, T_p, neural, fast, b_max=512, miss_policy=policy) == want


@FAST
@given(**CASES)
@example(1 - 2**-53, 1.0, 0.0, 1.0, 1.0, 2.0, 0.0, MissPolicy.WHOLE_BATCH)  # a tie that rounding splits
@example(0.5, 3.0, 0.0, 2.0, 0.0, 3.0, 0.5, MissPolicy.WHOLE_BATCH)
def test_best_backup_picks_fast_exactly_from_b_star_on(
    p_hit, E_hit, T_p, E_neural, T_neural, E_fast, T_fast, policy
) -> None:
    """The choice the engine makes (best_backup) and the b* the docs quote agree at every b, ties included."""
    neural = BackupOption(Backup.NEURAL, E_neural, T_neural)
    fast = BackupOption(Backup.LOOKUP, E_fast, T_fast)
    b = np.arange(1, 129)
    chosen = best_backup(p_hit, E_hit, T_p, [neural, fast], b, policy)
    speeds = backup_speedups(p_hit, E_hit, T_p, [neural, fast], b, policy)
    assert np.array_equal(chosen == 1, fast_beats_neural(speeds))
    b_star = critical_batch_size(p_hit, E_hit, T_p, neural, fast, b_max=128, miss_policy=policy)
    if b_star is not None:
        assert chosen[b_star - 1] == 1 and not chosen[: b_star - 1].any()
    else:
        assert not chosen.any()


def test_a_rounding_tie_goes_to_the_first_listed() -> None:
    """The negative control: a plain argmax hands this tie (u = 1 exactly, T_p = 0, whole-batch) to the fast
    backup by ~1e-16; best_backup keeps the neural one, as critical_batch_size does."""
    neural = BackupOption(Backup.NEURAL, 1.0, 1.0)
    fast = BackupOption(Backup.LOOKUP, 2.0, 0.0)
    args = (1 - 2**-53, 1.0, 0.0, [neural, fast], np.array([1, 2]), MissPolicy.WHOLE_BATCH)
    speeds = backup_speedups(*args)
    assert np.argmax(speeds, axis=0).tolist() != best_backup(*args).tolist()
    assert best_backup(*args).tolist() == [0, 0]
    assert critical_batch_size(*args[:3], neural, fast, b_max=2, miss_policy=MissPolicy.WHOLE_BATCH) is None


def test_three_options_each_must_beat_the_best_before_it() -> None:
    lookup = BackupOption(Backup.LOOKUP, E_miss=1.0, T_b=0.0)  # RANDOM's twin: ties it everywhere
    b = np.array([1, 8])
    assert best_backup(0.9, E_SD, 1.0, [NEURAL, RANDOM, lookup], b).tolist() == [0, 1]


def test_bad_backup_input_raises_value_error() -> None:
    with pytest.raises(ValueError, match="E_miss of the random backup must be > 0"):
        BackupOption(Backup.RANDOM, E_miss=0.0, T_b=0.0)
    with pytest.raises(ValueError, match="T_b of the neural backup must be >= 0"):
        BackupOption(Backup.NEURAL, E_miss=3.0, T_b=-1.0)
    with pytest.raises(ValueError, match="at least one backup"):
        backup_speedups(0.9, 3.0, 1.0, [], 1)
    with pytest.raises(ValueError, match="p_hit is a probability"):
        critical_batch_size(1.5, 3.0, 1.0, NEURAL, RANDOM)

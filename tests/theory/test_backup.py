"""Backup choice by the Cor. 16 speedup and our closed form for the critical batch size b*."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from theory import Backup, BackupOption, backup_speedups, best_backup, critical_batch_size, ssd_speedup

FAST = settings(deadline=None, max_examples=80)
E_SD = 3.3616  # E(0.8, 4)
NEURAL = BackupOption(Backup.NEURAL, E_miss=E_SD, T_b=0.3)
RANDOM = BackupOption(Backup.RANDOM, E_miss=1.0, T_b=0.0)


def brute_force_b_star(p_hit, E_hit, T_p, neural, fast, b_max) -> int | None:
    b = np.arange(1, b_max + 1)
    speeds = backup_speedups(p_hit, E_hit, T_p, [neural, fast], b)
    wins = np.flatnonzero(speeds[1] > speeds[0])
    return int(b[wins[0]]) if wins.size else None


def test_speedups_are_cor16_per_backup() -> None:
    b = np.array([1, 4, 16])
    speeds = backup_speedups(0.9, E_SD, 1.0, [NEURAL, RANDOM], b)
    assert speeds.shape == (2, 3)
    assert np.allclose(speeds[0], ssd_speedup(0.9, E_SD, E_SD, 1.0, 0.3, b))
    assert np.allclose(speeds[1], ssd_speedup(0.9, E_SD, 1.0, 1.0, 0.0, b))


def test_neural_backup_at_batch_one_fast_backup_at_large_batch() -> None:
    b = np.array([1, 2, 3, 8, 64])
    assert best_backup(0.9, E_SD, 1.0, [NEURAL, RANDOM], b).tolist() == [0, 0, 1, 1, 1]
    assert critical_batch_size(0.9, E_SD, 1.0, NEURAL, RANDOM) == 3
    assert critical_batch_size(0.9, E_SD, 1.0, NEURAL, RANDOM, b_max=2) is None


def test_b_star_edge_cases() -> None:
    assert critical_batch_size(1.0, E_SD, 1.0, NEURAL, RANDOM) is None  # never misses: more tokens wins
    assert critical_batch_size(0.0, E_SD, 1.0, NEURAL, RANDOM) is None  # 1 token in 1 vs 3.4 in 1.3
    cheap_neural = BackupOption(Backup.NEURAL, E_miss=E_SD, T_b=0.0)
    assert critical_batch_size(0.9, E_SD, 1.0, cheap_neural, RANDOM) is None  # free and better: never lose
    good_fast = BackupOption(Backup.LOOKUP, E_miss=E_SD, T_b=0.05)
    assert critical_batch_size(0.9, E_SD, 1.0, NEURAL, good_fast) == 1  # as good and quicker: always win


@FAST
@given(
    p_hit=st.floats(0.0, 1.0),
    E_hit=st.floats(1.0, 8.0),
    T_p=st.floats(0.0, 2.0),
    E_neural=st.floats(1.0, 8.0),
    T_neural=st.floats(0.0, 2.0),
    E_fast=st.floats(1.0, 8.0),
    T_fast=st.floats(0.0, 2.0),
)
def test_closed_form_b_star_matches_brute_force(p_hit, E_hit, T_p, E_neural, T_neural, E_fast, T_fast) -> None:
    neural = BackupOption(Backup.NEURAL, E_neural, T_neural)
    fast = BackupOption(Backup.LOOKUP, E_fast, T_fast)
    want = brute_force_b_star(p_hit, E_hit, T_p, neural, fast, 512)
    assert critical_batch_size(p_hit, E_hit, T_p, neural, fast, b_max=512) == want


def test_bad_backup_input_raises_value_error() -> None:
    with pytest.raises(ValueError, match="E_miss of the random backup must be > 0"):
        BackupOption(Backup.RANDOM, E_miss=0.0, T_b=0.0)
    with pytest.raises(ValueError, match="T_b of the neural backup must be >= 0"):
        BackupOption(Backup.NEURAL, E_miss=3.0, T_b=-1.0)
    with pytest.raises(ValueError, match="at least one backup"):
        backup_speedups(0.9, 3.0, 1.0, [], 1)
    with pytest.raises(ValueError, match="p_hit is a probability"):
        critical_batch_size(1.5, 3.0, 1.0, NEURAL, RANDOM)

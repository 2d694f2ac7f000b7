"""Where the closed forms' assumptions hold (i.i.d. acceptance, constant timings, independent hits), the
simulated speedups over AR agree with theory/ within 2% (AR, SD, SSD Thm 7, and Cor. 16's batch form under
both miss policies, per-row and whole-batch).

Statistics: 30,000 rounds give a relative standard error of tokens per second below 0.5% for every case
here (the largest, 0.49% by the delta method: whole-batch, random backup, p_hit 0.8, b = 8, where all 8 rows
swing together between 4.5 tokens and 1), so a 2% band is more than 4 standard errors wide (false-alarm
rate < 1e-4 per case); the seed is fixed, so the test is deterministic. AR under constant timing is
deterministic, so 1,000 rounds measure it exactly.
Negative controls: the b = 1 formula applied at b = 8, and one miss policy's formula applied to the other's
simulation, are off by far more than 2%, so the comparison can fail.
"""

import pytest

from simulator import ClosedLoop, ConstantHit, ConstantTiming, IidAcceptance, Policy, SimConfig, simulate
from theory import expected_tokens, sd_speedup, ssd_speedup
from theory.glossary import Backup, MissPolicy

T_V_MS = 10.0
ROUNDS = 30_000
TOLERANCE = 0.02


def _tokens_per_s(policy, timing, alpha=0.8, p_hit=0.9, batch=1, rounds=ROUNDS):
    config = SimConfig(
        policy=policy,
        timing=timing,
        acceptance=IidAcceptance(alpha),
        hits=ConstantHit(p_hit),
        workload=ClosedLoop(batch, output_len=None),
        rounds=rounds,
        seed=1,
    )
    return simulate(config).decode_tokens_per_s / batch  # per sequence


def _ar(timing, batch=1):
    return _tokens_per_s(Policy("ar"), timing, batch=batch, rounds=1_000)


def test_ar_runs_at_one_token_per_decode_step():
    timing = ConstantTiming(t_verify_ms=T_V_MS, t_decode_ms=8.0)
    assert _ar(timing) == pytest.approx(1e3 / 8.0, rel=1e-3)


@pytest.mark.parametrize("alpha, K, t_draft_ms", [(0.8, 4, 1.0), (0.6, 2, 2.5), (0.9, 7, 0.5)])
def test_sd_speedup_matches_theory(alpha, K, t_draft_ms):
    timing = ConstantTiming(t_verify_ms=T_V_MS, t_draft_ms=t_draft_ms)
    simulated = _tokens_per_s(Policy("sd", K=K), timing, alpha=alpha) / _ar(timing)
    expected = sd_speedup(alpha, K, t_draft_ms, T_V_MS)
    assert simulated == pytest.approx(expected, rel=TOLERANCE)


SSD_CASES = [
    # alpha, K, p_hit, T_p (verify units), backup, T_b (verify units)
    (0.8, 4, 0.9, 0.5, Backup.NEURAL, 0.4),
    (0.7, 3, 0.6, 1.6, Backup.NEURAL, 0.3),  # the cache build outlasts the verify: rounds stretch
    (0.85, 6, 0.8, 0.9, Backup.RANDOM, 0.0),
    (0.8, 4, 0.7, 3.0, Backup.RANDOM, 0.0),  # a long build and a random backup
]


def _ssd_simulated(alpha, K, p_hit, T_p, backup, T_b, batch, miss_policy):
    timing = ConstantTiming(
        t_verify_ms=T_V_MS, t_build_ms=T_p * T_V_MS, t_backup_ms=T_b * T_V_MS, t_random_backup_ms=T_b * T_V_MS
    )
    policy = Policy("ssd", K=K, fanout=(1,) * (K + 1), backup=backup, miss_policy=miss_policy)
    return _tokens_per_s(policy, timing, alpha, p_hit, batch) / _ar(timing, batch)


def _ssd_closed_form(alpha, K, p_hit, T_p, backup, T_b, batch, miss_policy):
    E_hit = expected_tokens(alpha, K)
    E_miss = E_hit if backup is Backup.NEURAL else expected_tokens(0.0, K)
    return ssd_speedup(p_hit, E_hit, E_miss, T_p, T_b, b=batch, miss_policy=miss_policy)


@pytest.mark.parametrize("alpha, K, p_hit, T_p, backup, T_b", SSD_CASES)
@pytest.mark.parametrize("batch", [1, 4, 8])
@pytest.mark.parametrize("miss_policy", list(MissPolicy))
def test_ssd_speedup_matches_cor16(alpha, K, p_hit, T_p, backup, T_b, batch, miss_policy):
    case = (alpha, K, p_hit, T_p, backup, T_b, batch, miss_policy)
    assert _ssd_simulated(*case) == pytest.approx(_ssd_closed_form(*case), rel=TOLERANCE)


@pytest.mark.parametrize(
    "simulated_as, predicted_as",
    [(MissPolicy.PER_ROW, MissPolicy.WHOLE_BATCH), (MissPolicy.WHOLE_BATCH, MissPolicy.PER_ROW)],
)
def test_negative_control_each_miss_policy_has_its_own_form(simulated_as, predicted_as):
    case = (0.8, 4, 0.7, 3.0, Backup.RANDOM, 0.0, 8)
    simulated = _ssd_simulated(*case, simulated_as)
    assert abs(simulated / _ssd_closed_form(*case, predicted_as) - 1) > 3 * TOLERANCE


def test_negative_control_batch_form_differs_from_single_sequence_form():
    alpha, K, p_hit, T_p, T_b, batch = 0.8, 4, 0.9, 0.5, 0.4, 8
    timing = ConstantTiming(t_verify_ms=T_V_MS, t_build_ms=T_p * T_V_MS, t_backup_ms=T_b * T_V_MS)
    policy = Policy("ssd", K=K, fanout=(1,) * (K + 1))
    simulated = _tokens_per_s(policy, timing, alpha, p_hit, batch) / _ar(timing, batch)
    E = expected_tokens(alpha, K)
    wrong = ssd_speedup(p_hit, E, E, T_p, T_b, b=1)
    assert abs(simulated / wrong - 1) > 3 * TOLERANCE

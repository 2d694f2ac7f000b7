"""Exact event timelines for the first rounds under constant timings, asserted span by span.

Spans are (actor, activity, start_ms, end_ms). Replayed records fix the accepted counts and hits, so
every time below follows by hand from the timings.
"""

from dataclasses import replace

import pytest

import simulator.run
from simulator import (
    ClosedLoop,
    ConstantHit,
    ConstantTiming,
    IidAcceptance,
    Lengths,
    LinkSpec,
    Policy,
    Replay,
    SimConfig,
    simulate,
)
from simulator.fit import FittedTiming
from simulator.records import parse_record
from theory.glossary import MissPolicy
from theory.latency import request_latency, summarize


def _timeline(config):
    result = simulate(config, trace=True)
    return sorted(result.timeline, key=lambda s: (s[2], s[0], s[3])), result


def _ssd_records(accepted, hits, K=2):
    """One decode record per round: accepted k and whether that round's speculation was a cache hit."""
    return tuple(
        parse_record(
            {
                "strategy": "ssd",
                "round": i,
                "batch_size": 1,
                "K": K,
                "context_len": 10 + i,
                "accepted": [k],
                "emitted": [k + 1],
                "draft_ms": 0.0,
                "verify_ms": 10.0,
                "round_ms": 12.0,
                "draft_forwards": K,
                "hit": [h],
                "cache_build_ms": 12.0,
                "branches": 3,
                "backup": "neural",
                "wait_ms": 2.0,
                "fanout": [1] * (K + 1),
            }
        )
        for i, (k, h) in enumerate(zip(accepted, hits, strict=True))
    )


def test_ar_decodes_back_to_back():
    config = SimConfig(
        Policy("ar"),
        ConstantTiming(t_verify_ms=10.0, t_decode_ms=7.0),
        IidAcceptance(0.5),
        workload=ClosedLoop(1, output_len=None),
        rounds=3,
    )
    timeline, result = _timeline(config)
    assert timeline == [
        ("target", "decode", 0.0, 7.0),
        ("target", "decode", 7.0, 14.0),
        ("target", "decode", 14.0, 21.0),
    ]
    assert result.tokens == 4  # the prefill's first token, then one per decode step


def test_sd_drafts_then_verifies_in_series():
    timing = ConstantTiming(t_verify_ms=10.0, t_draft_ms=1.5)
    config = SimConfig(Policy("sd", K=2), timing, IidAcceptance(1.0), workload=ClosedLoop(1, output_len=None), rounds=2)
    timeline, result = _timeline(config)
    assert timeline == [
        ("draft", "draft", 0.0, 3.0),
        ("target", "wait_draft", 0.0, 3.0),
        ("target", "verify", 3.0, 13.0),
        ("draft", "draft", 13.0, 16.0),
        ("target", "wait_draft", 13.0, 16.0),
        ("target", "verify", 16.0, 26.0),
    ]
    assert result.tokens == 1 + 2 * 3  # α = 1: all K accepted plus the bonus, every round


def _sd_records(accepted, K=2):
    return tuple(
        parse_record(
            {
                "strategy": "sd",
                "round": i,
                "batch_size": len(ks),
                "K": K,
                "context_len": 10 + i,
                "accepted": list(ks),
                "emitted": [k + 1 for k in ks],
                "draft_ms": 4.0,
                "verify_ms": 10.0,
                "round_ms": 14.0,
                "draft_forwards": K,
            }
        )
        for i, ks in enumerate(accepted)
    )


def test_sd_first_draft_step_is_two_wide_after_a_row_accepted_all():
    """Batch 2, K 2, a draft step of d(rows) = 1 + 0.5·rows ms: the first step after a round in which some
    row accepted both tokens feeds x_K and the bonus, 4 rows (3 ms) instead of 2 (2 ms)."""
    timing = FittedTiming(verify=(10.0, 0.0, 0.0), draft=(1.0, 0.5, 0.0))
    config = SimConfig(
        Policy("sd", K=2),
        timing,
        Replay(_sd_records([(2, 0), (0, 1), (1, 1)])),
        workload=ClosedLoop(2, output_len=None),
        rounds=3,
    )
    timeline, _ = _timeline(config)
    drafts = [(s[2], s[3]) for s in timeline if s[:2] == ("draft", "draft")]
    assert drafts == [
        (10.0, 14.0),  # after the prefill (10 ms), one token a row: 2 + 2
        (24.0, 29.0),  # after (2, 0): 3 + 2 (was 4: every step as wide as the batch)
        (39.0, 43.0),
    ]  # after (0, 1): 2 + 2


@pytest.fixture
def ssd_config():
    """T_v 10, cache build 12 (longer than a verify), neural backup 3, link 0.5 ms each way, K = 2.

    Round 1 is a miss (no cache yet), round 2 a hit that waits for the build, round 3 a miss. Batch 1, so
    the miss policies differ only in whether round 3's backup waits for the build.
    """
    timing = ConstantTiming(t_verify_ms=10.0, t_build_ms=12.0, t_backup_ms=3.0)
    return SimConfig(
        Policy("ssd", K=2, fanout=(1, 1, 1)),
        timing,
        Replay(_ssd_records([1, 2, 0], [False, True, False])),
        workload=ClosedLoop(1, output_len=None),
        link=LinkSpec(latency_ms=0.5),
        rounds=3,
    )


def test_ssd_overlaps_build_with_verify_and_pays_backup_on_miss(ssd_config):
    timeline, result = _timeline(ssd_config)  # per-row, the default: the build always runs to its end
    assert timeline == [
        ("link_to_draft", "transfer", 0.0, 0.5),  # the Prefill (prefill and draft prefill take no time here)
        ("link_to_draft", "transfer", 0.0, 0.5),  # the first outcome: the new sequence
        ("target", "wait_draft", 0.0, 4.0),
        ("draft", "backup", 0.5, 3.5),  # no cache yet: a miss
        ("draft", "cache_build", 3.5, 15.5),  # overlaps the verify and outlasts it
        ("link_to_target", "transfer", 3.5, 4.0),
        ("target", "verify", 4.0, 14.0),
        ("link_to_draft", "transfer", 14.0, 14.5),
        ("target", "wait_draft", 14.0, 16.0),  # a hit, but the build ends at 15.5: the round stretches
        ("draft", "cache_build", 15.5, 27.5),  # runs to its end although the outcome (26.5) is a miss
        ("link_to_target", "transfer", 15.5, 16.0),
        ("target", "verify", 16.0, 26.0),
        ("link_to_draft", "transfer", 26.0, 26.5),
        ("target", "wait_draft", 26.0, 31.0),
        ("draft", "backup", 27.5, 30.5),
        ("link_to_target", "transfer", 30.5, 31.0),
        ("target", "verify", 31.0, 41.0),
    ]
    assert result.sim_ms == 41.0
    assert result.tokens == 1 + 2 + 3 + 1
    assert (result.hits_by_k, result.misses_by_k) == ([0, 1, 0], [0, 0, 1])


def test_whole_batch_policy_abandons_the_build_on_a_miss(ssd_config):
    config = replace(ssd_config, policy=replace(ssd_config.policy, miss_policy=MissPolicy.WHOLE_BATCH))
    timeline, result = _timeline(config)
    third_round = [s for s in timeline if s[2] >= 26.0]
    assert third_round == [
        ("link_to_draft", "transfer", 26.0, 26.5),
        ("target", "wait_draft", 26.0, 30.0),
        ("draft", "backup", 26.5, 29.5),  # at once: the miss is known when the outcome arrives
        ("link_to_target", "transfer", 29.5, 30.0),
        ("target", "verify", 30.0, 40.0),
    ]
    assert ("draft", "cache_build", 15.5, 26.5) in timeline  # cut short by the miss
    assert result.sim_ms == 40.0 and result.tokens == 1 + 2 + 3 + 1


class ScriptedDraws:
    """Cache speculations accept all K draft tokens, backup ones none; hits follow a script, one list per
    lookup. So every row's tokens show where its speculation came from."""

    def __init__(self, K, hits):
        self.K, self.script = K, list(hits)

    def accepted(self, from_cache):
        return [self.K if c else 0 for c in from_cache]

    def hits(self, from_cache, accepted):
        return self.script.pop(0)


def _two_rows(monkeypatch, miss_policy):
    """Batch 2, K = 2, T_v 10, build 12, backup 3, no link delay. Round 1: both rows new (backup);
    round 2: both hit; round 3: row 0 hits, row 1 misses. (The build after the last round is still running
    when the run stops, so it has no span.)"""
    monkeypatch.setattr(simulator.run, "_draws", lambda config, rng: ScriptedDraws(2, [[True, True], [True, False]]))
    timing = ConstantTiming(t_verify_ms=10.0, t_build_ms=12.0, t_backup_ms=3.0)
    config = SimConfig(
        Policy("ssd", K=2, fanout=(1, 1, 1), miss_policy=miss_policy),
        timing,
        IidAcceptance(0.5),
        hits=ConstantHit(0.5),
        workload=ClosedLoop(2, output_len=None),
        rounds=3,
    )
    timeline, result = _timeline(config)
    return [s for s in timeline if s[0] in ("draft", "target") and s[1] != "wait_draft"], result


def test_per_row_policy_keeps_the_hit_rows_and_backs_up_the_missed_one(monkeypatch):
    timeline, result = _two_rows(monkeypatch, MissPolicy.PER_ROW)
    assert timeline == [
        ("draft", "backup", 0.0, 3.0),
        ("draft", "cache_build", 3.0, 15.0),
        ("target", "verify", 3.0, 13.0),  # both rows from the backup: 1 token each
        ("draft", "cache_build", 15.0, 27.0),
        ("target", "verify", 15.0, 25.0),  # both hit, after the build: 3 tokens each
        ("draft", "backup", 27.0, 30.0),  # the build runs to its end, then row 1's backup
        ("target", "verify", 30.0, 40.0),  # row 0 from the cache (3 tokens), row 1 from the backup (1)
    ]
    assert result.sim_ms == 40.0
    assert result.tokens == 2 + 2 * 1 + 2 * 3 + (3 + 1)  # the prefill's token per row, then three rounds
    assert result.batch_hit_rate == pytest.approx(1 / 3)


def test_whole_batch_policy_backs_up_every_row_when_one_misses(monkeypatch):
    timeline, result = _two_rows(monkeypatch, MissPolicy.WHOLE_BATCH)
    assert timeline == [
        ("draft", "backup", 0.0, 3.0),
        ("draft", "cache_build", 3.0, 15.0),
        ("target", "verify", 3.0, 13.0),
        ("draft", "cache_build", 15.0, 25.0),  # abandoned when row 1's miss arrives at 25
        ("target", "verify", 15.0, 25.0),
        ("draft", "backup", 25.0, 28.0),  # both rows
        ("target", "verify", 28.0, 38.0),  # row 0's hit was in the dropped build: 1 token each
    ]
    assert result.sim_ms == 38.0
    assert result.tokens == 2 + 2 * 1 + 2 * 3 + (1 + 1)
    assert (result.hits_by_k, result.misses_by_k) == ([2, 0, 1], [0, 0, 1])  # lookups, not what was kept


def test_latency_follows_theory_one_itl_gap_per_speculative_round(ssd_config):
    """The SSD timeline above with a 5 ms prefill and a 7-token request: chunks of 1 (prefill), 2, 3 and 1 tokens.

    ITL is the gap between chunks (14, 12, 15 ms), not a gap spread over each round's tokens (7, 7, 4, 4, 4, 15).
    """
    timing = replace(ssd_config.timing, t_prefill_ms=5.0)
    config = replace(ssd_config, timing=timing, workload=ClosedLoop(1, output_len=Lengths(7)))
    timeline, result = _timeline(config)
    verify_ends = [end for actor, what, _, end in timeline if (actor, what) == ("target", "verify")]
    assert ("target", "prefill", 0, 5.0) in timeline and verify_ends == [19.0, 31.0, 46.0]
    assert result.tokens == 7 and result.completed_requests == 1
    assert result.ttft_ms["p50"] == 5.0
    assert result.itl_ms["mean"] == pytest.approx((14.0 + 12.0 + 15.0) / 3) and result.itl_ms["p50"] == 14.0
    assert result.tpot_ms["p50"] == pytest.approx((46.0 - 5.0) / 6)
    assert result.e2el_ms["p50"] == 46.0
    expected = summarize([request_latency(0.0, [5e-3, 19e-3, 31e-3, 46e-3], [1, 2, 3, 1])])
    for name in ("ttft", "itl", "tpot", "e2el"):
        for stat in ("mean", "p50", "p90", "p99"):
            assert getattr(result, f"{name}_ms")[stat] == pytest.approx(expected[f"{stat}_{name}_ms"])


def test_latency_without_a_finished_request_is_nan_not_zero(ssd_config):
    _, result = _timeline(ssd_config)  # output_len None: the request never finishes
    assert result.completed_requests == 0 and result.itl_ms["p50"] == 14.0
    assert all(v != v for v in (*result.tpot_ms.values(), *result.e2el_ms.values()))  # NaN


class _RowsSeen(ConstantTiming):
    """Constant timings that note how many rows each backup was asked to draft."""

    def __init__(self, **kw):
        super().__init__(**kw)
        object.__setattr__(self, "rows", [])

    def backup_ms(self, backup, rows, K, context):
        self.rows.append((backup.value, rows))
        return super().backup_ms(backup, rows, K, context)


@pytest.mark.parametrize("backup, third_round_rows", [("neural", 2), ("random", 1)])
def test_the_neural_backup_drafts_the_whole_batch_a_fast_one_the_missed_rows(monkeypatch, backup, third_round_rows):
    # as the engine does: draft_worker's neural backup runs every row of the batch (hit rows masked)
    monkeypatch.setattr(simulator.run, "_draws", lambda config, rng: ScriptedDraws(2, [[True, True], [True, False]]))
    timing = _RowsSeen(t_verify_ms=10.0, t_build_ms=12.0, t_backup_ms=3.0)
    config = SimConfig(
        Policy("ssd", K=2, fanout=(1, 1, 1), backup=backup),
        timing,
        IidAcceptance(0.5),
        hits=ConstantHit(0.5),
        workload=ClosedLoop(2, output_len=None),
        rounds=3,
    )
    simulate(config)
    assert timing.rows == [(backup, 2), (backup, third_round_rows)]  # round 1: both new; round 3: row 1 missed


def test_ssd_joiner_without_prefill_overlap_waits_for_its_draft_prefill_before_the_backup(ssd_config):
    # engines before the Prefill message (prefill_overlap False): the target prefills alone; the worker
    # prefills the joiner's draft side when the first round's outcome reaches it, then drafts the backup.
    # tests/simulator/test_join_timeline.py has the overlapped timeline.
    timing = ConstantTiming(
        t_verify_ms=10.0, t_build_ms=12.0, t_backup_ms=3.0, t_prefill_ms=5.0, t_draft_prefill_ms=2.0
    )
    config = replace(ssd_config, timing=timing, rounds=1, prefill_overlap=False)
    timeline, _ = _timeline(config)
    assert timeline[:6] == [
        ("target", "prefill", 0.0, 5.0),
        ("link_to_draft", "transfer", 5.0, 5.5),
        ("target", "wait_draft", 5.0, 11.0),
        ("draft", "prefill", 5.5, 7.5),
        ("draft", "backup", 7.5, 10.5),
        ("link_to_target", "transfer", 10.5, 11.0),
    ]

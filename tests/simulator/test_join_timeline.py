"""SSD joiners with the engine's Prefill message: exact timelines under constant timings, by hand.

The target announces each prefill to the draft worker before its own forward (engine/decode_loop.py
`_prefill` → DraftWorkerProposer.prefetch), and the worker prefills the joiners' draft side while the target
prefills them (draft_worker.py `prefill_ahead`); the round that brings the joiners pays only their backup.
The worker handles one message at a time (engine/ssd/process.py `serve`), so a Prefill that arrives during
a cache build waits for the build's end. `prefill_overlap=False` is the timeline of engines before the
message: the worker prefills the joiners when that round arrives, then drafts their backup.
"""

from dataclasses import replace

import pytest
import simpy

import simulator.run
from simulator import (
    ClosedLoop,
    ConstantHit,
    ConstantTiming,
    IidAcceptance,
    LinkSpec,
    Policy,
    Replay,
    Replayed,
    SimConfig,
    simulate,
)
from simulator.link import Link
from tests.simulator.test_timeline import ScriptedDraws, _ssd_records


def _timeline(config):
    result = simulate(config, trace=True)
    return sorted(result.timeline, key=lambda s: (s[2], s[0], s[3])), result


def _verify_ends(timeline):
    return [end for actor, what, _, end in timeline if (actor, what) == ("target", "verify")]


@pytest.fixture
def one_joiner():
    """One request at t = 0, batch 1, K = 2, link 0.5 ms each way. Target prefill 5, draft prefill 4, T_v 10,
    build 12, backup 3. Rounds: a miss (k = 1; the joiner has no cache), a hit (k = 2), a miss (k = 0)."""
    timing = ConstantTiming(
        t_verify_ms=10.0, t_build_ms=12.0, t_backup_ms=3.0, t_prefill_ms=5.0, t_draft_prefill_ms=4.0
    )
    return SimConfig(
        Policy("ssd", K=2, fanout=(1, 1, 1)),
        timing,
        Replay(_ssd_records([1, 2, 0], [False, True, False])),
        workload=ClosedLoop(1, output_len=None),
        link=LinkSpec(latency_ms=0.5),
        rounds=3,
    )


def test_the_worker_prefills_the_joiner_while_the_target_does(one_joiner):
    timeline, result = _timeline(one_joiner)
    assert timeline == [
        ("link_to_draft", "transfer", 0.0, 0.5),  # the Prefill, sent before the target's forward
        ("target", "prefill", 0.0, 5.0),  # TTFT 5
        ("draft", "prefill", 0.5, 4.5),  # hidden under the target's prefill
        ("link_to_draft", "transfer", 5.0, 5.5),  # round 1: the joiner
        ("target", "wait_draft", 5.0, 9.0),
        ("draft", "backup", 5.5, 8.5),  # at once: its draft side is ready
        ("draft", "cache_build", 8.5, 20.5),
        ("link_to_target", "transfer", 8.5, 9.0),
        ("target", "verify", 9.0, 19.0),
        ("link_to_draft", "transfer", 19.0, 19.5),
        ("target", "wait_draft", 19.0, 21.0),  # a hit, after the build
        ("draft", "cache_build", 20.5, 32.5),
        ("link_to_target", "transfer", 20.5, 21.0),
        ("target", "verify", 21.0, 31.0),
        ("link_to_draft", "transfer", 31.0, 31.5),
        ("target", "wait_draft", 31.0, 36.0),
        ("draft", "backup", 32.5, 35.5),  # a miss, after the build
        ("link_to_target", "transfer", 35.5, 36.0),
        ("target", "verify", 36.0, 46.0),
    ]
    assert result.ttft_ms["p50"] == 5.0
    assert result.tokens == 1 + 2 + 3 + 1


def test_without_the_overlap_the_first_round_waits_for_the_draft_prefill(one_joiner):
    timeline, result = _timeline(replace(one_joiner, prefill_overlap=False))
    assert timeline[:5] == [
        ("target", "prefill", 0.0, 5.0),
        ("link_to_draft", "transfer", 5.0, 5.5),
        ("target", "wait_draft", 5.0, 13.0),
        ("draft", "prefill", 5.5, 9.5),  # on the first round's path
        ("draft", "backup", 9.5, 12.5),
    ]
    assert _verify_ends(timeline) == [23.0, 35.0, 50.0]  # each 4 ms (the draft prefill) after the overlap's
    assert result.ttft_ms["p50"] == 5.0  # the first token comes from the target's prefill either way


def test_a_draft_prefill_longer_than_the_target_s_delays_the_first_round_by_the_difference(one_joiner):
    config = replace(one_joiner, timing=replace(one_joiner.timing, t_draft_prefill_ms=7.0), rounds=1)
    timeline, _ = _timeline(config)
    assert timeline == [
        ("link_to_draft", "transfer", 0.0, 0.5),
        ("target", "prefill", 0.0, 5.0),
        ("draft", "prefill", 0.5, 7.5),
        ("link_to_draft", "transfer", 5.0, 5.5),
        ("target", "wait_draft", 5.0, 11.0),
        ("draft", "backup", 7.5, 10.5),  # the round reached the worker at 5.5, mid-prefill
        ("link_to_target", "transfer", 10.5, 11.0),
        ("target", "verify", 11.0, 21.0),
    ]


def _second_joiner(monkeypatch, prefill_overlap):
    """Request A at t = 0, B at t = 13 (batch up to 2), no link delay, K = 2. Target prefill 10, draft prefill
    7, T_v 4, build 8 (longer than a verify), backup 2. Backup speculations accept 0 tokens, cached ones K;
    A hits both times it is looked up, B once."""
    monkeypatch.setattr(simulator.run, "_draws", lambda config, rng: ScriptedDraws(2, [[True], [True, True]]))
    timing = ConstantTiming(t_verify_ms=4.0, t_build_ms=8.0, t_backup_ms=2.0, t_prefill_ms=10.0, t_draft_prefill_ms=7.0)
    config = SimConfig(
        Policy("ssd", K=2, fanout=(1, 1, 1)),
        timing,
        IidAcceptance(0.5),
        hits=ConstantHit(0.5),
        workload=Replayed((0.0, 13.0), (16, 16), (100, 100), max_batch=2),
        rounds=3,
        prefill_overlap=prefill_overlap,
    )
    timeline, result = _timeline(config)
    return [s for s in timeline if s[1] != "wait_draft"], result


def test_a_prefill_announced_mid_build_waits_for_the_build(monkeypatch):
    timeline, result = _second_joiner(monkeypatch, prefill_overlap=True)
    assert timeline == [
        ("draft", "prefill", 0.0, 7.0),  # A's draft side
        ("target", "prefill", 0.0, 10.0),  # A's TTFT 10
        ("draft", "backup", 10.0, 12.0),
        ("draft", "cache_build", 12.0, 20.0),  # B's Prefill arrives at 16 and is read at 20
        ("target", "verify", 12.0, 16.0),
        ("target", "prefill", 16.0, 26.0),  # B arrived at 13: TTFT 13
        ("draft", "prefill", 20.0, 27.0),  # B's draft side, after the build
        ("draft", "backup", 27.0, 29.0),  # round 2 (A hit, B new) reached the worker at 26, mid-prefill
        ("draft", "cache_build", 29.0, 37.0),
        ("target", "verify", 29.0, 33.0),
        ("target", "verify", 37.0, 41.0),  # round 3: both hit, after the build
    ]
    assert result.ttft_ms["mean"] == pytest.approx((10.0 + 13.0) / 2)


def test_without_the_overlap_the_second_joiner_is_prefilled_after_the_target(monkeypatch):
    timeline, result = _second_joiner(monkeypatch, prefill_overlap=False)
    assert timeline == [
        ("target", "prefill", 0.0, 10.0),
        ("draft", "prefill", 10.0, 17.0),
        ("draft", "backup", 17.0, 19.0),
        ("draft", "cache_build", 19.0, 27.0),
        ("target", "verify", 19.0, 23.0),
        ("target", "prefill", 23.0, 33.0),  # B's TTFT 20
        ("draft", "prefill", 33.0, 40.0),
        ("draft", "backup", 40.0, 42.0),
        ("draft", "cache_build", 42.0, 50.0),
        ("target", "verify", 42.0, 46.0),
        ("target", "verify", 50.0, 54.0),
    ]
    assert result.ttft_ms["mean"] == pytest.approx((10.0 + 20.0) / 2)


def test_back_to_back_messages_queue_for_the_bandwidth_not_the_latency():
    # a Prefill and the round right after it: each waits for the one before to be put on the wire (2 ms at
    # 1000 bytes at 500 bytes per ms), then arrives 1 ms later
    env = simpy.Environment()
    link = Link(env, LinkSpec(latency_ms=1.0, bandwidth_gb_s=0.0005), "link_to_draft")
    arrived = []

    def receiver():
        while True:
            message = yield link.receive()
            arrived.append((message, env.now))

    env.process(receiver())
    link.send("prefill", 1000)
    link.send("round", 1000)
    env.run()
    assert arrived == [("prefill", 3.0), ("round", 5.0)]


def test_a_request_that_arrives_during_a_prefill_waits_for_the_next_round(monkeypatch):
    # the engine prefills at most once between rounds (engine/decode_loop.py `step`): B, arriving at 5 during
    # A's prefill (0-10), is prefilled after round 1, not straight after A's prefill
    monkeypatch.setattr(simulator.run, "_draws", lambda config, rng: ScriptedDraws(2, [[True], [True, True]]))
    timing = ConstantTiming(t_verify_ms=4.0, t_build_ms=8.0, t_backup_ms=2.0, t_prefill_ms=10.0)
    config = SimConfig(
        Policy("ssd", K=2, fanout=(1, 1, 1)),
        timing,
        IidAcceptance(0.5),
        hits=ConstantHit(0.5),
        workload=Replayed((0.0, 5.0), (16, 16), (100, 100), max_batch=2),
        rounds=2,
    )
    timeline, result = _timeline(config)
    assert [s for s in timeline if s[0] == "target" and s[1] != "wait_draft"] == [
        ("target", "prefill", 0.0, 10.0),
        ("target", "verify", 12.0, 16.0),  # A alone, after its backup (10-12)
        ("target", "prefill", 16.0, 26.0),  # B: TTFT 21
        ("target", "verify", 28.0, 32.0),  # after the backup of both rows (26-28)
    ]
    assert result.ttft_ms["mean"] == pytest.approx((10.0 + 21.0) / 2)

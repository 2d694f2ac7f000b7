"""Greedy SSD emits exactly the autoregressive tokens (fp32), hit or miss, with every backup and K = 1..5."""

import pytest

from engine import LLM, SamplingParams, SpeculativeConfig
from engine.config import DraftPlacement, FanoutSchedule
from tests.engine.tiny import noisy_copy, tiny_lm

# Fixtures target and ar_tokens (conftest.py): the tiny target, and greedy AR's tokens for PROMPTS under GREEDY.
PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15, 16]]
GREEDY = SamplingParams(temperature=0, max_new_tokens=14, stop_on_eos=False)
IN_PROCESS = DraftPlacement(in_process=True)


def ssd(target, draft, **spec):
    return LLM(target, draft, strategy="ssd", speculative=SpeculativeConfig(placement=IN_PROCESS, **spec))


@pytest.fixture(scope="module")
def partly_agreeing(target):
    return noisy_copy(target, noise=1.0)


@pytest.mark.parametrize("backup, K", [("neural", 3), ("random", 2), ("lookup", 5), ("auto", 1)])
def test_greedy_ssd_with_a_partly_agreeing_draft_equals_ar(target, partly_agreeing, ar_tokens, backup, K):
    out = ssd(target, partly_agreeing, K=K, backup=backup).generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in out] == ar_tokens
    summary = out.metrics.summary()
    assert 0 < summary["hit_rate"] < 1  # both paths ran
    assert len(out.metrics.accepted_hist) >= 2


def test_target_as_its_own_draft_always_hits(target, ar_tokens):
    out = ssd(target, target, K=4).generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in out] == ar_tokens
    decode = [r for r in out.metrics.rounds if r.phase == "decode"]
    assert not any(decode[0].hit)
    assert all(all(r.hit) for r in decode[1:])
    assert out.metrics.summary()["hit_rate"] == 1.0


def test_greedy_ssd_with_an_unrelated_draft_equals_ar(target, ar_tokens):
    out = ssd(target, tiny_lm(1, layers=1, scale=4.0), K=4).generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in out] == ar_tokens


def test_forced_misses_equal_ar(target, partly_agreeing, ar_tokens):
    out = ssd(target, partly_agreeing, K=2, fanout=(0, 0, 0), schedule="given", backup="random").generate(
        PROMPTS, GREEDY
    )
    assert [o.token_ids for o in out] == ar_tokens
    assert out.metrics.summary()["hit_rate"] == 0.0


@pytest.mark.parametrize("schedule", list(FanoutSchedule))
def test_schedules_and_saguaro_leave_greedy_output_unchanged(target, partly_agreeing, ar_tokens, schedule):
    spec = dict(K=3, C=0.3, schedule=schedule, fanout=(2, 1, 1, 2), fanout_backup=(3, 2, 1, 1), budget=None)
    if schedule is FanoutSchedule.GEOMETRIC:
        spec["budget"] = 8
    out = ssd(target, partly_agreeing, **spec).generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in out] == ar_tokens
    if schedule is not FanoutSchedule.GEOMETRIC:
        assert all(sum(r.fanout) == 6 for r in out.metrics.rounds if r.fanout)


def test_eos_truncates_and_finished_rows_leave_the_batch(target, partly_agreeing, ar_tokens):
    eos = ar_tokens[1][4]
    target.generation_config.eos_token_id = eos
    try:
        out = ssd(target, partly_agreeing, K=3).generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=14))
    finally:
        target.generation_config.eos_token_id = None
    for o, expected in zip(out, ar_tokens, strict=True):
        want = expected[: expected.index(eos) + 1] if eos in expected else expected
        assert o.token_ids == want

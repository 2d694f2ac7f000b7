"""The SSD worker's cache is estimated before it is built: an absurd budget is refused with the budget that fits."""

import logging

import pytest
import torch

from engine import LLM, SamplingParams, SpeculativeConfig
from engine.config import DraftPlacement
from engine.scheduler import MemoryLimit, Scheduler, SchedulerConfig
from engine.sequence import Sequence
from engine.sparse import RANK_DEPTH
from engine.ssd.memory import PEAK_OVER_KEPT, SHARE, check_budget, kv_bytes_per_token, worker_bytes_per_sequence
from tests.engine.tiny import tiny_lm


def test_the_copying_estimate_counts_kv_copies_q_ranking_and_glue():
    model = tiny_lm(0, vocab_size=50, layers=2, hidden=32)  # 4 heads of 8, 2 KV heads, float32
    assert kv_bytes_per_token(model) == 2 * 2 * 2 * 8 * 4
    K, branches, context = 3, 7, 100
    ranking = K * min(RANK_DEPTH, 50) * 8  # the kept ids of the draft's best tokens per position
    expected = branches * (kv_bytes_per_token(model) * (context + K + 1) + K * 50 * 4 + ranking) + (K + 1) * 50 * 4
    assert worker_bytes_per_sequence(model, K, branches, context, tree=False) == expected


def test_the_tree_estimate_counts_the_rows_kv_once_and_each_branchs_own_blocks():
    model = tiny_lm(0, vocab_size=50, layers=2, hidden=32)
    kv = kv_bytes_per_token(model)
    K, branches, context = 3, 7, 100
    q_and_ranking = K * 50 * 4 + K * min(RANK_DEPTH, 50) * 8
    later = branches * K * 50 * 4  # the logits the hit branch's ranking is made from, under LATER_RANKING_BYTES
    expected = kv * (context + K + 1) + branches * (kv * 16 + q_and_ranking) + later + (K + 1) * 50 * 4
    assert worker_bytes_per_sequence(model, K, branches, context) == expected
    # the context is charged once, not per branch: a longer context costs the same whatever the budget
    longer = worker_bytes_per_sequence(model, K, branches, context + 1000)
    assert longer - worker_bytes_per_sequence(model, K, branches, context) == 1000 * kv
    assert (
        worker_bytes_per_sequence(model, K, branches, context + 1000, tree=False)
        - worker_bytes_per_sequence(model, K, branches, context, tree=False)
    ) == 1000 * kv * branches


@pytest.mark.parametrize("tree", [True, False])
def test_an_absurd_budget_is_refused_with_the_largest_that_fits(monkeypatch, tree):
    model = tiny_lm(0)
    monkeypatch.setattr("engine.ssd.memory.device_bytes", lambda device: 2**20)  # a 1 MiB device
    fits = [b for b in range(10_000) if PEAK_OVER_KEPT * worker_bytes_per_sequence(model, 4, b, tree=tree) <= 2**19]
    most = max(fits)
    assert 0 < most < 9_999
    check_budget(model, 4, most, torch.device("cpu"), tree)  # the largest that fits passes
    with pytest.raises(ValueError, match=f"lower --budget to at most {most} "):
        check_budget(model, 4, most + 1, torch.device("cpu"), tree)


def test_llm_refuses_the_budget_before_starting_the_worker():
    target = tiny_lm(0)
    spec = SpeculativeConfig(K=4, budget=10**9, placement=DraftPlacement(in_process=True))
    with pytest.raises(ValueError, match="lower --budget to at most"):
        LLM(target, tiny_lm(1), strategy="ssd", speculative=spec)
    with LLM(
        target,
        tiny_lm(1),
        strategy="ssd",
        speculative=SpeculativeConfig(K=4, budget=12, placement=DraftPlacement(in_process=True)),
    ) as llm:
        assert llm.strategy_in_use == "ssd"


def _seq(i: int, prompt_len: int = 4, new: int = 8) -> Sequence:
    return Sequence(i, str(i), i, [1] * prompt_len, SamplingParams(max_new_tokens=new), frozenset(), i, 0.0)


def test_memory_holds_admission_and_says_so_once(caplog):
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=8))
    scheduler.limit_by_memory(MemoryLimit(250, lambda s: 100, "a fake cache"))
    scheduler.waiting.extend(_seq(i) for i in range(5))
    with caplog.at_level(logging.WARNING, logger="engine.scheduler"):
        first = scheduler.admit(0)
        assert [s.seq_id for s in first] == [0, 1]  # a third would need 300 of 250 bytes
        assert scheduler.admit(2) == []
    assert len([r for r in caplog.records if "memory holds admission at 2" in r.message]) == 1
    first[0].finish_reason = "length"  # one finishes: its memory is free again
    assert [s.seq_id for s in scheduler.admit(1)] == [2]


def test_memory_counts_each_sequence_at_its_full_length():
    scheduler = Scheduler(SchedulerConfig())
    scheduler.limit_by_memory(MemoryLimit(99, lambda s: len(s.prompt_ids) + s.params.max_new_tokens, "fake"))
    scheduler.waiting.extend([_seq(0, 10, 40), _seq(1, 10, 30), _seq(2, 2, 8)])
    assert [s.seq_id for s in scheduler.admit(0)] == [0, 1]  # 50 + 40 in; with the third's 10 it would be 100
    assert scheduler.admit(2) == []


def test_one_sequence_always_runs_even_if_it_alone_is_over_the_limit():
    scheduler = Scheduler(SchedulerConfig())
    scheduler.limit_by_memory(MemoryLimit(10, lambda s: 1000, "fake"))
    scheduler.waiting.extend(_seq(i) for i in range(3))
    assert [s.seq_id for s in scheduler.admit(0)] == [0]
    assert scheduler.admit(1) == []


def test_ssd_admits_what_the_workers_memory_holds_and_outputs_are_unchanged(monkeypatch, caplog):
    target, draft = tiny_lm(0), tiny_lm(1)
    spec = SpeculativeConfig(K=3, budget=6, placement=DraftPlacement(in_process=True))
    params = SamplingParams(temperature=0.0, max_new_tokens=10, stop_on_eos=False)
    prompts = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12], [13, 14]]
    with LLM(target, draft, strategy="ssd", speculative=spec) as llm:
        free = [o.token_ids for o in llm.generate(prompts, params)]
    # A device on which the worker's caches for two of these sequences fit, not three.
    per_seq = PEAK_OVER_KEPT * worker_bytes_per_sequence(draft, 3, 6, 5 + 10)
    monkeypatch.setattr("engine.ssd.memory.device_bytes", lambda device: int(2.5 * per_seq / SHARE))
    monkeypatch.setattr("engine.ssd.memory.check_budget", lambda *args: None)  # (it assumes 512-token contexts)
    with caplog.at_level(logging.WARNING, logger="engine.scheduler"):
        with LLM(target, draft, strategy="ssd", speculative=spec) as llm:
            out = llm.generate(prompts, params)
    assert [o.token_ids for o in out] == free
    assert max(r.batch_size for r in out.metrics.rounds if r.phase == "decode") == 2
    assert len([r for r in caplog.records if "memory holds admission" in r.message]) == 1


def test_an_int8_draft_is_estimated_like_its_float_self_and_ssd_starts_with_it():
    # dynamic int8 swaps the head for a module whose .weight is a method: the estimate reads out_features
    from engine.loading.quantize import int8_dynamic

    draft = tiny_lm(seed=1)
    expected = worker_bytes_per_sequence(draft, 3, 6)
    assert worker_bytes_per_sequence(int8_dynamic(tiny_lm(seed=1)), 3, 6) == expected
    spec = SpeculativeConfig(K=2, budget=4, placement=DraftPlacement(in_process=True))
    with LLM(
        tiny_lm(seed=0), tiny_lm(seed=1), strategy="ssd", speculative=spec, draft_quant="int8-dynamic", threads=1
    ) as llm:
        out = llm.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_new_tokens=6, stop_on_eos=False))
        assert llm.strategy_in_use == "ssd" and len(out[0].token_ids) == 6

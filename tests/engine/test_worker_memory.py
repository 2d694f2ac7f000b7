"""The SSD worker's cache is estimated before it is built: an absurd budget is refused with the budget that fits."""

import pytest
import torch

from engine import LLM, SpeculativeConfig
from engine.config import DraftPlacement
from engine.ssd.memory import PEAK_OVER_KEPT, check_budget, kv_bytes_per_token, worker_bytes_per_sequence
from tests.engine.tiny import tiny_lm


def test_the_estimate_counts_kv_copies_q_logits_and_glue():
    model = tiny_lm(0, vocab_size=50, layers=2, hidden=32)  # 4 heads of 8, 2 KV heads, float32
    assert kv_bytes_per_token(model) == 2 * 2 * 2 * 8 * 4
    K, branches, context = 3, 7, 100
    expected = branches * (kv_bytes_per_token(model) * (context + K + 1) + 2 * K * 50 * 4) + (K + 1) * 50 * 4
    assert worker_bytes_per_sequence(model, K, branches, context) == expected


def test_an_absurd_budget_is_refused_with_the_largest_that_fits(monkeypatch):
    model = tiny_lm(0)
    monkeypatch.setattr("engine.ssd.memory.device_bytes", lambda device: 2**20)  # a 1 MiB device
    per_branch = PEAK_OVER_KEPT * (worker_bytes_per_sequence(model, 4, 1) - worker_bytes_per_sequence(model, 4, 0))
    most = int((2**19 - PEAK_OVER_KEPT * worker_bytes_per_sequence(model, 4, 0)) // per_branch)
    check_budget(model, 4, most, torch.device("cpu"))  # the largest that fits passes
    with pytest.raises(ValueError, match=f"lower --budget to at most {most} "):
        check_budget(model, 4, most + 1, torch.device("cpu"))


def test_llm_refuses_the_budget_before_starting_the_worker():
    target = tiny_lm(0)
    spec = SpeculativeConfig(K=4, budget=10**9, placement=DraftPlacement(in_process=True))
    with pytest.raises(ValueError, match="lower --budget to at most"):
        LLM(target, tiny_lm(1), strategy="ssd", speculative=spec)
    with LLM(target, tiny_lm(1), strategy="ssd", speculative=SpeculativeConfig(K=4, budget=12,
             placement=DraftPlacement(in_process=True))) as llm:
        assert llm.strategy_in_use == "ssd"

"""Greedy AR, SD and SSD on CUDA emit the same tokens (fp32 tiny models, a batch of two prompts).

The target runs on cuda:0; SSD's draft worker runs in its own process on cuda:1 when there are two GPUs,
else on cuda:0 (so the NCCL link is exercised either way), and once in the target's process."""

import pytest

from engine import LLM, SamplingParams, SpeculativeConfig
from engine.config import DraftPlacement
from tests.engine.tiny import noisy_copy, tiny_lm
from tests.gpu.devices import TARGET_DEVICE, draft_device

pytestmark = pytest.mark.cuda

PROMPTS = [[1, 2, 3, 4, 5], [7, 8]]
GREEDY = SamplingParams(temperature=0, max_new_tokens=12, stop_on_eos=False)


def models():
    """A fresh target and draft for each engine: LLM moves a given model to its device in place."""
    target = tiny_lm(0, scale=4.0)
    return target, noisy_copy(target, 1.0)


@pytest.fixture(scope="module")
def ar_tokens():
    target, _ = models()
    with LLM(target, device=TARGET_DEVICE) as llm:
        return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]


def test_sd_on_cuda_gives_the_ar_tokens(ar_tokens):
    target, draft = models()
    with LLM(target, draft, strategy="sd", speculative=SpeculativeConfig(K=3), device=TARGET_DEVICE) as llm:
        out = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in out] == ar_tokens


def test_ssd_with_the_worker_in_the_target_process_gives_the_ar_tokens(ar_tokens):
    target, draft = models()
    spec = SpeculativeConfig(K=3, placement=DraftPlacement(in_process=True))
    with LLM(target, draft, strategy="ssd", speculative=spec, device=TARGET_DEVICE) as llm:
        out = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in out] == ar_tokens
    assert out.metrics.summary()["hit_rate"] > 0


def test_ssd_with_the_worker_in_its_own_process_gives_the_ar_tokens(ar_tokens):
    target, draft = models()
    spec = SpeculativeConfig(K=3, placement=DraftPlacement(draft_device=draft_device(), deadline_s=60.0))
    with LLM(target, draft, strategy="ssd", speculative=spec, device=TARGET_DEVICE) as llm:
        out = llm.generate(PROMPTS, GREEDY)
        process = llm.proposer.channel.process  # still SSD: a broken link would have replaced the proposer
        assert process.is_alive()
    assert [o.token_ids for o in out] == ar_tokens
    assert {r.strategy for r in out.metrics.rounds if r.phase == "decode"} == {"ssd"}
    assert not process.is_alive()

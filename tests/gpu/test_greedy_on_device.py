"""Greedy AR, SD and SSD emit the same tokens on the device (fp32 tiny models, a batch of two prompts).

The target runs on the device's first unit; SSD's draft worker runs once in its own process (asked for plain
"cuda" on a GPU, which the engine resolves before starting it: the next GPU, or cuda:0 when it is the only one)
and once in the target's process."""

import pytest

from engine import LLM, SamplingParams, SpeculativeConfig
from engine.config import DraftPlacement
from tests.engine.tiny import noisy_copy, tiny_lm
from tests.gpu.devices import target_device, worker_device

PROMPTS = [[1, 2, 3, 4, 5], [7, 8]]
GREEDY = SamplingParams(temperature=0, max_new_tokens=12, stop_on_eos=False)


def models():
    """A fresh target and draft for each engine: LLM moves a given model to its device in place."""
    target = tiny_lm(0, scale=4.0)
    return target, noisy_copy(target, 1.0)


@pytest.fixture
def ar_tokens(device):
    target, _ = models()
    with LLM(target, device=target_device(device), dtype="float32") as llm:
        return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]


def test_sd_gives_the_ar_tokens(device, ar_tokens):
    target, draft = models()
    with LLM(
        target, draft, strategy="sd", speculative=SpeculativeConfig(K=3), device=target_device(device), dtype="float32"
    ) as llm:
        out = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in out] == ar_tokens


def test_ssd_with_the_worker_in_the_target_process_gives_the_ar_tokens(device, ar_tokens):
    target, draft = models()
    spec = SpeculativeConfig(K=3, placement=DraftPlacement(in_process=True))
    with LLM(target, draft, strategy="ssd", speculative=spec, device=target_device(device), dtype="float32") as llm:
        out = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in out] == ar_tokens
    assert out.metrics.summary()["hit_rate"] > 0


def test_ssd_with_the_worker_in_its_own_process_gives_the_ar_tokens(device, ar_tokens):
    target, draft = models()
    spec = SpeculativeConfig(K=3, placement=DraftPlacement(draft_device=worker_device(device), deadline_s=60.0))
    with LLM(target, draft, strategy="ssd", speculative=spec, device=target_device(device), dtype="float32") as llm:
        out = llm.generate(PROMPTS, GREEDY)
        process = llm.proposer.channel.process  # still SSD: a broken link would have replaced the proposer
        assert process.is_alive()
    assert [o.token_ids for o in out] == ar_tokens
    assert {r.strategy for r in out.metrics.rounds if r.phase == "decode"} == {"ssd"}
    assert not process.is_alive()

"""Compiled forwards on CUDA (torch.compile mode="reduce-overhead": CUDA graphs over the static slot cache)
emit the eager engine's greedy tokens (fp32 tiny models) in AR, SD and SSD, with a request joining mid-run, and
compiled SD still samples the target's distribution (chi-square, as tests/gpu/test_distribution_on_device.py).

The target runs on cuda:0; SSD's draft worker in its own process on the GPU tests/gpu/devices.py names."""

import pytest

from engine import LLM, SamplingParams, SpeculativeConfig
from engine.compile_config import CompileConfig
from engine.config import DraftPlacement
from tests.engine.batching import staggered
from tests.engine.tiny import (
    FALSE_ALARM,
    PROMPT,
    STEPS,
    V,
    chi_square_p,
    exact_distribution,
    noisy_copy,
    sequence_counts,
    tiny_lm,
)
from tests.gpu.devices import target_device, worker_device

pytestmark = pytest.mark.cuda
TARGET_DEVICE = target_device("cuda")

PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11]]
GREEDY = SamplingParams(temperature=0, max_new_tokens=12, stop_on_eos=False)
GRAPHS = CompileConfig(max_len=64, batch_buckets=(4,))  # few shapes: each is compiled (and captured) once


def models(vocab_size: int = 50, hidden: int = 32, scale: float = 4.0):
    """A fresh target and draft for each engine: LLM moves a given model to its device in place."""
    target = tiny_lm(0, vocab_size=vocab_size, hidden=hidden, scale=scale)
    return target, noisy_copy(target, 1.0)


@pytest.fixture(scope="module")
def solo():
    target, _ = models()
    with LLM(target, device=TARGET_DEVICE) as llm:
        return [llm.generate([p], GREEDY)[0].token_ids for p in PROMPTS]


@pytest.mark.parametrize("strategy, placement", [("ar", None), ("sd", None), ("ssd", "own process")])
def test_cuda_graphs_with_a_join_mid_run_give_the_eager_tokens(solo, strategy, placement):
    target, draft = models()
    if placement == "own process":
        placement = DraftPlacement(draft_device=worker_device("cuda"), deadline_s=60.0)
    spec = None if strategy == "ar" else SpeculativeConfig(K=3, placement=placement or DraftPlacement())
    with LLM(
        target,
        None if strategy == "ar" else draft,
        strategy=strategy,
        speculative=spec,
        device=TARGET_DEVICE,
        compile=GRAPHS,
    ) as llm:
        seqs, _ = staggered(llm, PROMPTS, GREEDY, join_at=[0, 2, 3])
        assert llm.strategy_in_use == strategy
        assert llm._fed_target.cudagraphs and llm._fed_target.first_call_s  # compiled buckets ran
    assert [s.output_ids for s in seqs] == solo


def test_compiled_sd_on_cuda_matches_the_target_distribution():
    target, draft = models(vocab_size=V, hidden=16, scale=6.0)
    params = SamplingParams(temperature=1.0, max_new_tokens=STEPS, stop_on_eos=False, seed=11)
    settings = CompileConfig(max_len=16, batch_buckets=(1024,))
    with LLM(
        target,
        draft,
        strategy="sd",
        speculative=SpeculativeConfig(K=2),
        device=TARGET_DEVICE,
        compile=settings,
        max_num_seqs=1024,
    ) as llm:
        counts = sequence_counts(llm.generate([PROMPT] * 20_000, params))
    assert chi_square_p(counts, exact_distribution(target.cpu(), params)) > FALSE_ALARM

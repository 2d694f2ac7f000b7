"""Compiled forwards on the static slot cache (engine.compiled, torch.compile with inductor on the CPU) emit the
eager engine's greedy tokens (fp32, tiny models) in AR, SD and SSD: at batch 1, and in ragged batches that
requests join and leave mid-run.

Compiling is slow on a CPU (seconds per bucket; inductor's on-disk cache makes repeats fast), so the
engines here use one batch bucket (4) and a short row (64 tokens): two or three compiled shapes per model."""

import pytest

from engine import LLM, SamplingParams, SpeculativeConfig
from engine.compile_config import CompileConfig
from engine.config import DraftPlacement
from tests.engine.batching import staggered

PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11], [3, 1, 4, 1, 5, 9, 2, 6]]
GREEDY = SamplingParams(temperature=0, max_new_tokens=14, stop_on_eos=False)
COMPILED = CompileConfig(max_len=64, batch_buckets=(4,))
IN_PROCESS = DraftPlacement(in_process=True)


def compiled(target, draft, strategy: str, placement: DraftPlacement = IN_PROCESS) -> LLM:
    spec = None if strategy == "ar" else SpeculativeConfig(K=3, placement=placement)
    return LLM(target, None if strategy == "ar" else draft, strategy=strategy, speculative=spec, compile=COMPILED)


def compiled_shapes(llm: LLM) -> set[tuple[int, int, int]]:
    """The buckets the target ran in (rows, tokens, columns)."""
    return set(llm._fed_target.first_call_s)


@pytest.mark.parametrize("strategy", ["ar", "sd", "ssd"])
def test_compiled_batch_1_equals_the_eager_engine(target, draft, solo, strategy):
    with compiled(target, draft, strategy) as llm:
        out = llm.generate([PROMPTS[0]], GREEDY)
        shapes = compiled_shapes(llm)
    assert out[0].token_ids == solo[0]
    assert (4, 1 if strategy == "ar" else 4, 65) in shapes  # the verify ran in its compiled bucket


@pytest.mark.parametrize("strategy", ["ar", "sd", "ssd"])
def test_compiled_ragged_batch_with_joins_equals_each_request_alone(target, draft, solo, strategy):
    with compiled(target, draft, strategy) as llm:
        seqs, sizes = staggered(llm, PROMPTS, GREEDY, join_at=[0, 2, 3, 5])
    assert [s.output_ids for s in seqs] == solo
    assert max(sizes) >= 3  # they really shared the batch


def test_compiled_ssd_worker_process_equals_the_eager_engine(target, draft, solo):
    with compiled(target, draft, "ssd", DraftPlacement(deadline_s=60.0)) as llm:
        out = llm.generate(PROMPTS[:3], GREEDY)
        assert llm.strategy_in_use == "ssd"
    assert [o.token_ids for o in out] == solo[:3]
    assert out.metrics.summary()["hit_rate"] > 0

"""A target run tensor-parallel over two ranks on the CPU (gloo; engine.tp) emits the single-process engine's
greedy tokens (fp32, tiny models) in AR, SD and SSD with requests joining mid-run, samples the target's
distribution (chi-square), and a rank that dies ends the run with one line and leaves no process behind.

Each engine here starts a second process (a few seconds each)."""

import os
import signal

import pytest

from engine import LLM, SamplingParams, SpeculativeConfig
from engine.tp import TPRankDied
from tests.engine.batching import staggered
from tests.engine.tiny import FALSE_ALARM, PROMPT, STEPS, chi_square_p, exact_distribution, sequence_counts

PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11], [3, 1, 4, 1, 5, 9, 2, 6]]
GREEDY = SamplingParams(temperature=0, max_new_tokens=14, stop_on_eos=False)


def tensor_parallel(target, draft, strategy: str, **kwargs) -> LLM:
    spec = None if strategy == "ar" else SpeculativeConfig(K=3)
    return LLM(target, None if strategy == "ar" else draft, strategy=strategy, speculative=spec, tp=2, **kwargs)


@pytest.mark.parametrize("strategy", ["ar", "sd", "ssd"])
def test_two_ranks_with_joins_mid_run_give_the_single_process_greedy_tokens(target, draft, solo, strategy):
    with tensor_parallel(target, draft, strategy) as llm:
        seqs, sizes = staggered(llm, PROMPTS, GREEDY, join_at=[0, 2, 3, 5])
        assert llm.strategy_in_use == strategy
    assert [s.output_ids for s in seqs] == solo
    assert max(sizes) >= 3  # they really shared the batch


def test_sd_on_a_tensor_parallel_target_matches_the_target_distribution(target8, draft8):
    """The chi-square test of test_sd_distribution.py (rejects at p < 1e-3, fixed seeds) on a two-rank target."""
    params = SamplingParams(temperature=1.0, max_new_tokens=STEPS, stop_on_eos=False, seed=11)
    with LLM(target8, draft8, strategy="sd", speculative=SpeculativeConfig(K=2), tp=2) as llm:
        counts = sequence_counts(llm.generate([PROMPT] * 6_000, params))
    assert chi_square_p(counts, exact_distribution(target8, params)) > FALSE_ALARM


def test_a_rank_that_dies_ends_the_run_with_one_line_and_no_process_left(target, draft):
    llm = tensor_parallel(target, draft, "sd")
    follower = llm._tp.processes[0]
    try:
        llm.generate([PROMPTS[0]], GREEDY)
        os.kill(follower.pid, signal.SIGKILL)
        with pytest.raises(TPRankDied) as caught:
            llm.generate([PROMPTS[1]], GREEDY)
    finally:
        llm.close()
    message = str(caught.value)
    assert "rank 1 of 2" in message and "signal 9" in message and "\n" not in message
    assert not follower.is_alive() and follower.exitcode == -signal.SIGKILL


def test_closing_stops_the_other_ranks_and_frees_the_process_group(target, draft):
    import torch.distributed as dist

    llm = tensor_parallel(target, draft, "ar")
    follower = llm._tp.processes[0]
    llm.close()
    assert not follower.is_alive() and follower.exitcode == 0  # it left its loop on Stop
    assert not dist.is_initialized()  # a next tensor-parallel engine can start in this process


def test_tensor_parallel_and_compile_are_refused_together(target):
    with pytest.raises(ValueError, match="compile and tp > 1"):
        LLM(target, tp=2, compile=True)

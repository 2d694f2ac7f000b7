"""SSD with the draft worker in its own process: same output, faults fall back to synchronous SD (or AR
without an in-process draft), no orphans. Every test here starts one worker process (~5 s each)."""

import logging
import multiprocessing
import os
import signal
import threading
import time

import pytest
import torch

from engine import LLM, SamplingParams, SpeculativeConfig
from engine.config import DraftPlacement, EngineConfig, WorkerFaults
from engine.loading.quantize import int8_dynamic
from engine.loading.recipe import draft_recipe
from engine.ssd.heartbeat import BEAT_S, LOST_S
from saguaro.bench.prompts import load_prompts
from tests.engine.tiny import noisy_copy

# Fixtures target and ar_tokens (conftest.py): the tiny target, and greedy AR's tokens for PROMPTS under GREEDY.
PROMPTS = [[1, 2, 3, 4, 5], [7, 8]]
GREEDY = SamplingParams(temperature=0, max_new_tokens=12, stop_on_eos=False)
NOTICE_S = 30.0  # a fault found by the heartbeat: far below a 120 s deadline, far above a loaded machine's noise


def ssd(target, faults=None, deadline_s=5.0):
    spec = SpeculativeConfig(K=3, placement=DraftPlacement(deadline_s=deadline_s, faults=faults))
    return LLM(target, noisy_copy(target, 1.0), strategy="ssd", speculative=spec)


def decode_strategies(out) -> list[str]:
    return [r.strategy for r in out.metrics.rounds if r.phase == "decode"]


def assert_no_children_left() -> None:
    assert multiprocessing.active_children() == []
    try:
        import psutil
    except ImportError:
        return
    left = [c for c in psutil.Process().children(recursive=True) if "resource_tracker" not in " ".join(c.cmdline())]
    assert left == []  # multiprocessing's own resource tracker may stay; no worker may


def test_worker_process_gives_the_ar_output_and_is_reaped_on_close(target, ar_tokens):
    with ssd(target) as llm:
        first = llm.generate(PROMPTS, GREEDY)
        second = llm.generate(PROMPTS[::-1], GREEDY)  # the worker serves several calls
        process = llm.proposer.channel.process
        assert process.is_alive() and process.pid != os.getpid()
    assert [o.token_ids for o in first] == ar_tokens
    assert [o.token_ids for o in second] == ar_tokens[::-1]
    assert first.metrics.summary()["hit_rate"] > 0
    assert set(decode_strategies(first)) == {"ssd"}
    assert not process.is_alive()
    assert_no_children_left()


# (fault, draft in the target process?, expected fallback); the hang test waits out a 1 s deadline.
FAULTS = [("exit", True, "sd"), ("hang", True, "sd"), ("malformed", False, "ar")]


@pytest.mark.parametrize("fault, draft_here, fallback", FAULTS)
def test_a_failing_worker_falls_back_with_one_warning(target, ar_tokens, fault, draft_here, fallback, caplog):
    faults = WorkerFaults(**{f"{fault}_at_round": 2})
    with caplog.at_level(logging.WARNING), ssd(target, faults, deadline_s=1.0 if fault == "hang" else 5.0) as llm:
        if not draft_here:
            llm.proposer.draft = None  # as if the target process could not hold the draft
        out = llm.generate(PROMPTS, GREEDY)
        assert llm.proposer.name == fallback  # the worker is reaped and its proposer replaced
        again = llm.generate(PROMPTS, GREEDY)  # later calls go straight to the fallback, without a warning
    assert [o.token_ids for o in out] == ar_tokens
    assert [o.token_ids for o in again] == ar_tokens
    strategies = decode_strategies(out)
    assert strategies[:2] == ["ssd", "ssd"] and set(strategies[2:]) == {fallback}
    assert out.metrics.summary()["fallback_rounds"] == len(strategies) - 2
    assert set(decode_strategies(again)) == {fallback}
    how = "synchronous speculative decoding" if fallback == "sd" else "autoregressive decoding"
    assert caplog.text.count("SSD draft worker failed") == 1 and f"continuing with {how}" in caplog.text
    assert_no_children_left()


def test_a_worker_killed_from_outside_mid_generation(target, ar_tokens, caplog):
    # The worker sleeps on round 2 and the deadline is long: only the kill can end the wait.
    with caplog.at_level(logging.WARNING), ssd(target, WorkerFaults(hang_at_round=2), deadline_s=120.0) as llm:
        pid = llm.proposer.channel.process.pid
        killer = threading.Timer(1.5, os.kill, (pid, signal.SIGKILL))
        killer.start()
        out = llm.generate(PROMPTS, GREEDY)
        killer.join()
    assert [o.token_ids for o in out] == ar_tokens
    strategies = decode_strategies(out)
    assert strategies[:2] == ["ssd", "ssd"] and set(strategies[2:]) == {"sd"}
    assert "SSD draft worker failed" in caplog.text
    assert_no_children_left()


def test_a_stopped_worker_is_found_by_its_heartbeat_long_before_its_deadline(target, ar_tokens, caplog):
    # The worker's whole process stops (SIGSTOP) at round 2 and the deadline is 120 s: only its silent heartbeat
    # can end the wait. Bound: LOST_S + BEAT_S (engine.ssd.heartbeat: 5.5 s) after its last beat; the test allows
    # NOTICE_S for the whole call on a loaded 2-core machine.
    with caplog.at_level(logging.WARNING), ssd(target, WorkerFaults(stop_at_round=2), deadline_s=120.0) as llm:
        t0 = time.monotonic()
        out = llm.generate(PROMPTS, GREEDY)
        took_s = time.monotonic() - t0
        assert "no heartbeat" in llm.fault
    assert took_s < NOTICE_S
    assert LOST_S + BEAT_S < NOTICE_S < 120.0
    assert [o.token_ids for o in out] == ar_tokens
    strategies = decode_strategies(out)
    assert strategies[:2] == ["ssd", "ssd"] and set(strategies[2:]) == {"sd"}
    assert caplog.text.count("SSD draft worker failed") == 1
    assert_no_children_left()


def test_a_worker_killed_from_outside_between_calls(target, ar_tokens, caplog):
    threads_before = torch.get_num_threads()
    with caplog.at_level(logging.WARNING), ssd(target) as llm:
        llm.generate(PROMPTS, GREEDY)
        channel = llm.proposer.channel
        if channel.target_threads:  # the worker took its core(s) from the target
            assert torch.get_num_threads() == channel.target_threads
        os.kill(channel.process.pid, signal.SIGKILL)
        channel.process.join(10)
        out = llm.generate(PROMPTS, GREEDY)
        assert torch.get_num_threads() == threads_before  # the SD fallback has the worker's core(s) back
    assert [o.token_ids for o in out] == ar_tokens
    assert set(decode_strategies(out)) == {"sd"}
    assert "failed" in caplog.text
    assert_no_children_left()


def test_the_worker_loads_a_named_draft_from_the_engines_cache_dir(target, tmp_path):
    assert LLM(target, cache_dir=tmp_path).config.cache_dir == str(tmp_path)
    config = EngineConfig(target="smollm2-135m", draft="smollm2-135m", strategy="ssd", cache_dir=str(tmp_path))
    recipe = draft_recipe(None, config)  # a packaged alias: the worker loads it itself
    assert (recipe.path, recipe.cache_dir, recipe.state) == ("smollm2-135m", str(tmp_path), None)


def test_a_draft_object_travels_as_its_weights_even_when_its_name_is_loadable(target, tmp_path):
    # A perturbed copy still carries the original's name_or_path; the worker must not reload that.
    draft = noisy_copy(target, 1.0).to(torch.bfloat16)
    draft.config._name_or_path = str(tmp_path)
    with LLM(target, draft, strategy="ssd", speculative=SpeculativeConfig(K=2)) as llm:
        recipe = draft_recipe(llm._draft_given, llm.config)
        config = llm.config
    assert recipe.path is None
    rebuilt = recipe.build(torch.device("cpu"))
    ids = torch.tensor([[1, 2, 3, 4]])
    assert next(rebuilt.parameters()).dtype == torch.bfloat16
    assert torch.equal(rebuilt(ids).logits, draft(ids).logits)
    with pytest.raises(ValueError, match="int8-quantised draft object"):
        draft_recipe(int8_dynamic(noisy_copy(target, 1.0)), config)


@pytest.mark.smoke
def test_smollm2_as_its_own_draft_in_a_worker_process_equals_greedy():
    params = SamplingParams(temperature=0, max_new_tokens=24, stop_on_eos=False)
    prompt = "def fibonacci(n):"
    expected = LLM("smollm2-135m", dtype="float32", chat_template=False).generate(
        [prompt, "The capital of France"], params
    )
    spec = SpeculativeConfig(K=3)
    with LLM(
        "smollm2-135m", "smollm2-135m", strategy="ssd", speculative=spec, dtype="float32", chat_template=False
    ) as llm:
        out = llm.generate([prompt, "The capital of France"], params)
    assert [o.token_ids for o in out] == [o.token_ids for o in expected]
    assert out.metrics.summary()["hit_rate"] > 0.5
    assert multiprocessing.active_children() == []


@pytest.mark.slow
@pytest.mark.timeout(1800)  # fp32 1.5B on two cores: ~10 min for the ten prompts
def test_default_pair_greedy_ssd_equals_ar_on_ten_spec_bench_prompts():
    prompts = [p.text for p in load_prompts("spec_bench", 10)]
    params = SamplingParams(temperature=0, max_new_tokens=32)
    with LLM("qwen-coder-1.5b", dtype="float32") as ar:
        expected = ar.generate(prompts, params)
    with LLM(
        "qwen-coder-1.5b",
        "qwen-coder-0.5b",
        strategy="ssd",
        dtype="float32",
        speculative=SpeculativeConfig(K=3, fanout=(2, 2, 2, 2)),
    ) as llm:
        out = llm.generate(prompts, params)
    assert [o.token_ids for o in out] == [o.token_ids for o in expected]
    summary = out.metrics.summary()
    assert summary["hit_rate"] > 0.3 and out.metrics.acceptance_rate > 0.3  # a real draft, real hits
    assert multiprocessing.active_children() == []

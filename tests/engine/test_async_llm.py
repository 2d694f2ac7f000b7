"""AsyncLLM: the decode loop on its own thread, requests from asyncio that join a running batch,
early exits that abort, a bounded queue, shutdown, and round records for the simulator."""

import asyncio
import json

import pytest

from engine import LLM, AsyncLLM, EngineStopped, QueueFull, SamplingParams
from tests.engine.tiny import tiny_lm

PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11]]
GREEDY = SamplingParams(temperature=0, max_new_tokens=12, stop_on_eos=False)


@pytest.fixture(scope="module")
def target():
    return tiny_lm(0, scale=4.0)


@pytest.fixture(scope="module")
def solo(target):
    llm = LLM(target)
    return [llm.generate([p], GREEDY)[0].token_ids for p in PROMPTS]


async def collect(stream):
    return [c async for c in stream]


def test_concurrent_requests_get_their_solo_outputs_and_rounds_are_recorded(target, solo, tmp_path):
    engine = AsyncLLM(LLM(target, max_num_seqs=4), rounds_path=tmp_path / "rounds.jsonl")

    async def main():
        streams = []
        for i, p in enumerate(PROMPTS):
            streams.append(engine.generate(p, GREEDY, f"r{i}"))
            await asyncio.sleep(0.01)  # later requests join a running batch
        return await asyncio.gather(*(collect(s) for s in streams))

    try:
        results = asyncio.run(main())
        stats = engine.stats()
    finally:
        engine.shutdown(5.0)
    assert [[t for c in chunks for t in c.token_ids] for chunks in results] == solo
    assert stats.requests_finished == 3 and stats.running == 0 and stats.generation_tokens == 36
    records = [json.loads(line) for line in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    assert {"strategy", "batch_size", "verify_ms"} <= set(records[0]) and len(records) >= 12
    assert engine.llm.loop is None  # shutdown closed the LLM


def test_closing_a_stream_early_aborts_its_request(target):
    engine = AsyncLLM(LLM(target))

    async def main():
        stream = engine.generate(PROMPTS[0], SamplingParams(temperature=0, max_new_tokens=200, stop_on_eos=False), "x")
        await stream.__anext__()
        await stream.aclose()
        for _ in range(200):
            if engine.stats().running == 0 and engine.stats().requests_aborted == 1:
                return True
            await asyncio.sleep(0.01)
        return False

    try:
        assert asyncio.run(main())
    finally:
        engine.shutdown(5.0)


def test_a_full_queue_refuses_and_a_stopped_engine_refuses(target):
    llm = LLM(target, max_num_seqs=1)
    engine = AsyncLLM(llm, max_waiting=1)
    long = SamplingParams(temperature=0, max_new_tokens=150, stop_on_eos=False)

    async def main():
        first = engine.generate(PROMPTS[0], long, "a")
        for _ in range(200):  # wait until it runs, so the queue is empty again
            if engine.stats().running == 1:
                break
            await asyncio.sleep(0.01)
        second = engine.generate(PROMPTS[1], long, "b")  # waits
        with pytest.raises(QueueFull):
            engine.generate(PROMPTS[2], long, "c")
        await first.aclose()
        await second.aclose()

    try:
        asyncio.run(main())
    finally:
        engine.shutdown(5.0)

    async def after():
        with pytest.raises(EngineStopped):
            engine.generate(PROMPTS[0], GREEDY, "d")

    asyncio.run(after())


def test_bad_requests_raise_value_error_before_anything_runs(target):
    engine = AsyncLLM(LLM(target))

    async def main():
        with pytest.raises(ValueError, match="exceeds the model's context"):
            engine.generate([1] * 250, SamplingParams(max_new_tokens=50), "a")
        with pytest.raises(ValueError, match="token ids must be in"):
            engine.generate([1, 999], GREEDY, "b")

    try:
        asyncio.run(main())
    finally:
        engine.shutdown(1.0)


def test_the_rounds_file_holds_each_sd_rounds_outcome_ranks(target, tmp_path):
    """A decode record reaches the file once the next round has filled in its outcome's rank, so the served
    rounds carry what the hit model needs (only a row's last round, with nothing after it, lacks it)."""
    from engine import SpeculativeConfig
    from engine.config import DraftPlacement
    from tests.engine.tiny import noisy_copy

    spec = SpeculativeConfig(K=3, placement=DraftPlacement(in_process=True))
    engine = AsyncLLM(
        LLM(target, noisy_copy(target, 1.0), strategy="sd", speculative=spec, max_num_seqs=4),
        rounds_path=tmp_path / "rounds.jsonl",
    )

    async def main():
        return await asyncio.gather(*(collect(engine.generate(p, GREEDY, f"r{i}")) for i, p in enumerate(PROMPTS)))

    try:
        asyncio.run(main())
    finally:
        engine.shutdown(5.0)
    decode = [json.loads(line) for line in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    decode = [r for r in decode if r["phase"] == "decode"]
    assert decode and sum("outcome_rank" in r for r in decode) >= len(decode) - 1
    assert all(len(r["outcome_rank"]) == r["batch_size"] for r in decode if "outcome_rank" in r)

"""The one decode loop under continuous batching: requests join and leave between rounds, each keeps its
own settings and random stream, and gets the tokens it would get alone (greedy, fp32), in AR, SD and SSD."""

from itertools import pairwise

import pytest
import torch

from engine import LLM, SamplingParams, SpeculativeConfig
from engine.config import DraftPlacement
from tests.engine.batching import staggered

PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11], [3, 1, 4, 1, 5, 9, 2, 6]]
GREEDY = SamplingParams(temperature=0, max_new_tokens=14, stop_on_eos=False)
IN_PROCESS = SpeculativeConfig(K=3, placement=DraftPlacement(in_process=True))


def engine(target, draft, strategy, **kwargs):
    if strategy == "ar":
        return LLM(target, **kwargs)
    return LLM(target, draft, strategy=strategy, speculative=IN_PROCESS, **kwargs)


@pytest.mark.parametrize("strategy", ["ar", "sd", "ssd"])
def test_a_request_that_joins_a_running_batch_gets_its_solo_greedy_output(target, draft, solo, strategy):
    with engine(target, draft, strategy) as llm:
        seqs, sizes = staggered(llm, PROMPTS, GREEDY, join_at=[0, 2, 3, 5])
    assert [s.output_ids for s in seqs] == solo
    assert max(sizes) >= 3  # they really shared the batch


@pytest.mark.parametrize("strategy", ["ar", "sd", "ssd"])
def test_max_num_seqs_bounds_the_batch_and_the_rest_waits(target, draft, solo, strategy):
    with engine(target, draft, strategy, max_num_seqs=2) as llm:
        out = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in out] == solo
    assert max(r.batch_size for r in out.metrics.rounds) == 2
    # The third and fourth requests joined as earlier ones left: more than one prefill.
    assert sum(r.phase == "prefill" for r in out.metrics.rounds) >= 2


def test_max_prefill_tokens_splits_admission_and_chunks_a_longer_prompt(target, solo):
    with LLM(target, max_prefill_tokens=6) as llm:
        out = llm.generate(PROMPTS, GREEDY)
    prefills = [r for r in out.metrics.rounds if r.phase == "prefill"]
    # 5 | 2+3 | 8 (alone: longer than the limit, fed in chunks of 6 and 2)
    assert [r.batch_size for r in prefills] == [1, 2, 1, 1]
    assert [(r.tokens, r.context_len) for r in prefills] == [(5, 0), (3, 0), (6, 0), (2, 6)]
    assert [o.token_ids for o in out] == solo


def test_ssd_worker_process_serves_joining_and_leaving_sequences(target, draft, solo):
    spec = SpeculativeConfig(K=3, placement=DraftPlacement(deadline_s=20.0))
    with LLM(target, draft, strategy="ssd", speculative=spec) as llm:
        lengths = [6, 14, 3, 14]  # rows leave at different rounds while others join
        params = [SamplingParams(temperature=0, max_new_tokens=n, stop_on_eos=False) for n in lengths]
        seqs = [llm.make_sequence(list(p), q, index=i) for i, (p, q) in enumerate(zip(PROMPTS, params, strict=True))]
        for step in range(200):
            if step in (0, 1):
                llm.loop.submit(seqs[step])
            if step == 4:
                llm.loop.submit(seqs[2])
                llm.loop.submit(seqs[3])
            llm.loop.step()
            if all(s.finished for s in seqs):
                break
        assert llm.strategy_in_use == "ssd"
        stats = llm.loop.stats
    assert [s.output_ids for s in seqs] == [t[:n] for t, n in zip(solo, lengths, strict=True)]
    assert stats.ssd_lookups > 0 and stats.ssd_hits > 0 and stats.fallbacks == 0


@pytest.mark.parametrize("strategy", ["ar", "sd", "ssd"])
def test_a_seeded_request_samples_the_same_tokens_whatever_its_batch_mates(target, draft, strategy):
    mine = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=10, stop_on_eos=False, seed=123)
    with engine(target, draft, strategy) as llm:
        alone = llm.generate([PROMPTS[0]], mine)[0].token_ids
        others = SamplingParams(temperature=0.7, top_k=5, max_new_tokens=6, stop_on_eos=False, seed=5)
        crowd = llm.generate([PROMPTS[1], PROMPTS[0], PROMPTS[2]], [others, mine, others])
    # Every draw of a row (the target's u, its bonus, the draft's samples) comes from that row's own streams.
    assert crowd[1].token_ids == alone


def test_rows_of_one_call_sharing_a_seed_get_different_streams(target):
    params = SamplingParams(temperature=1.0, max_new_tokens=12, stop_on_eos=False, seed=7)
    out = LLM(target).generate([PROMPTS[0]] * 4, params)
    assert len({tuple(o.token_ids) for o in out}) > 1
    again = LLM(target).generate([PROMPTS[0]] * 4, params)
    assert [o.token_ids for o in again] == [o.token_ids for o in out]  # and the call is reproducible


@pytest.mark.parametrize("strategy", ["ar", "sd", "ssd"])
def test_streamed_chunks_add_up_to_the_output_one_chunk_per_round(target, draft, strategy):
    with engine(target, draft, strategy) as llm:
        chunks = list(llm.stream(PROMPTS[:2], GREEDY))
        whole = llm.generate(PROMPTS[:2], GREEDY)
    for i in range(2):
        mine = [c for c in chunks if c.index == i]
        assert [t for c in mine for t in c.token_ids] == whole[i].token_ids
        assert [c.finished for c in mine] == [False] * (len(mine) - 1) + [True]
        assert mine[-1].finish_reason == "length" and mine[-1].output_tokens == 14
        assert all(a.time_s <= b.time_s for a, b in pairwise(mine))
    if strategy != "ar":  # a speculative round emits several tokens in one chunk
        assert max(len(c.token_ids) for c in chunks) > 1
    m = whole[0].metrics
    assert len(m.summary()["itl_s"]) == m.summary()["chunks"] - 1 and min(m.summary()["itl_s"]) > 0
    assert m.tpot_s == pytest.approx((m.e2el_s - m.ttft_s) / (m.new_tokens - 1))


def test_leaving_a_stream_early_aborts_and_frees_the_row(target, draft):
    with engine(target, draft, "sd") as llm:
        stream = llm.stream(PROMPTS[:2], GREEDY)
        next(stream)
        stream.close()
        assert llm.loop.running == [] and not llm.loop.has_work
        again = llm.generate(PROMPTS[:1], GREEDY)  # the engine goes on
    assert len(again[0].token_ids) == 14


def test_abort_of_a_running_request_frees_its_row_and_ends_its_stream(target, draft):
    with engine(target, draft, "ssd") as llm:
        a = llm.make_sequence(PROMPTS[0], GREEDY, request_id="a")
        b = llm.make_sequence(PROMPTS[1], GREEDY, request_id="b")
        llm.loop.submit(a)
        llm.loop.submit(b)
        llm.loop.step()
        llm.loop.abort("a")
        chunks = llm.loop.step()
        assert a.finish_reason == "abort" and [c.finish_reason for c in chunks if c.request_id == "a"] == ["abort"]
        assert [s.request_id for s in llm.loop.running] == ["b"]
        while llm.loop.has_work:
            llm.loop.step()
        assert llm.loop.stats.requests_aborted == 1 and llm.loop.stats.requests_finished == 1


@pytest.mark.parametrize("strategy", ["ar", "sd", "ssd"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_logprobs_are_the_models_own_log_softmax_whatever_the_temperature(target, draft, strategy, temperature):
    params = SamplingParams(temperature=temperature, top_k=20, max_new_tokens=8, stop_on_eos=False, seed=3, logprobs=3)
    with engine(target, draft, strategy) as llm:
        out = llm.generate([PROMPTS[0]], params)[0]
    ids = PROMPTS[0] + out.token_ids
    with torch.inference_mode():
        raw = torch.log_softmax(target(torch.tensor([ids])).logits[0].double(), dim=-1)  # [T, V]: a direct forward
    for i, lp in enumerate(out.logprobs):
        pos = len(PROMPTS[0]) - 1 + i
        assert lp.token_id == out.token_ids[i]
        assert lp.logprob == pytest.approx(float(raw[pos, lp.token_id]), abs=1e-4) and lp.logprob < 0
        top = torch.topk(raw[pos], 3)
        assert [t for t, _ in lp.top] == top.indices.tolist()
        assert [v for _, v in lp.top] == pytest.approx(top.values.tolist(), abs=1e-4)


@pytest.mark.parametrize("strategy", ["ar", "sd", "ssd"])
def test_processed_logprobs_are_the_targets_warped_log_probabilities(target, draft, strategy):
    from engine.sampling import warp
    from engine.sampling_params import LogprobsMode

    params = SamplingParams(
        temperature=0.8,
        top_k=20,
        max_new_tokens=8,
        stop_on_eos=False,
        seed=3,
        logprobs=3,
        logprobs_mode=LogprobsMode.PROCESSED,
    )
    with engine(target, draft, strategy) as llm:
        out = llm.generate([PROMPTS[0]], params)[0]
    assert len(out.logprobs) == len(out.token_ids) == 8
    ids = PROMPTS[0] + out.token_ids
    with torch.inference_mode():
        p = warp(target(torch.tensor([ids])).logits[0].double(), params)  # [T, V]
    for i, lp in enumerate(out.logprobs):
        pos = len(PROMPTS[0]) - 1 + i
        assert lp.token_id == out.token_ids[i]
        assert lp.logprob == pytest.approx(float(p[pos, lp.token_id].log()), abs=1e-4)
        top = torch.topk(p[pos], 3)
        assert [t for t, _ in lp.top] == top.indices.tolist()
        assert [v for _, v in lp.top] == pytest.approx(top.values.log().tolist(), abs=1e-4)


def test_stop_token_ids_end_the_output_and_keep_the_token(target, solo):
    stop = solo[0][4]
    params = SamplingParams(temperature=0, max_new_tokens=14, stop_on_eos=False, stop_token_ids=(stop,))
    out = LLM(target).generate([PROMPTS[0]], params)[0]
    assert out.token_ids == solo[0][: solo[0].index(stop) + 1] and out.finish_reason == "stop"


@pytest.mark.parametrize("strategy", ["ar", "sd", "ssd"])
def test_a_joiners_first_token_streams_from_the_prefill_step_before_any_round(target, draft, strategy):
    # TTFT: the step that prefills returns the first tokens at once; served streams waited a whole round before
    with engine(target, draft, strategy) as llm:
        a = llm.make_sequence(PROMPTS[0], GREEDY, request_id="a")
        llm.loop.submit(a)
        first = llm.loop.step()
        assert [(c.request_id, len(c.token_ids)) for c in first] == [("a", 1)]  # the prefill's token, no round
        records = llm.loop.recorder.count  # records so far (the prefill's)
        b = llm.make_sequence(PROMPTS[1], GREEDY, request_id="b")
        llm.loop.submit(b)
        second = llm.loop.step()  # a round for "a" before "b" is admitted: joiners cannot starve running rows
        assert {c.request_id for c in second} == {"a"} and llm.loop.recorder.count == records + 1
        third = llm.loop.step()
        assert [(c.request_id, len(c.token_ids)) for c in third] == [("b", 1)]
        while llm.loop.has_work:
            llm.loop.step()
    assert a.finish_reason == b.finish_reason == "length"

"""Serving limits of the decode loop: a long prompt is fed in chunks between the rounds of the running rows
(chunked prefill), min_tokens holds back the tokens that would end a row, and admission counts free rows."""

import pytest

from engine import LLM, SamplingParams, SpeculativeConfig
from engine.config import DraftPlacement
from engine.decode_loop import QueueFull
from tests.engine.tiny import noisy_copy

SHORT = [1, 2, 3]
LONG = [(7 * i + 3) % 50 for i in range(40)]  # 40 prompt tokens: five chunks of 8
CHUNK = 8
GREEDY = SamplingParams(temperature=0, max_new_tokens=24, stop_on_eos=False)
IN_PROCESS = SpeculativeConfig(K=3, placement=DraftPlacement(in_process=True))


@pytest.fixture(scope="module")
def solo(target):
    llm = LLM(target)
    return {name: llm.generate([p], GREEDY)[0].token_ids for name, p in (("short", SHORT), ("long", LONG))}


def engine(target, draft, strategy, **kwargs):
    if strategy == "ar":
        return LLM(target, **kwargs)
    return LLM(target, draft, strategy=strategy, speculative=IN_PROCESS, **kwargs)


@pytest.mark.parametrize("strategy", ["ar", "sd", "ssd"])
def test_a_long_prompt_is_fed_a_chunk_a_step_while_the_running_row_gets_a_round_each_step(
    target, draft, solo, strategy
):
    with engine(target, draft, strategy, max_prefill_tokens=CHUNK) as llm:
        running = llm.make_sequence(SHORT, GREEDY, request_id="running")
        llm.loop.submit(running)
        llm.loop.step()  # its prefill
        llm.loop.step()  # its first round: the next step may admit
        llm.loop.submit(joiner := llm.make_sequence(LONG, GREEDY, request_id="joiner"))
        steps = []
        while not joiner.output_ids:
            steps.append([c.request_id for c in llm.loop.step()])
            assert len(steps) < 20
        while llm.loop.has_work:
            llm.loop.step()
    assert len(steps) == len(LONG) // CHUNK
    assert all(ids == ["running"] for ids in steps[:-1])  # every chunk but the last: a round of the running row
    assert steps[-1] == ["joiner"]  # the last chunk streams the first token at once
    assert running.output_ids == solo["short"] and joiner.output_ids == solo["long"]


def test_a_chunked_prompt_is_recorded_chunk_by_chunk(target):
    with LLM(target, max_prefill_tokens=CHUNK) as llm:
        out = llm.generate([LONG], GREEDY)
    prefills = [r for r in out.metrics.rounds if r.phase == "prefill"]
    assert [(r.tokens, r.context_len) for r in prefills] == [(CHUNK, CHUNK * i) for i in range(len(LONG) // CHUNK)]


def test_an_abort_during_a_chunked_prefill_ends_the_request_and_frees_the_loop(target):
    with LLM(target, max_prefill_tokens=CHUNK) as llm:
        seq = llm.make_sequence(LONG, GREEDY, request_id="a")
        llm.loop.submit(seq)
        llm.loop.step()  # the first chunk
        llm.loop.abort("a")
        chunks = llm.loop.step()
        assert [(c.request_id, c.finish_reason) for c in chunks] == [("a", "abort")]
        assert not llm.loop.has_work and llm.loop.prefilling is None


def test_min_tokens_holds_back_eos_and_stop_tokens_until_reached(target, solo):
    stop = solo["short"][2]  # greedy would stop at its third token
    without = LLM(target).generate(
        [SHORT], SamplingParams(temperature=0, max_new_tokens=12, stop_on_eos=False, stop_token_ids=(stop,))
    )[0]
    held = LLM(target).generate(
        [SHORT],
        SamplingParams(temperature=0, max_new_tokens=12, stop_on_eos=False, stop_token_ids=(stop,), min_tokens=6),
    )[0]
    assert len(without.token_ids) == 3 and without.finish_reason == "stop"
    assert stop not in held.token_ids[:6] and len(held.token_ids) >= 6


@pytest.mark.parametrize("strategy", ["sd", "ssd"])
def test_min_tokens_greedy_speculation_gives_the_ar_tokens(target, draft, solo, strategy):
    params = SamplingParams(
        temperature=0, max_new_tokens=12, stop_on_eos=False, stop_token_ids=(solo["short"][2],), min_tokens=6
    )
    reference = LLM(target).generate([SHORT], params)[0].token_ids
    with engine(target, draft, strategy) as llm:
        assert llm.generate([SHORT], params)[0].token_ids == reference


def test_min_tokens_above_max_new_tokens_is_refused():
    with pytest.raises(ValueError, match="min_tokens must be an integer in 0..max_new_tokens"):
        SamplingParams(max_new_tokens=4, min_tokens=5)


def test_a_burst_fills_the_free_rows_before_the_waiting_places(target):
    llm = LLM(target, max_num_seqs=4, max_waiting=8)
    seqs = [llm.make_sequence(SHORT, GREEDY, request_id=f"r{i}") for i in range(13)]
    for seq in seqs[:12]:  # 4 free rows and 8 waiting places: none is refused
        llm.loop.submit(seq)
    with pytest.raises(QueueFull):
        llm.loop.submit(seqs[12])


def test_rows_in_use_are_not_free_for_a_burst(target):
    llm = LLM(target, max_num_seqs=2, max_waiting=1)
    for i in range(2):
        llm.loop.submit(llm.make_sequence(SHORT, GREEDY, request_id=f"running{i}"))
    llm.loop.step()  # both rows taken
    llm.loop.submit(llm.make_sequence(SHORT, GREEDY, request_id="waiting"))
    with pytest.raises(QueueFull):
        llm.loop.submit(llm.make_sequence(SHORT, GREEDY, request_id="refused"))


def test_accepted_tokens_are_counted_as_emitted_so_never_more_than_generated(target):
    # The draft is the target: every draft token is accepted, but max_new_tokens=2 keeps one token of the round.
    with LLM(target, noisy_copy(target, 0.0), strategy="sd", speculative=SpeculativeConfig(K=3)) as llm:
        llm.generate([SHORT], SamplingParams(temperature=0, max_new_tokens=2, stop_on_eos=False))
        stats = llm.loop.stats
    assert (stats.generation_tokens, stats.accepted) == (2, 1)
    assert (stats.drafts, stats.draft_tokens, stats.accepted_per_position) == (1, 3, (1, 0, 0))

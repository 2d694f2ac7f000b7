"""The draft worker prefills joining prompts while the target prefills them (a PREFILL message, no answer).

The Round that brings the joiners then takes their draft KV from that prefill instead of prefilling on the
target's critical path. It is used only when it holds every joiner with the same prompt (announced prompts
that finished at their first token are dropped); anything else is prefilled with the Round. The draft's KV is the
same either way, so the speculations are too.
"""

import pytest
import torch

from engine import LLM, SamplingParams, SpeculativeConfig
from engine.config import DraftPlacement
from engine.ssd.draft_worker import DraftWorker
from engine.ssd.messages import Join, MalformedMessage, Prefill, Round, decode, encode
from tests.engine.tiny import noisy_copy, tiny_lm

V = 50


def test_a_prefill_message_round_trips_and_is_checked():
    sent = Prefill([4, 9], [[1, 2, 3], [7]], V)
    back = decode(encode(sent))
    assert (back.seq_ids, back.prompts, back.V) == ([4, 9], [[1, 2, 3], [7]], V)
    tensors = encode(Prefill([4], [[1, 2]], V))
    tensors[1][1] = 3  # a length that the tokens do not fill
    with pytest.raises(MalformedMessage, match="PREFILL"):
        decode(tensors)
    with pytest.raises(MalformedMessage, match="PREFILL"):
        decode(encode(Prefill([4], [[1, V]], V)))  # a token outside the vocabulary


def counted_prefills(monkeypatch) -> list[int]:
    """Rows the draft prefilled, per prefill forward."""
    seen: list[int] = []
    prefill = DraftWorker._prefill_prompts

    def counted(self, prompts):
        seen.append(len(prompts))
        return prefill(self, prompts)

    monkeypatch.setattr(DraftWorker, "_prefill_prompts", counted)
    return seen


def join(seq_id: int, prompt: list[int], pending: int) -> Join:
    return Join(seq_id, prompt, pending, 0.0, 0, 1.0, 100 + seq_id)


PROMPTS = {1: [1, 2, 3, 4], 2: [5, 6], 3: [7, 8, 9]}


def answer(target, joins, announce=None):
    worker = DraftWorker(target, SpeculativeConfig(K=3), 0, torch.device("cpu"))
    if announce is not None:
        worker.prefill_ahead(Prefill(list(announce), [announce[i] for i in announce], V))
    return worker.respond(Round(0, [], [], [], 0.0, joins, K=3, V=V))


@pytest.mark.parametrize(
    "announced, prefills",
    [
        ([1, 2, 3], [3]),  # every announced prompt joins: one prefill, ahead
        ([3, 1, 2], [3]),  # in another order: its rows are picked
        ([1, 2], [2, 2]),  # a joiner was not announced: both joiners prefilled anew
    ],
)
def test_the_round_takes_the_announced_prefill_when_it_holds_every_joiner(monkeypatch, announced, prefills):
    target = tiny_lm(0, vocab_size=V)
    joins = [join(1, PROMPTS[1], 11), join(3, PROMPTS[3], 12)]  # 2 was announced and finished at its first token
    expected = answer(target, joins)
    seen = counted_prefills(monkeypatch)
    got = answer(target, joins, {i: PROMPTS[i] for i in announced})
    assert seen == prefills
    assert torch.equal(got.tokens, expected.tokens)
    assert torch.allclose(got.q.dense(), expected.q.dense(), atol=1e-5)


def test_a_changed_prompt_is_prefilled_again_and_an_unused_prefill_is_dropped(monkeypatch):
    target = tiny_lm(0, vocab_size=V)
    seen = counted_prefills(monkeypatch)
    answer(target, [join(1, PROMPTS[1] + [5], 11)], {1: PROMPTS[1]})
    assert seen == [1, 1]  # announced, then prefilled again: the prompt differs
    worker = DraftWorker(target, SpeculativeConfig(K=3), 0, torch.device("cpu"))
    worker.respond(Round(0, [], [], [], 0.0, [join(1, PROMPTS[1], 11)], K=3, V=V))
    worker.build_cache()
    worker.prefill_ahead(Prefill([2], [PROMPTS[2]], V))
    worker.respond(Round(1, [0], [4], [True], 1.0, [], K=3, V=V))  # nobody joined: the announced prefill goes
    assert worker.prefilled is None


def test_greedy_ssd_with_announced_joiners_equals_ar_and_prefills_each_batch_once(monkeypatch):
    target = tiny_lm(0, scale=3.0)
    draft = noisy_copy(target, 0.5)
    prompts = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11], [12, 13]]
    params = [SamplingParams(temperature=0.0, max_new_tokens=n, stop_on_eos=False) for n in (20, 1, 15, 1)]
    with LLM(target, strategy="ar") as llm:
        expected = [o.token_ids for o in llm.generate(prompts, params).outputs]
    seen = counted_prefills(monkeypatch)
    spec = SpeculativeConfig(K=3, placement=DraftPlacement(in_process=True))
    with LLM(target, draft, strategy="ssd", speculative=spec, max_num_seqs=2) as llm:
        out = llm.generate(prompts, params)
    assert [o.token_ids for o in out.outputs] == expected
    prefill_rounds = [r for r in out.metrics.rounds if r.phase == "prefill"]
    assert len(seen) == len(prefill_rounds)  # each announced batch prefilled once, never again at its round
    assert sum(seen) == len(prompts)

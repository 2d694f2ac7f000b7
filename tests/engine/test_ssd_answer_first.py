"""An all-hit round is answered before the draft's KV is rebuilt from the hit branches.

The answer to a round where every row hit is the cached branches, so the worker sends it first and rebuilds
its KV (fork, concat, select) after, at the start of the next cache build: that work is off the target's
critical path. A round with a miss or a joiner needs the KV for its backup or prefill, so it rebuilds first.
The tokens must not change either way (greedy SSD equals AR).
"""

from engine import LLM, SamplingParams, SpeculativeConfig
from engine.blocks import BlockState
from engine.config import DraftPlacement
from engine.kv_cache import KVState
from engine.ssd import draft_worker
from tests.engine.tiny import noisy_copy, tiny_lm

PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11]]


def spy(monkeypatch) -> list[tuple[int, list[bool], int]]:
    """Per answer: the forks of a KV state made while answering, which rows hit, and how many joined."""
    forks = [0]
    seen: list[tuple[int, list[bool], int]] = []
    respond = draft_worker.DraftWorker.respond

    def counting(fork):
        def counted_fork(self, rows):
            forks[0] += 1
            return fork(self, rows)

        return counted_fork

    def watched_respond(self, msg):
        before = forks[0]
        reply = respond(self, msg)
        seen.append((forks[0] - before, reply.hits, len(msg.joins)))
        return reply

    for kind in (KVState, BlockState):  # a model object's KV (tests), or the engine's own block cache
        monkeypatch.setattr(kind, "fork", counting(kind.fork))
    monkeypatch.setattr(draft_worker.DraftWorker, "respond", watched_respond)
    return seen


def run(target, draft, params):
    spec = SpeculativeConfig(K=3, fanout=(2, 1, 1, 2), placement=DraftPlacement(in_process=True))
    with LLM(target, draft, strategy="ssd", speculative=spec) as llm:
        return [o.token_ids for o in llm.generate(PROMPTS, params).outputs]


def test_an_all_hit_answer_touches_no_kv_and_a_miss_rebuilds_it_first(monkeypatch):
    target = tiny_lm(0, scale=3.0)
    draft = noisy_copy(target, 0.5)
    params = SamplingParams(temperature=0.0, max_new_tokens=40, stop_on_eos=False)
    with LLM(target, strategy="ar") as llm:
        expected = [o.token_ids for o in llm.generate(PROMPTS, params).outputs]
    seen = spy(monkeypatch)
    assert run(target, draft, params) == expected

    all_hit = [forks for forks, hits, joins in seen if hits and all(hits) and not joins]
    other = [forks for forks, hits, joins in seen if not (hits and all(hits)) or joins]
    assert len(all_hit) >= 3 and len(other) >= 3, seen  # both kinds of round happened
    assert all(forks == 0 for forks in all_hit), seen
    assert all(forks >= 1 for forks in other), seen

"""Where the verified bonus stood in the draft's ranking: the measurement behind the empirical hit model.

A fan-out F_k holds the outcome (k, t*) iff t*'s rank is below F_k, so (1) the rank must agree with the
guesses the cache really makes, (2) in SSD runs every recorded hit must be exactly `rank < F_k`, and
(3) an SD run must record the same ranks as an SSD run that drafts the same tokens (greedy, fp32).
"""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import LLM, SamplingParams, SpeculativeConfig
from engine.config import DraftPlacement
from engine.drafting import bonus_ranks
from engine.ssd.speculation_cache import guesses
from tests.engine.tiny import noisy_copy, tiny_lm

PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11]]
FANOUT = (2, 1, 1, 3)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_a_guess_is_made_exactly_for_the_tokens_ranked_below_the_fanout(data):
    B, K, V = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3)), data.draw(st.integers(2, 9))
    # Small integer logits: ties are common, and must break the way the cache's top-k breaks them.
    values = data.draw(st.lists(st.integers(-2, 2), min_size=B * (K + 1) * V, max_size=B * (K + 1) * V))
    logits = torch.tensor(values, dtype=torch.float32).reshape(B, K + 1, V)
    x = torch.tensor(data.draw(st.lists(st.integers(0, V - 1), min_size=B * K, max_size=B * K))).reshape(B, K)
    fanouts = [tuple(data.draw(st.lists(st.integers(0, V), min_size=K + 1, max_size=K + 1))) for _ in range(B)]
    row, k, t = guesses(logits, x, fanouts)
    made = set(zip(row.tolist(), k.tolist(), t.tolist(), strict=True))
    for b in range(B):
        for kk in range(K + 1):
            excluded = int(x[b, kk]) if kk < K else -1
            bonus = torch.arange(V)
            ranks = bonus_ranks(logits[b, kk].expand(V, V), bonus, torch.full((V,), excluded))
            for token, rank in enumerate(ranks):
                assert ((b, kk, token) in made) == (rank < fanouts[b][kk]), (b, kk, token, rank)
            kept = sorted(r for r in ranks if r < V)
            assert kept == list(range(len(kept)))  # a ranking: 0, 1, 2, ... over the tokens that can be guessed


def test_the_rejected_token_is_never_a_guess():
    logits = torch.tensor([[3.0, 2.0, 1.0]])
    assert bonus_ranks(logits, torch.tensor([0]), torch.tensor([0])) == [3]
    assert bonus_ranks(logits, torch.tensor([1]), torch.tensor([0])) == [0]  # x ranked first is skipped
    assert bonus_ranks(logits, torch.tensor([1]), torch.tensor([-1])) == [1]


def records(target, draft, strategy, params, fanout=FANOUT):
    spec = SpeculativeConfig(K=3, fanout=fanout, placement=DraftPlacement(in_process=True))
    with LLM(target, draft, strategy=strategy, speculative=spec) as llm:
        out = llm.generate(PROMPTS, params)
    return [r for r in out.metrics.rounds if r.phase == "decode"]


def test_every_ssd_hit_is_exactly_a_rank_below_the_fanout():
    target = tiny_lm(0, scale=3.0)
    draft = noisy_copy(target, 0.8)
    params = SamplingParams(temperature=0.8, max_new_tokens=30, stop_on_eos=False, seed=3)
    rows, seen, decode = 0, set(), records(target, draft, "ssd", params)
    assert decode[-1].outcome_rank is None  # no round came after the last one to tell
    for r in decode[:-1]:
        assert r.outcome_rank is not None and len(r.outcome_rank) == r.batch_size
        for k, hit, rank in zip(r.accepted, r.outcome_hit or [None] * r.batch_size, r.outcome_rank, strict=True):
            if hit is None:
                continue
            assert hit == (rank < FANOUT[k])
            rows += 1
            seen.add(hit)
    assert rows > 20 and seen == {True, False}


def test_an_sd_run_records_the_ranks_an_ssd_run_sees():
    target = tiny_lm(0, scale=3.0)
    draft = noisy_copy(target, 0.8)
    greedy = SamplingParams(temperature=0, max_new_tokens=24, stop_on_eos=False)
    sd, ssd = records(target, draft, "sd", greedy), records(target, draft, "ssd", greedy)
    assert [r.accepted for r in sd] == [r.accepted for r in ssd]  # same speculations, same outcomes
    pairs = [
        (a, b)
        for r, s in zip(sd[:-1], ssd[:-1], strict=True)
        for a, b in zip(r.outcome_rank, s.outcome_rank, strict=True)
    ]
    # SD learns an all-accepted outcome's rank one round late, so not for a row that finished then
    assert all(a == b for a, b in pairs if a is not None) and sum(a is None for a, _ in pairs) <= len(PROMPTS)
    assert len({a for a, _ in pairs}) > 2
    # late ranks too
    assert any(k == 3 for r in sd for k, x in zip(r.accepted, r.outcome_rank, strict=True) if x is not None)

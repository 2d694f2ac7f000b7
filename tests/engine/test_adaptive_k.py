"""Adaptive K and the confidence stop in SD: greedy outputs are the AR outputs, and K follows α; a row that joins
starts from the α of the rows before it (the first ever from the prior)."""

from dataclasses import replace

import numpy as np
import pytest

from engine import LLM, SamplingParams, SpeculativeConfig
from engine.config import AUTO_K_MAX, DraftPlacement, EngineConfig
from engine.strategies.lookahead import Lookahead, SSDLookahead
from theory.adaptive import JOIN_OBSERVATIONS, acceptance_estimate, best_K
from tests.engine.tiny import noisy_copy, tiny_lm

# Fixtures target and ar_tokens (conftest.py): the tiny target, and greedy AR's tokens for PROMPTS under GREEDY.
PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15, 16]]
GREEDY = SamplingParams(temperature=0, max_new_tokens=30, stop_on_eos=False)


def decode_Ks(out) -> list[int]:
    return [r.K for r in out.metrics.rounds if r.phase == "decode"]


def test_K_auto_is_adaptive_with_the_default_maximum():
    spec = SpeculativeConfig(K="auto")
    assert spec.adaptive and spec.K == AUTO_K_MAX


@pytest.mark.parametrize("spec", [
    SpeculativeConfig(K="auto"),  # measured timings
    SpeculativeConfig(K=6, adaptive=True, draft_cost=0.05),
    SpeculativeConfig(K=6, confidence_stop=0.6),
    SpeculativeConfig(K=6, adaptive=True, draft_cost=0.05, confidence_stop=0.6),
], ids=["auto", "adaptive", "confidence stop", "both"])
def test_greedy_sd_with_a_varying_K_equals_ar(target, ar_tokens, spec):
    draft = noisy_copy(target, noise=1.0)
    out = LLM(target, draft, strategy="sd", speculative=spec).generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in out] == ar_tokens
    assert all(1 <= K <= spec.K for K in decode_Ks(out))


def test_K_reaches_the_maximum_when_the_draft_is_the_target(target, ar_tokens):
    spec = SpeculativeConfig(K=6, adaptive=True, draft_cost=0.05)
    out = LLM(target, target, strategy="sd", speculative=spec).generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in out] == ar_tokens
    Ks = decode_Ks(out)
    assert Ks[0] < 6 and Ks[-1] == 6  # starts from the prior α = 1/2, grows as every token is accepted


def test_K_drops_to_the_minimum_with_a_draft_that_never_agrees(target, ar_tokens):
    draft = tiny_lm(5, scale=4.0)  # an unrelated model: greedy drafts are almost never the target's argmax
    spec = SpeculativeConfig(K=6, K_min=1, adaptive=True, draft_cost=0.05)
    out = LLM(target, draft, strategy="sd", speculative=spec).generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in out] == ar_tokens
    assert decode_Ks(out)[-1] == 1


def test_K_follows_the_draft_cost(target):
    # Same acceptance, dearer drafting: shorter blocks.
    def last_K(cost):
        spec = SpeculativeConfig(K=8, adaptive=True, draft_cost=cost)
        return decode_Ks(LLM(target, target, strategy="sd", speculative=spec).generate(PROMPTS, GREEDY))[-1]

    assert last_K(0.5) < last_K(0.01)


def test_confidence_stop_shortens_blocks(target, ar_tokens):
    draft = noisy_copy(target, noise=1.0)
    out = LLM(target, draft, strategy="sd", speculative=SpeculativeConfig(K=6, confidence_stop=0.99)) \
        .generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in out] == ar_tokens
    Ks = decode_Ks(out)
    assert min(Ks) < 6
    assert all(r.draft_forwards == r.K + (r.K < 6) for r in out.metrics.rounds if r.phase == "decode")


def test_settings_are_checked():
    with pytest.raises(ValueError, match="K_min"):
        SpeculativeConfig(K=3, K_min=4)
    with pytest.raises(ValueError, match="confidence_stop"):
        SpeculativeConfig(confidence_stop=0.0)
    with pytest.raises(ValueError, match="draft_cost"):
        SpeculativeConfig(draft_cost=-1.0)
    with pytest.raises(ValueError, match="sd only"):
        EngineConfig(target="t", draft="d", strategy="ssd", speculative=SpeculativeConfig(K=4, confidence_stop=0.5))


# A joining row starts from what the engine has already seen (theory.adaptive.joining_counts).
# Timings as measured for the int4 target on HumanEval: 44 ms per draft token, the verify in verify_line.
DRAFT_MS = 44.0


def verify_line(width: int) -> float:
    """The verify's time (ms) at a block width: 153/179/207 at widths 2/3/4, a straight line beyond."""
    return 99.0 + 27.0 * width


def serve(lookahead: Lookahead, accepted, rounds: int) -> list[int]:
    """`rounds` rounds over the lookahead's rows, row b accepting accepted(K)[b] of the K chosen; the Ks."""
    Ks = []
    for _ in range(rounds):
        K = lookahead.choose()
        lookahead.drafted(K, K * DRAFT_MS)
        lookahead.observe(accepted(K), K, verify_line(K + 1))
        Ks.append(K)
    return Ks


def joins_after_high_acceptance(lookahead: Lookahead, rounds: int = 20) -> int:
    """Two rows that accept every draft token, then a new row alone: the K chosen for its first round."""
    lookahead.admit(2)
    serve(lookahead, lambda K: [K, K], rounds)
    lookahead.retire([])
    lookahead.admit(1)
    return lookahead.choose()


def test_the_first_rows_ever_start_at_the_prior():
    spec = SpeculativeConfig(K=8, adaptive=True, draft_cost=0.05)
    lookahead = Lookahead(spec)
    lookahead.admit(3)
    assert lookahead.alphas().tolist() == [0.5] * 3
    assert lookahead.choose() == best_K([0.5] * 3, 0.05, 1.0, K_max=8)


class PriorStart:
    """Mixed into a lookahead: every row starts at the prior, as before the pool (the baseline)."""

    def admit(self, n: int) -> None:
        self.pooled = (0.0, 0.0)
        super().admit(n)


@pytest.mark.parametrize("proposer", [Lookahead, SSDLookahead])
def test_a_row_joining_after_high_acceptance_starts_above_the_prior(proposer):
    spec = SpeculativeConfig(K="auto")
    at_the_prior = type("AtThePrior", (PriorStart, proposer), {})(spec)  # the same rounds, the same timings
    assert joins_after_high_acceptance(proposer(spec)) > joins_after_high_acceptance(at_the_prior)
    assert at_the_prior.alphas().tolist() == [0.5]


def test_a_joining_rows_start_is_bounded_so_its_own_rounds_take_over():
    lookahead = Lookahead(SpeculativeConfig(K="auto"))
    start = joins_after_high_acceptance(lookahead, rounds=40)
    assert start >= 3
    assert lookahead.accepted[0] + lookahead.rejected[0] == pytest.approx(JOIN_OBSERVATIONS)
    assert lookahead.alphas()[0] == pytest.approx(lookahead.joining_alpha()) and lookahead.joining_alpha() > 0.9
    # The newcomer accepts nothing: its K falls after one round, its α below ½ within ten.
    assert serve(lookahead, lambda K: [0], 1) == [start] and lookahead.choose() < start
    serve(lookahead, lambda K: [0], 9)
    assert lookahead.alphas()[0] < 0.5


def test_the_pooled_counts_forget():
    lookahead = Lookahead(SpeculativeConfig(K="auto"))
    joins_after_high_acceptance(lookahead, rounds=40)
    high, (accepted, _) = lookahead.joining_alpha(), lookahead.pooled
    serve(lookahead, lambda K: [0], 300)  # then a workload whose rows accept nothing
    assert high > 0.9 and lookahead.pooled[0] < accepted / 100
    assert lookahead.joining_alpha() == pytest.approx(1 / (2 + JOIN_OBSERVATIONS))  # the lowest it can start at
    lookahead.retire([])
    lookahead.admit(1)
    assert lookahead.choose() < 3


def test_a_row_joins_a_running_engine_at_a_longer_K_and_stays_exact(target):
    prompt, spec = [[3, 4, 5, 6]], SpeculativeConfig(K=6, adaptive=True, draft_cost=0.05)
    expected = [o.token_ids for o in LLM(target).generate(prompt, GREEDY)]
    for strategy, extra in [("sd", {}), ("ssd", {"placement": DraftPlacement(in_process=True)})]:
        llm = LLM(target, target, strategy=strategy, speculative=replace(spec, **extra))
        first = decode_Ks(llm.generate(PROMPTS, GREEDY))[0]
        out = llm.generate(prompt, GREEDY)
        assert [o.token_ids for o in out] == expected
        assert decode_Ks(out)[0] > first, strategy


def replay(lookahead: Lookahead, streams: list[list[bool]]) -> list[int]:
    """Every K the lookahead chooses when each stream (one request's per-position acceptances, in order) is
    served after the one before: a round of K accepts the stream's leading run, up to K, and goes on after the
    first rejection. Timings: DRAFT_MS per draft token, verify_line."""
    Ks = []
    for stream in streams:
        lookahead.admit(1)
        at = 0
        while at < len(stream):
            K = lookahead.choose()
            window = stream[at:at + K]
            k = next((i for i, ok in enumerate(window) if not ok), len(window))
            at += k + (k < len(window))
            lookahead.drafted(K, K * DRAFT_MS)
            lookahead.observe([k], K, verify_line(K + 1))
            Ks.append(K)
        lookahead.retire([])
    return Ks


def streams_from_rounds(accepted: list[list[int]], K: int) -> list[list[bool]]:
    """Per request, its rounds' accepted counts at a constant K as per-position acceptances."""
    return [[ok for k in request for ok in [True] * k + [False] * (k < K)] for request in accepted]


def test_a_replay_of_high_acceptance_runs_fewer_short_rounds_than_starting_at_the_prior():
    rng = np.random.default_rng(0)
    # 8 requests of 30 rounds at K = 3, nearly all accepting all three (as on HumanEval: α ≈ 0.97).
    accepted = [rng.choice([3, 2, 1, 0], size=30, p=[0.94, 0.03, 0.02, 0.01]).tolist() for _ in range(8)]
    streams = streams_from_rounds(accepted, K=3)
    before = replay(type("AtThePrior", (PriorStart, Lookahead), {})(SpeculativeConfig(K="auto")), streams)
    after = replay(Lookahead(SpeculativeConfig(K="auto")), streams)
    short_before, short_after = sum(K <= 2 for K in before), sum(K <= 2 for K in after)
    assert short_after < short_before / 2
    assert len(after) < len(before)  # the same tokens in fewer rounds

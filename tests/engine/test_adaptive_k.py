"""Adaptive K and the confidence stop in SD: greedy outputs are the AR outputs, and K follows α."""

import pytest

from engine import LLM, SamplingParams, SpeculativeConfig
from engine.config import AUTO_K_MAX, EngineConfig
from engine.strategies.lookahead import Lookahead
from tests.engine.tiny import noisy_copy, tiny_lm

# Fixtures target and ar_tokens (conftest.py): the tiny target, and greedy AR's tokens for PROMPTS under GREEDY.
PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15, 16]]
GREEDY = SamplingParams(temperature=0, max_new_tokens=30, stop_on_eos=False)


def decode_Ks(out) -> list[int]:
    return [r.K for r in out.metrics.rounds if r.phase == "decode"]


def test_K_auto_is_adaptive_with_the_default_maximum():
    spec = SpeculativeConfig(K="auto")
    assert spec.adaptive and spec.K == AUTO_K_MAX


@pytest.mark.parametrize(
    "spec",
    [
        SpeculativeConfig(K="auto"),  # measured timings
        SpeculativeConfig(K=6, adaptive=True, draft_cost=0.05),
        SpeculativeConfig(K=6, confidence_stop=0.6),
        SpeculativeConfig(K=6, adaptive=True, draft_cost=0.05, confidence_stop=0.6),
    ],
    ids=["auto", "adaptive", "confidence stop", "both"],
)
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
    out = LLM(target, draft, strategy="sd", speculative=SpeculativeConfig(K=6, confidence_stop=0.99)).generate(
        PROMPTS, GREEDY
    )
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


def test_sd_K_climbs_one_step_past_the_widths_verified():
    """A verify timed at one width is read flat at every other, so K = 8 looked as cheap as K = 1; on a CPU a
    block of 9 costs ~3× one of 2 (int4 target, one core). K now goes one past the longest K verified."""
    la = Lookahead(SpeculativeConfig(K=8, adaptive=True))
    la.admit(1)
    la.drafted(1, 30.0)
    for _ in range(6):  # α near 1
        la.observe([1], 1, 150.0)
    assert la.choose() == 2
    la.observe([2], 2, 170.0)
    assert la.choose() == 3
    fixed = Lookahead(SpeculativeConfig(K=8, adaptive=True, draft_cost=0.01))
    fixed.admit(1)
    for _ in range(6):
        fixed.observe([1], 1, 150.0)
    assert fixed.choose() == 8  # fixed times: every K is open


def test_a_new_row_starts_from_the_alpha_of_the_rows_before_it():
    """From the prior's ½, each HumanEval request spent its first ~10 rounds at K = 1 while its α was learnt."""
    la = Lookahead(SpeculativeConfig(K=8, adaptive=True))
    la.admit(1)
    for _ in range(40):  # a draft that is always right
        la.observe([3], 3, 100.0)
    la.retire([])
    la.admit(2)
    pooled = (0.5 + la.pooled[0]) / (1.0 + la.pooled[0] + la.pooled[1])  # the prior (½, ½) on every row seen
    assert la.alphas() == pytest.approx([(0.5 + 16 * pooled) / (1 + 16)] * 2)
    fresh = Lookahead(SpeculativeConfig(K=8, adaptive=True))
    fresh.admit(2)
    assert fresh.alphas().tolist() == [0.5, 0.5]  # negative control: nothing seen, the prior
    assert (la.alphas() > 0.9).all()
    la.drafted(1, 10.0)
    fresh.drafted(1, 10.0)
    fresh.verify_ms = dict(la.verify_ms)
    assert la.choose() > fresh.choose()


@pytest.mark.parametrize("refresh", [True, False])
def test_a_width_verified_in_a_slow_moment_is_verified_again(refresh, monkeypatch):
    """An SD HumanEval run (int4 target) timed width 4 at 128 ms early on and kept K = 2 on it, when K = 3 then
    verified in 108 and ran 5% more tokens a second. A neighbouring K whose verify is older than REFRESH rounds
    is tried once more."""
    import engine.strategies.lookahead as lookahead

    if not refresh:  # negative control
        monkeypatch.setattr(lookahead, "REFRESH", 10**9)
    la = Lookahead(SpeculativeConfig(K=8, adaptive=True))
    la.admit(1)
    la.drafted(1, 32.6)
    for K, ms in ((2, 96.4), (3, 128.0)):  # a slow moment for K = 3
        for _ in range(4):
            la.observe([K], K, ms)
    Ks = []
    for _ in range(80):
        K = la.choose()
        Ks.append(K)
        la.observe([K], K, {2: 96.4, 3: 108.0, 4: 160.0}[K])
    if refresh:
        assert Ks[0] == 2 and Ks[-20:].count(3) >= 16  # K = 3 tried again, found quicker, and kept
    else:
        assert set(Ks) == {2}

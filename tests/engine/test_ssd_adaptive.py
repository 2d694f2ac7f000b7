"""SSD with adaptive K (K="auto"): greedy outputs are the AR outputs (worker in process and in its own
process), K follows α, the cache is pre-drafted at the length the next round asks for (so hits go on while K
changes), the budget "auto" is sized for the branches' length, and the wire carries both lengths."""

import copy

import pytest
import torch

from engine import LLM, SamplingParams, SpeculativeConfig
from engine.config import DraftPlacement, EngineConfig
from engine.ssd.messages import Join, MalformedMessage, Round, decode, encode
from engine.ssd.policy import DraftPolicy
from engine.strategies.ssd_lookahead import SSDLookahead
from tests.engine.tiny import noisy_copy, tiny_lm
from theory.adaptive import miss_share

# Fixtures target and ar_tokens (conftest.py): the tiny target, and greedy AR's tokens for PROMPTS under GREEDY.
PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15, 16]]
GREEDY = SamplingParams(temperature=0, max_new_tokens=30, stop_on_eos=False)
IN_PROCESS = DraftPlacement(in_process=True)


def decode_rounds(out):
    return [r for r in out.metrics.rounds if r.phase == "decode"]


def ssd(target, draft, **spec):
    return LLM(target, draft, strategy="ssd", speculative=SpeculativeConfig(**spec))


@pytest.mark.parametrize(
    "spec",
    [
        dict(K="auto"),  # measured timings
        dict(K=6, adaptive=True, draft_cost=0.05),
        dict(K=6, adaptive=True, draft_cost=0.05, budget="auto"),
        dict(K=5, adaptive=True, draft_cost=0.05, backup="lookup", schedule="geometric", budget=8),
    ],
    ids=["auto", "fixed cost", "budget auto", "lookup backup, geometric"],
)
def test_greedy_ssd_with_adaptive_K_equals_ar(target, ar_tokens, spec):
    out = ssd(target, noisy_copy(target, noise=1.0), placement=IN_PROCESS, **spec).generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in out] == ar_tokens
    K_max = SpeculativeConfig(**spec).K
    Ks = [r.K for r in decode_rounds(out)]
    assert all(1 <= K <= K_max for K in Ks)
    assert 0 < out.metrics.summary()["hit_rate"] < 1


def test_greedy_ssd_with_adaptive_K_in_a_worker_process_equals_ar(target, ar_tokens):
    spec = dict(K=6, adaptive=True, draft_cost=0.05, placement=DraftPlacement(deadline_s=10.0))
    with ssd(target, target, **spec) as llm:
        out = llm.generate(PROMPTS, GREEDY)
        assert llm.proposer.name == "ssd"
    assert [o.token_ids for o in out] == ar_tokens
    Ks = [r.K for r in decode_rounds(out)]
    assert len(set(Ks)) >= 2 and Ks[-1] == 6  # K changed over the wire, and hits went on
    assert all(all(r.hit) for r in decode_rounds(out)[1:])


def test_K_grows_to_the_maximum_and_every_round_hits_when_the_draft_is_the_target(target, ar_tokens):
    out = ssd(target, target, K=6, adaptive=True, draft_cost=0.05, placement=IN_PROCESS).generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in out] == ar_tokens
    rounds = decode_rounds(out)
    Ks = [r.K for r in rounds]
    assert Ks[0] < 6 and Ks[-1] == 6
    # The cache is pre-drafted at the length the next round asks for: hits go on while K changes.
    assert all(all(r.hit) for r in rounds[1:])


def test_K_drops_to_the_minimum_with_a_draft_that_never_agrees(target, ar_tokens):
    out = ssd(
        target, tiny_lm(5, scale=4.0), K=6, K_min=1, adaptive=True, draft_cost=0.05, placement=IN_PROCESS
    ).generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in out] == ar_tokens
    assert [r.K for r in decode_rounds(out)][-1] == 1


def test_a_fixed_K_is_unchanged(target, ar_tokens):
    out = ssd(target, noisy_copy(target, noise=1.0), K=3, placement=IN_PROCESS).generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in out] == ar_tokens
    assert {r.K for r in decode_rounds(out)} == {3}


def test_the_choice_counts_drafting_only_on_misses():
    assert miss_share(1.0, 4) == 0.0 and miss_share(0.0, 1) == 1.0
    assert miss_share(0.9, 4) == pytest.approx(1 - 0.9**4)
    spec = SpeculativeConfig(K=8, adaptive=True, draft_cost=0.3)
    sure, unsure = SSDLookahead(spec), SSDLookahead(spec)
    for lk in (sure, unsure):
        lk.admit(2)
        for _ in range(5):
            lk.observe([4, 4], 8, 1.0)  # the same acceptance
    sure.answered([True, True], 8, None)
    for _ in range(20):
        sure.answered([True, True], 8, None)
        unsure.answered([False, False], 8, None)
    assert sure.choose() > unsure.choose()  # drafting hidden behind the verify: longer blocks pay


def test_budget_auto_is_sized_for_the_branch_length():
    policy = DraftPolicy(SpeculativeConfig(K=6, adaptive=True, budget="auto"))
    policy.built_K = (3, 3)
    tokens = policy.budget_for(3, 3) * 3
    assert tokens == 12 * 3  # before any build is timed: three guesses per outcome of the K built
    policy.observe_times(verify_ms=10.0, build_ms=4.5, backup=None, backup_ms=0.0)  # the build took half the aim
    assert policy.branch_tokens == pytest.approx(1.5 * tokens)  # half-way to twice the branch tokens
    short, long = policy.budget_for(3, 2), policy.budget_for(3, 6)
    assert policy.budget_for(3, 3) * 3 == pytest.approx(policy.branch_tokens)
    assert short == pytest.approx(3 * long)  # the same branch tokens: a third of the branches at 3x the length
    assert sum(policy.schedule(True, 3, 6)) == round(long)
    assert len(policy.schedule(True, 3, 6)) == 4  # F_0..F_3 for a speculation of length 3


def test_budget_auto_sets_each_build_against_its_own_branches_and_recovers_from_a_slow_start():
    """Spec-Bench greedy, 2-core CPU, adaptive K with budget auto: the first builds (the 27 guesses of K = 8, seconds
    long) held a smoothed build time over the verify for a dozen rounds, and the budget at one guess, while
    one-branch builds took 125-200 ms of a 250 ms verify. Each build's time now meets its own branches."""
    policy = DraftPolicy(SpeculativeConfig(K="auto", budget="auto", schedule="geometric"))
    assert policy.budget_for(3, 3) == 12 and policy.budget_for(1, 1) == 6  # not the 27 guesses of K = 8

    def build(branches: float) -> float:  # 30 ms a forward (glue + 3 steps), 8 ms a branch step
        return 4 * 30.0 + 3 * branches * 8.0

    policy.built(3, 3, 27.0)
    policy.observe_times(verify_ms=250.0, build_ms=build(27.0) * 3, backup=None, backup_ms=0.0)  # a slow start
    budgets = []
    for _ in range(12):
        B = round(policy.budget_for(3, 3))
        budgets.append(B)
        policy.built(3, 3, float(B))
        policy.observe_times(verify_ms=250.0, build_ms=build(B), backup=None, backup_ms=0.0)
    assert budgets[0] < 10  # the slow build shrank it
    assert 3 <= budgets[-1] <= 5 and build(budgets[-1]) <= 250  # back up to what fits in the verify: 5 branches
    slow = DraftPolicy(SpeculativeConfig(K="auto", budget="auto", schedule="geometric"))
    for _ in range(12):  # negative control: builds that outlast the verify at any size keep it at the floor
        B = round(slow.budget_for(3, 3))
        slow.built(3, 3, float(B))
        slow.observe_times(verify_ms=250.0, build_ms=400.0 + 8 * B, backup=None, backup_ms=0.0)
    assert round(slow.budget_for(3, 3)) == 1


def test_a_given_fanout_serves_a_shorter_K():
    policy = DraftPolicy(SpeculativeConfig(K=4, adaptive=True, schedule="given", fanout=(5, 4, 3, 2, 1)))
    assert policy.schedule(True, 4) == (5, 4, 3, 2, 1)
    assert policy.schedule(True, 2) == (5, 4, 1)  # F_0, F_1 and the all-accepted F_K


def test_the_round_carries_both_lengths_and_is_checked():
    join = Join(7, [1, 2, 3], 4, 1.0, 0, 1.0, 99)
    sent = Round(3, [1, 5], [9, 9], [True, False], 12.5, [join], K=2, V=50, K_last=5, K_next=4)
    back = decode(encode(sent))
    assert (back.K, back.K_last, back.K_next, back.accepted, back.joins) == (2, 5, 4, [1, 5], [join])
    assert Round(0, [], [], [], 0.0, [], K=3, V=50).K_next == 3  # fixed K: both default to K
    with pytest.raises(MalformedMessage, match="out of range"):
        decode(encode(Round(3, [1, 5], [9, 9], [True, True], 1.0, [], K=2, V=50, K_last=4, K_next=2)))
    tensors = encode(Round(3, [1], [9], [True], 1.0, [], K=2, V=50, K_last=2, K_next=2))
    tensors[1][3 + 1] = 0  # K_next = 0
    with pytest.raises(MalformedMessage, match="K_next"):
        decode(tensors)


def test_settings_are_checked():
    EngineConfig(target="t", draft="d", strategy="ssd", speculative=SpeculativeConfig(K="auto"))  # allowed now
    with pytest.raises(ValueError, match="confidence_stop is implemented for sd only"):
        EngineConfig(target="t", draft="d", strategy="ssd", speculative=SpeculativeConfig(K=4, confidence_stop=0.5))


def test_a_worker_refuses_lengths_outside_the_spec(target):
    from engine.ssd.draft_worker import DraftWorker

    worker = DraftWorker(target, SpeculativeConfig(K=3, adaptive=True), 0, torch.device("cpu"))
    with pytest.raises(ValueError, match="1..3"):
        worker.respond(Round(0, [], [], [], 0.0, [Join(1, [1, 2], 3, 0.0, 0, 1.0, 5)], K=4, V=32, K_next=2))
    fixed = DraftWorker(target, SpeculativeConfig(K=3), 0, torch.device("cpu"))
    with pytest.raises(ValueError, match="fixed"):
        fixed.respond(Round(0, [], [], [], 0.0, [Join(1, [1, 2], 3, 0.0, 0, 1.0, 5)], K=3, V=32, K_next=2))


def test_the_round_carries_the_miss_length_and_it_is_checked():
    sent = Round(3, [1], [9], [True], 12.5, [], K=3, V=50, K_last=3, K_next=2, K_miss=1)
    assert decode(encode(sent)).K_miss == 1
    assert Round(0, [], [], [], 0.0, [], K=3, V=50).K_miss == 3  # default: K
    tensors = encode(Round(3, [1], [9], [True], 1.0, [], K=2, V=50, K_last=2, K_next=2))
    tensors[1][3 + 2] = 3  # K_miss = 3 > K = 2
    with pytest.raises(MalformedMessage, match="K_miss"):
        decode(tensors)


@pytest.mark.parametrize("backup, length", [("neural", 1), ("random", 3)])
def test_a_round_where_every_row_misses_is_drafted_at_the_miss_length_by_the_neural_backup_only(target, backup, length):
    from engine.ssd.draft_worker import DraftWorker

    worker = DraftWorker(target, SpeculativeConfig(K=3, adaptive=True, backup=backup), 0, torch.device("cpu"))
    joins = [Join(1, [1, 2], 3, 0.0, 0, 1.0, 5), Join(2, [4, 5, 6], 7, 0.0, 0, 1.0, 6)]
    reply = worker.respond(Round(0, [], [], [], 0.0, joins, K=3, V=50, K_next=3, K_miss=1))
    assert tuple(reply.tokens.shape) == (2, length) and tuple(reply.q.shape) == (2, length, 50)
    worker.build_cache()  # the cache is built over the speculation actually sent
    assert worker.K == length and worker.current.tokens.shape == (2, length)
    fixed = DraftWorker(target, SpeculativeConfig(K=3), 0, torch.device("cpu"))
    with pytest.raises(ValueError, match="fixed"):
        fixed.respond(Round(0, [], [], [], 0.0, joins, K=3, V=50, K_miss=1))


def test_the_miss_length_is_sds_choice_with_the_drafts_time_in_full():
    from engine.strategies.ssd_lookahead import SSDLookahead

    lookahead = SSDLookahead(SpeculativeConfig(K=6, adaptive=True))
    lookahead.admit(1)
    for _ in range(4):  # α about ½; the verify costs 75 ms at width 2, 5 ms more per token
        lookahead.observe([1], 2, 80.0)
        lookahead.observe([0], 1, 75.0)
    lookahead.answered([True] * 8, 2, 40.0)  # the neural backup: 20 ms per drafted token
    lookahead.answered([True] * 8, 2, None)
    assert lookahead.p_hit > 0.8 and 0.3 < float(lookahead.alphas()[0]) < 0.7
    # With most rounds hitting, the draft's time is discounted and SSD speculates longer than SD would.
    assert lookahead.choose() > lookahead.choose_miss() >= 1
    assert SSDLookahead(SpeculativeConfig(K=4)).choose_miss() == 4  # fixed K: K


def test_ssd_does_not_choose_branches_whose_build_outlasts_the_verify():
    from engine.strategies.ssd_lookahead import SSDLookahead

    def lookahead(builds: dict[int, float]) -> SSDLookahead:
        la = SSDLookahead(SpeculativeConfig(K=8, adaptive=True))
        la.admit(1)
        for _ in range(6):  # α near 1, and a verify that barely grows with the block (memory-bound)
            la.observe([3], 3, 200.0)
            la.observe([5], 5, 210.0)
            la.answered([True], 3, 60.0)  # 20 ms per drafted token; every row hit
            for K, ms in builds.items():
                la.answered([True], 3, None, ms, K)
        return la

    assert lookahead({}).choose() == 6  # nothing known about the builds: one past the longest K verified (5)
    # the build grows 60 ms per branch token: branches of 3 fit inside the verify, of 8 do not
    slow = lookahead({3: 180.0, 5: 300.0})
    assert slow.choose() < 8
    assert slow._round_ms(9) == pytest.approx(480.0)  # read off the builds' line, past the verify's 220


def test_one_measured_build_length_is_scaled_not_read_flat():
    from engine.strategies.ssd_lookahead import SSDLookahead

    la = SSDLookahead(SpeculativeConfig(K=8, adaptive=True))
    la.admit(1)
    for _ in range(6):  # a verify that barely grows (memory-bound) and one slow build at branch length 3
        la.observe([1], 3, 500.0)
        la.observe([2], 2, 495.0)
        la.answered([True], 3, 60.0, 800.0, 3)
    assert la._round_ms(9) == pytest.approx(800.0 * 9 / 4)  # branches of 8: (8 + 1) / (3 + 1) of the build at 3
    assert la.choose() < 8  # with the build read flat, every K would cost the same and K = 8 would win


def test_k_climbs_one_step_past_what_was_measured():
    """HumanEval, int4 target: a run went from K = 1 straight to 8 before any build was timed, and stayed (its
    builds grow faster than their length). K now goes at most one past the longest build timed."""
    from engine.strategies.ssd_lookahead import SSDLookahead

    la = SSDLookahead(SpeculativeConfig(K=8, adaptive=True))
    la.admit(1)
    for _ in range(6):  # α near 1, a verify that barely grows, every row hit: longer looks better and better
        la.observe([1], 1, 257.0)
    assert la.choose() == 2  # no build timed yet: one past the K verified
    fast, slow = copy.deepcopy(la), copy.deepcopy(la)
    climbed = []
    for K in range(1, 9):  # builds of 30 ms per branch step: every length fits inside the verify
        fast.answered([True], K, 30.0, 30.0 * K, K)
        climbed.append(fast.choose())
    assert climbed == [2, 3, 4, 5, 6, 7, 8, 8]  # a step at a time, each one past a measured length
    for K in range(1, 4):  # 100 ms per step: from K = 3 on the build outlasts the 257 ms verify
        slow.answered([True], K, 30.0, 100.0 * K, K)
    assert slow.choose() <= 3
    fixed = SSDLookahead(SpeculativeConfig(K=8, adaptive=True, draft_cost=0.01))
    fixed.admit(1)
    for _ in range(6):
        fixed.observe([1], 1, 257.0)
    assert fixed.choose() == 8  # fixed times: nothing is extrapolated, every K is open


@pytest.mark.parametrize("branches", [True, False])
def test_a_length_timed_at_a_larger_budget_is_priced_at_the_branches_it_needs(branches, monkeypatch):
    """HumanEval, int4 target, budget auto: builds keyed by length went stale as the budget resized the cache, and
    a run kept K = 4 (348 ms rounds) where K = 3 ran 233 ms ones. Measured with its branches, a length's time
    is moved to the branches it needs now (no refresh needed here: it is turned off)."""
    import engine.strategies.lookahead as lookahead

    monkeypatch.setattr(lookahead, "REFRESH", 10**9)
    la = SSDLookahead(SpeculativeConfig(K=8, adaptive=True, budget="auto"))
    la.admit(1)
    la.answered([False], 3, 90.0)  # a miss: the neural backup drafts 3 tokens, 30 ms each
    verify = {K: 200.0 + 10 * K for K in range(1, 9)}
    # A build's forward costs 45 ms and each branch 7 ms a step. Early, budget auto had 12 branches at length 3:
    # 4·45 + 3·12·7 = 432 ms; at its floor, K + 1 branches, length K costs (K + 1)·45 + K·(K + 1)·7.
    floor = {K: (K + 1) * 45 + K * (K + 1) * 7.0 for K in verify}
    for _ in range(8):  # α near 1
        la.observe([3], 3, verify[3])
        la.observe([4], 4, verify[4])
    la.answered([True], 3, None, 432.0, 3, 12 if branches else None)
    for _ in range(12):
        la.answered([True], 4, None, floor[4], 4, 5 if branches else None)
    Ks = []
    for _ in range(60):
        K = la.choose()
        Ks.append(K)
        la.observe([K], K, verify[K])
        la.answered([True], K, None, floor[K], K, K + 1 if branches else None)
    if branches:
        # 3.94 tokens in 264 ms, against 2.97 in 210 (K = 2, from the fit) and 4.90 in 365 (K = 4)
        assert Ks[-20:].count(3) >= 19
    else:  # negative control: by length, K = 3's 432 ms keeps it out
        assert 3 not in Ks


def test_a_fixed_budget_keeps_its_branches_per_row_at_every_K():
    la = SSDLookahead(SpeculativeConfig(K=8, adaptive=True, budget=8))
    la.admit(2)
    for L in (3, 5):  # two rows of 8 branches; 40 ms a forward, 5 ms a branch step
        la.answered([True, True], L, None, (L + 1) * 40 + L * 16 * 5.0, L, 16)
    assert la.branches_per_row == pytest.approx(8.0)
    assert la._build_ms(6) == pytest.approx(7 * 40 + 6 * 16 * 5.0)


def test_one_build_length_with_branches_puts_it_all_on_the_forwards_and_the_climb_measures_the_next():
    la = SSDLookahead(SpeculativeConfig(K=8, adaptive=True, budget="auto"))
    la.admit(1)
    la.answered([True], 1, None, 80.0, 1, 2)
    assert la._build_fit == (40.0, 0.0)
    assert la._build_ms(2) == pytest.approx(120.0) and la._K_max() == 2


def test_a_length_already_built_keeps_its_measured_time():
    """HumanEval, int4 target, one row at the floor: builds of 87, 115 and 214 ms at lengths 1, 2, 3 (not linear
    in K; K = 2 ran 125 ms rounds for 2.9 tokens against K = 1's 102 ms for 2.0). The fit through them prices
    lengths not built yet."""
    la = SSDLookahead(SpeculativeConfig(K=8, adaptive=True, budget="auto"))
    la.admit(1)
    la.answered([False], 2, 68.0)  # a miss: the neural backup's 34 ms a token
    for _ in range(30):  # α near 1
        for K, verify in ((1, 97.0), (2, 114.5), (3, 123.0)):
            la.observe([K], K, verify)
        for K, ms, branches in ((1, 86.7, 3), (2, 114.8, 2), (3, 214.4, 4)):  # K = 2 built below its floor of 3
            la.answered([True], K, None, ms, K, branches)
    t_forward, t_branch = la._build_fit
    assert la._build_ms(2) == pytest.approx(114.8 + 2 * (3 - 2) * t_branch)  # its own time, at its floor's branches
    assert la._build_ms(4) == pytest.approx(5 * t_forward + 4 * 5 * t_branch)  # not built: the fit
    assert la.choose() == 2


@pytest.mark.parametrize("refresh", [True, False])
def test_a_length_timed_in_a_slow_moment_is_timed_again(refresh, monkeypatch):
    """A HumanEval run timed K = 2's build at 172 ms early on and then ran K = 1 for good, never seeing that
    K = 2 now built in 115. A neighbour timed longer ago than REFRESH builds is tried once more."""
    import engine.strategies.lookahead as lookahead

    if not refresh:  # negative control
        monkeypatch.setattr(lookahead, "REFRESH", 10**9)
    la = SSDLookahead(SpeculativeConfig(K=8, adaptive=True, budget="auto"))
    la.admit(1)
    la.answered([False], 2, 68.0)  # a miss: the neural backup's 34 ms a token
    for _ in range(8):
        la.observe([2], 2, 114.5)
        la.answered([True], 2, None, 172.0, 2, 3)  # a slow moment
    Ks = []
    for _ in range(60):
        K = la.choose()
        Ks.append(K)
        la.observe([K], K, {1: 97.0, 2: 114.5, 3: 123.0}[K])
        la.answered([True], K, None, {1: 86.7, 2: 114.8, 3: 214.4}[K], K, K + 1)
    if refresh:
        assert Ks[0] == 1 and Ks[-10:] == [2] * 10  # K = 2 tried again, found quick, and kept
    else:
        assert set(Ks) == {1}


def test_the_first_build_after_a_switch_of_length_is_not_timed():
    """Budget auto sizes the first build at a new length for the old one: a K = 3 build right after K = 4 ran
    long and sent a run back to K = 4."""
    la = SSDLookahead(SpeculativeConfig(K=8, adaptive=True, budget="auto"))
    la.admit(1)
    for L, ms in ((3, 264.0), (3, 264.0), (4, 365.0), (4, 365.0), (3, 400.0), (3, 264.0)):
        la.answered([True], L, None, ms, L, L + 1)
    assert la.build_ms[3] == pytest.approx(264.0)  # the 400 ms switch build is left out
    assert la.build_ms[4] == pytest.approx(365.0)  # a length's first build ever is timed (the climb needs it)

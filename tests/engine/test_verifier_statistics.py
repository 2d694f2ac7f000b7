"""verify() on the real code path: chi-square tests of what one round emits against the target.

A toy target over V = 5 tokens whose p depends on the whole prefix (p_1, p_2[x_1], p_3[x_1, x_2]), and a
proposal of each kind: the draft's own q, Saguaro σ_{F,C} with C < 1, uniform (random-token backup), a
point mass (lookup backup), and temperature / top-k / top-p warped versions. B rows are drafted and
verified in ONE batched verify() call (each row an independent round), and two statistics are tested:
  1. the first emitted token against p_1;
  2. among rows that emit >= 2 tokens (k >= 1), the second token given the first against p_2[first]
     (counts grouped by the first token, expected = group size · p_2[first]; ddof = groups − 1).
Zero-probability cells must be empty (asserted), and are then left out of the chi-square; first-token
groups with < 100 rows are left out too (the selection depends only on the first tokens, so the second
tokens of the kept groups are still exactly p_2[first]-distributed, and no expected count is tiny).

False-alarm rate: each p-value is compared with α_test = 1e-3, so an exact verifier fails a given
assertion with probability 1e-3 per fresh seed. Seeds are fixed, so the suite is deterministic.
Negative controls must be detected decisively (min p-value < 1e-6): a verifier that accepts by "equals the
target argmax" at temperature > 0 and then samples from p (the reference engine's bug), and verify() given
the wrong q (the draft's q for Saguaro tokens; uniform for lookup tokens).
"""

from collections.abc import Callable

import pytest
import torch
from scipy.stats import chisquare

from engine.proposals import point_mass, uniform
from engine.sampling import saguaro, sample, warp
from engine.sampling_params import SamplingParams
from engine.verifier import Verification, verify

V = 5
B = 40_000
ALPHA_TEST = 1e-3
DETECTED = 1e-6
F64 = torch.float64
Tables = list[torch.Tensor]  # tables[n]: shape [V]*n + [V], the next-token distribution after x_1..x_n
Verifier = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Generator], Verification]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The tensors are tiny: intra-op threads only add contention on shared CPU cores (about 3x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def logit_tables(K: int, gen: torch.Generator) -> Tables:
    return [torch.randn((V,) * (n + 1), generator=gen, dtype=F64) for n in range(K + 1)]


def rows(tables: Tables, prefix: torch.Tensor) -> torch.Tensor:
    """The distribution after each row's prefix [B, n] -> [B, V]."""
    n = prefix.shape[1]
    return tables[n][tuple(prefix.T)] if n else tables[0].expand(prefix.shape[0], V)


def speculate(proposal: Tables, K: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Draft K tokens per row from the proposal: tokens [B, K] and the q they were drawn from [B, K, V]."""
    tokens = torch.zeros(B, 0, dtype=torch.long)
    qs = []
    for _ in range(K):
        qs.append(rows(proposal, tokens))  # [B, V]
        tokens = torch.cat([tokens, sample(qs[-1], gen)[:, None]], dim=1)
    return tokens, torch.stack(qs, dim=1)


def first_two_emitted(result: Verification, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """First emitted token [B]; second emitted token [B] (meaningful where k >= 1)."""
    k, bonus = result.accepted, result.bonus
    first = torch.where(k >= 1, tokens[:, 0], bonus)
    second = torch.where(k >= 2, tokens[:, 1], bonus) if tokens.shape[1] >= 2 else bonus
    return first, second


def chi_square_p_value(observed: torch.Tensor, expected: torch.Tensor) -> float:
    """Chi-square p-value of counts [G, V] against expected counts [G, V] with the same row totals."""
    impossible = expected == 0
    assert observed[impossible].sum() == 0, "a token with target probability 0 was emitted"
    groups = observed.shape[0]
    obs, exp = observed[~impossible].double().numpy(), expected[~impossible].double().numpy()
    assert obs.size - groups >= 1, "this case leaves the test no degree of freedom: pick another seed"
    return float(chisquare(obs, exp, ddof=groups - 1).pvalue)


def p_values(target: Tables, result: Verification, tokens: torch.Tensor) -> tuple[float, float]:
    first, second = first_two_emitted(result, tokens)
    p_first = chi_square_p_value(torch.bincount(first, minlength=V)[None], len(first) * target[0][None])
    two = result.accepted >= 1
    pairs = torch.bincount(first[two] * V + second[two], minlength=V * V).view(V, V)  # [first, second]
    group_sizes = pairs.sum(dim=1, keepdim=True)  # [V, 1]
    used = group_sizes.squeeze(1) >= 100  # keep the chi-square approximation honest: no tiny groups
    p_second = chi_square_p_value(pairs[used], (group_sizes * target[1])[used])  # expected: n · p_2[first]
    return p_first, p_second


def run_round(target: Tables, drawn_from: Tables, verified_with: Tables | None, K: int, seed: int, verifier: Verifier):
    gen = torch.Generator().manual_seed(seed)
    tokens, q = speculate(drawn_from, K, gen)  # [B, K], [B, K, V]
    if verified_with is not None:  # the wrong-q controls hand the verifier another distribution
        q = torch.stack([rows(verified_with, tokens[:, :i]) for i in range(K)], dim=1)
    p = torch.stack([rows(target, tokens[:, :n]) for n in range(K + 1)], dim=1)  # [B, K+1, V]
    result = verifier(tokens, q, p, gen)
    return p_values(target, result, tokens)


PLAIN = SamplingParams(temperature=1.0)
WARPED = SamplingParams(temperature=0.8, top_k=4, top_p=0.95)


def case(kind: str, params: SamplingParams, K: int, seed: int, C: float = 0.25, F: int = 1):
    """(target tables, proposal tables, draft tables) for one proposal kind.

    The draft's logits are the target's plus noise, and the lookup proposes the argmax of another noisy
    copy, so (as with real models) proposals often hit the target's argmax: that is where the argmax bug
    shows.
    """
    gen = torch.Generator().manual_seed(seed)
    target_logits = logit_tables(K, gen)
    noisy = [logits + 0.8 * torch.randn(logits.shape, generator=gen, dtype=F64) for logits in target_logits[:K]]
    draft = [warp(logits, params) for logits in noisy]
    proposal = {
        "draft": lambda: draft,
        "saguaro": lambda: [saguaro(q, F + 1, C) for q in draft],
        "uniform": lambda: [uniform((V,) * n, V, dtype=F64) for n in range(K)],
        "point_mass": lambda: [point_mass(logits.argmax(-1), V, dtype=F64) for logits in noisy],
    }[kind]()
    return [warp(logits, params) for logits in target_logits], proposal, draft


CASES = {  # name: (kind, params, K, seed)
    "draft q": ("draft", PLAIN, 2, 1),
    "saguaro C=0.25": ("saguaro", PLAIN, 2, 2),
    "uniform (random-token backup)": ("uniform", PLAIN, 2, 3),
    "point mass (lookup backup)": ("point_mass", PLAIN, 2, 4),
    "warped draft q, K=3": ("draft", WARPED, 3, 5),
    "warped saguaro, K=3": ("saguaro", WARPED, 3, 6),
    "warped uniform": ("uniform", WARPED, 2, 7),
    "warped point mass": ("point_mass", WARPED, 2, 9),
}


@pytest.mark.parametrize("name", CASES)
def test_verify_emits_the_target_distribution(name):
    kind, params, K, seed = CASES[name]
    target, proposal, _ = case(kind, params, K, seed)
    p_first, p_second = run_round(target, proposal, None, K, seed=7, verifier=verify)
    assert p_first > ALPHA_TEST and p_second > ALPHA_TEST, (p_first, p_second)


def test_verify_rows_of_different_kinds_in_one_batch_each_follow_their_target():
    (t1, q1, _), (t2, q2, _) = case("saguaro", PLAIN, 2, seed=1), case("uniform", WARPED, 2, seed=2)
    gen = torch.Generator().manual_seed(3)
    (x1, qb1), (x2, qb2) = speculate(q1, 2, gen), speculate(q2, 2, gen)
    p1 = torch.stack([rows(t1, x1[:, :n]) for n in range(3)], dim=1)
    p2 = torch.stack([rows(t2, x2[:, :n]) for n in range(3)], dim=1)
    interleave = torch.arange(2 * B).view(2, B).T.reshape(-1)  # row 2i from case 1, row 2i+1 from case 2
    tokens, q, p = (torch.cat(pair)[interleave] for pair in ((x1, x2), (qb1, qb2), (p1, p2)))
    result = verify(tokens, q, p, gen)
    for offset, target, x in ((0, t1, x1), (1, t2, x2)):
        part = Verification(result.accepted[offset::2], result.bonus[offset::2])
        assert min(p_values(target, part, x)) > ALPHA_TEST


# --- negative controls: the same tests must catch biased verifiers ------------------------------------


def argmax_verifier(tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, gen: torch.Generator) -> Verification:
    """The reference engine's bug: accept while the token equals the target argmax, bonus sampled from p."""
    K = tokens.shape[1]
    accepted = (tokens == p[:, :K].argmax(-1)).long().cumprod(-1).sum(-1)  # [B]
    p_next = p[torch.arange(tokens.shape[0]), accepted]  # [B, V]
    return Verification(accepted=accepted, bonus=sample(p_next, gen))


@pytest.mark.parametrize("kind", ["uniform", "point_mass", "saguaro", "draft"])
def test_the_argmax_verifier_is_detected(kind):
    target, proposal, _ = case(kind, PLAIN, 2, seed=11)
    assert min(run_round(target, proposal, None, 2, seed=7, verifier=argmax_verifier)) < DETECTED


def test_verifying_saguaro_tokens_against_the_plain_draft_q_is_detected():
    target, sigma, draft = case("saguaro", PLAIN, 2, seed=11)
    assert min(run_round(target, sigma, draft, 2, seed=7, verifier=verify)) < DETECTED


def test_verifying_lookup_tokens_against_a_uniform_q_is_detected():
    target, lookup, _ = case("point_mass", PLAIN, 2, seed=11)
    flat = [uniform((V,) * n, V, dtype=F64) for n in range(2)]
    assert min(run_round(target, lookup, flat, 2, seed=7, verifier=verify)) < DETECTED

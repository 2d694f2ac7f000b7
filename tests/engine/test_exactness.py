"""Exactness of one verification round, by enumeration (no sampling), for every proposal kind.

A toy target whose p depends on the whole prefix (a random table p[prefix]) and a toy proposal q[prefix]
of each kind the engine uses: the draft's own warped q, Saguaro σ_{F,C}, uniform (random-token backup) and
a point mass (lookup backup). The enumeration below is written from the math of docs/ssd.md §1, not from
verify(): it walks every draft sequence x_1..x_K with its q-probability, the acceptance probability
min(1, p/q) and the residual, and yields the exact distribution of what the round emits.

Claim checked (to 1e-9 in float64): for every prefix s of length n−1 ≤ K and token t,
    P(the round emits >= n tokens, the first n are s·t) = P(the round emits >= n tokens, starting with s) · p(t | s),
i.e. each emitted token is distributed as the target's next-token distribution given the previous ones,
which is what sampling from the target alone gives (by induction, over any number of rounds too).
The negative controls show the same check fails for the reference engine's argmax rule and for a verifier
given the wrong q. The real code path of verify() is covered statistically in test_verifier_statistics.py.
"""

from collections import defaultdict
from collections.abc import Callable
from itertools import product

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.proposals import point_mass, uniform
from engine.sampling import saguaro, warp
from engine.sampling_params import SamplingParams

Prefix = tuple[int, ...]
Table = dict[Prefix, list[float]]  # prefix -> next-token distribution
# A verification rule: (p, q, x) -> acceptance probability, and (p, q) -> bonus distribution on rejection.
Accept = Callable[[list[float], list[float], int], float]
Bonus = Callable[[list[float], list[float]], list[float]]


def prefixes(vocab_size: int, max_len: int) -> list[Prefix]:
    return [s for n in range(max_len + 1) for s in product(range(vocab_size), repeat=n)]


def table(rows: torch.Tensor, keys: list[Prefix]) -> Table:
    return dict(zip(keys, rows.tolist(), strict=True))


def standard_accept(p: list[float], q: list[float], x: int) -> float:
    if q[x] == 0:  # only reachable when the verifier is given the wrong q: p/q is +inf (or 0/0)
        return 1.0 if p[x] > 0 else 0.0
    return min(1.0, p[x] / q[x])


def standard_bonus(p: list[float], q: list[float]) -> list[float]:
    residual = [max(0.0, pt - qt) for pt, qt in zip(p, q, strict=True)]
    mass = sum(residual)
    return [r / mass for r in residual] if mass > 0 else p  # mass 0: rejection has probability 0


def enumerate_round(
    K: int, target: Table, drawn_from: Table, verified_with: Table, accept: Accept, bonus: Bonus
) -> dict[Prefix, float]:
    """Exact distribution of the emitted sequence x_1..x_k, t* of one round."""
    emitted: dict[Prefix, float] = defaultdict(float)

    def walk(prefix: Prefix, reach: float) -> None:
        p = target[prefix]
        if len(prefix) == K:  # all K accepted: the bonus comes from p_{K+1}
            for t, pt in enumerate(p):
                emitted[prefix + (t,)] += reach * pt
            return
        q_drawn, q_claimed = drawn_from[prefix], verified_with[prefix]
        for x, qx in enumerate(q_drawn):
            if qx == 0:
                continue
            a = accept(p, q_claimed, x)
            if a > 0:
                walk(prefix + (x,), reach * qx * a)
            if a < 1:
                for t, bt in enumerate(bonus(p, q_claimed)):
                    emitted[prefix + (t,)] += reach * qx * (1 - a) * bt

    walk((), 1.0)
    return emitted


def worst_violation(K: int, vocab_size: int, target: Table, emitted: dict[Prefix, float]) -> float:
    """max over s, t of |P(>= n emitted, first n = s·t) − P(>= n emitted, first n−1 = s) · p(t | s)|."""
    starts_with: dict[Prefix, float] = defaultdict(float)  # P(>= len(s) emitted, first len(s) = s)
    for sequence, prob in emitted.items():
        for n in range(1, len(sequence) + 1):
            starts_with[sequence[:n]] += prob
    worst = abs(sum(emitted.values()) - 1)
    for s in prefixes(vocab_size, K):
        reach = sum(starts_with[s + (t,)] for t in range(vocab_size))
        if s == ():
            worst = max(worst, abs(reach - 1))
        for t in range(vocab_size):
            worst = max(worst, abs(starts_with[s + (t,)] - reach * target[s][t]))
    return worst


def toy_round(seed: int, vocab_size: int, K: int, params: SamplingParams, kind: str, F: int, C: float, ties: bool):
    """Target table for prefixes of length 0..K; proposal table for 0..K−1 of the given kind."""
    gen = torch.Generator().manual_seed(seed)
    target_keys, draft_keys = prefixes(vocab_size, K), prefixes(vocab_size, K - 1)
    target_logits = 2 * torch.randn(len(target_keys), vocab_size, generator=gen, dtype=torch.float64)
    draft_logits = 2 * torch.randn(len(draft_keys), vocab_size, generator=gen, dtype=torch.float64)
    if ties:  # integer logits: ties at the top-k / top-p / Saguaro boundaries and at the argmax
        target_logits, draft_logits = target_logits.round(), draft_logits.round()
    q_draft = warp(draft_logits, params)  # [prefixes, V]
    proposals = {
        "draft": lambda: q_draft,
        "saguaro": lambda: saguaro(q_draft, F + 1, C),
        "uniform": lambda: uniform((len(draft_keys),), vocab_size, dtype=torch.float64),
        "point_mass": lambda: point_mass(
            torch.randint(0, vocab_size, (len(draft_keys),), generator=gen), vocab_size, dtype=torch.float64
        ),
    }
    target = table(warp(target_logits, params), target_keys)
    return target, table(proposals[kind](), draft_keys), table(q_draft, draft_keys)


sampling_params = st.builds(
    SamplingParams,
    temperature=st.sampled_from([0.0, 0.4, 1.0, 1.8]),
    top_k=st.none() | st.integers(1, 6),
    top_p=st.none() | st.floats(0.2, 1.0),
)


@pytest.mark.parametrize("kind", ["draft", "saguaro", "uniform", "point_mass"])
@settings(deadline=None, max_examples=150)
@given(
    seed=st.integers(0, 2**31),
    vocab_size=st.integers(2, 6),
    K=st.integers(1, 3),
    params=sampling_params,
    F=st.integers(0, 5),
    C=st.floats(0.01, 1.0),
    ties=st.booleans(),
)
def test_one_round_emits_exactly_the_target_distribution(kind, seed, vocab_size, K, params, F, C, ties):
    target, proposal, _ = toy_round(seed, vocab_size, K, params, kind, F, C, ties)
    emitted = enumerate_round(K, target, proposal, proposal, standard_accept, standard_bonus)
    assert worst_violation(K, vocab_size, target, emitted) < 1e-9


# --- negative controls: the same check must fail for a biased verifier --------------------------------

BIASED = dict(seed=3, vocab_size=4, K=2, params=SamplingParams(temperature=1.0), F=1, C=0.3, ties=False)


def argmax(p: list[float]) -> int:
    return max(range(len(p)), key=p.__getitem__)  # ties -> lowest id


def argmax_accept(p: list[float], q: list[float], x: int) -> float:
    """The reference engine's bug: accept iff the token is the target argmax, even at temperature > 0."""
    return 1.0 if x == argmax(p) else 0.0


def target_bonus(p: list[float], q: list[float]) -> list[float]:
    """...and on rejection sample the bonus from p instead of the residual."""
    return p


def argmax_lookup(target: Table) -> Table:
    """A lookup backup that happens to propose the target's argmax at every prefix (a point mass)."""
    return {s: [float(t == argmax(p)) for t in range(len(p))] for s, p in target.items() if len(s) < BIASED["K"]}


@pytest.mark.parametrize("kind", ["uniform", "draft", "saguaro", "argmax_lookup"])
def test_the_check_fails_for_the_argmax_rule_at_positive_temperature(kind):
    target, proposal, _ = toy_round(kind="draft" if kind == "argmax_lookup" else kind, **BIASED)
    if kind == "argmax_lookup":  # where the lookup misses the argmax, this rule happens to be exact
        proposal = argmax_lookup(target)
    emitted = enumerate_round(2, target, proposal, proposal, argmax_accept, target_bonus)
    assert worst_violation(2, 4, target, emitted) > 1e-3


def test_the_argmax_rule_is_exact_only_at_temperature_zero():
    greedy = {**BIASED, "params": SamplingParams(temperature=0)}
    target, proposal, _ = toy_round(kind="draft", **greedy)
    emitted = enumerate_round(2, target, proposal, proposal, argmax_accept, target_bonus)
    assert worst_violation(2, 4, target, emitted) < 1e-12


def test_the_check_fails_when_saguaro_tokens_are_verified_against_the_plain_draft_q():
    target, sigma, q_draft = toy_round(kind="saguaro", **BIASED)
    emitted = enumerate_round(2, target, sigma, q_draft, standard_accept, standard_bonus)
    assert worst_violation(2, 4, target, emitted) > 1e-3


def test_the_check_fails_when_lookup_tokens_are_verified_against_a_uniform_q():
    target, lookup, _ = toy_round(kind="point_mass", **BIASED)
    flat = {prefix: [0.25] * 4 for prefix in lookup}
    emitted = enumerate_round(2, target, lookup, flat, standard_accept, standard_bonus)
    assert worst_violation(2, 4, target, emitted) > 1e-3

"""SSD under adaptive K samples from exactly the target's distribution (statistical).

Same set-up as test_ssd_distribution (enumerated exact distribution of the first three tokens of a tiny
8-token model, chi-square at p < 1e-3, fixed seeds, one batch of N rows, so every row has its own outcome,
hit or miss). Three tokens leave room for two decode rounds only, too few for the running α to move K, so the
K schedule here is a stand-in that changes K every time it is asked (a function of how often it was asked:
of the past only, as the real choice is). Every round then asks for a length other than the one it
pre-drafts its cache at, which is the path adaptive K adds: branches K_next long built over a speculation K
long. The test checks that K did change between rounds and that rounds hit the cache, or it would prove
nothing. The negative control runs the same schedule with a biased verifier and must reject.
"""

import itertools

import numpy as np
import pytest

from engine import LLM, SamplingParams, SpeculativeConfig
from engine.config import DraftPlacement
from tests.engine.tiny import (
    FALSE_ALARM,
    PROMPT,
    STEPS,
    argmax_verifier,
    chi_square_p,
    exact_distribution,
    sequence_counts,
)

N = 3_000
SCHEDULE = (3, 1, 2)  # the K asked for, in turn


@pytest.fixture
def cycling_K(monkeypatch):
    turns = itertools.cycle(SCHEDULE)
    monkeypatch.setattr("engine.strategies.ssd_lookahead.SSDLookahead.choose", lambda self: next(turns))
    # The length offered for a round where no row hits: K itself here (the schedule alone decides), or 1 in the
    # test of that path (set `miss_length[0]`).
    miss_length = [None]
    monkeypatch.setattr(
        "engine.strategies.ssd.DraftWorkerProposer._miss_length",
        lambda self, K: K if miss_length[0] is None else min(K, miss_length[0]),
    )
    return miss_length


def run(target, draft, params: SamplingParams, **spec):
    spec = SpeculativeConfig(K=3, adaptive=True, placement=DraftPlacement(in_process=True), **spec)
    out = LLM(target, draft, strategy="ssd", speculative=spec).generate([PROMPT] * N, params)
    rounds = [r for r in out.metrics.rounds if r.phase == "decode"]
    return sequence_counts(out), rounds


@pytest.mark.parametrize(
    "spec, sampling",
    [
        (dict(schedule="given", fanout=(3, 3, 3, 3)), dict(temperature=1.0)),
        (dict(C=0.3, schedule="geometric", budget=6), dict(temperature=0.7, top_k=5)),
    ],
    ids=["uniform fan-out, T=1", "Saguaro C=0.3, geometric, top-k, T=0.7"],
)
def test_ssd_with_a_changing_K_matches_the_target_distribution(target8, draft8, cycling_K, spec, sampling):
    params = SamplingParams(max_new_tokens=STEPS, stop_on_eos=False, seed=11, **sampling)
    counts, rounds = run(target8, draft8, params, **spec)
    assert len({r.K for r in rounds}) >= 2  # K changed from round to round
    hits = sum(h for r in rounds[1:] for h in r.hit)
    assert hits >= 100  # a hundred rows and more took a branch drafted at a length other than its parent's
    assert chi_square_p(counts, exact_distribution(target8, params)) > FALSE_ALARM


def test_a_round_where_no_row_hits_may_draft_fewer_tokens_and_still_matches(target8, draft8, cycling_K):
    """A round where every row misses (here the first, all joiners) is drafted by the neural backup at the
    shorter length the target offered (Round.K_miss), then its cache is built over that shorter speculation."""
    cycling_K[0] = 1
    params = SamplingParams(max_new_tokens=STEPS, stop_on_eos=False, seed=11, temperature=1.0)
    counts, rounds = run(target8, draft8, params, schedule="given", fanout=(3, 3, 3, 3))
    first = rounds[0]
    assert SCHEDULE[0] > 1 and not any(first.hit) and first.K == 1  # asked for 3, drafted the miss length
    assert np.mean([h for r in rounds[1:] for h in r.hit]) > 0.15  # then caches built over it were used
    assert chi_square_p(counts, exact_distribution(target8, params)) > FALSE_ALARM


@pytest.mark.parametrize("miss_length", [None, 1], ids=["K", "shorter on a miss"])
def test_negative_control_biased_verifier_is_detected_under_a_changing_K(
    target8, draft8, cycling_K, monkeypatch, miss_length
):
    cycling_K[0] = miss_length
    monkeypatch.setattr("engine.verifier.verify", argmax_verifier)
    params = SamplingParams(temperature=1.0, max_new_tokens=STEPS, stop_on_eos=False, seed=11)
    counts, _ = run(target8, draft8, params, schedule="given", fanout=(3, 3, 3, 3))
    assert chi_square_p(counts, exact_distribution(target8, params)) < 1e-12

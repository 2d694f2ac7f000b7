"""The worker keeps and sends q as its support and the logits as a ranking; the verifier's q is unchanged."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.drafting import bonus_ranks, draft_tokens
from engine.kv_cache import KVState
from engine.ranking import _ranked_on_device, _ranked_on_host, ranked_ids
from engine.sampling import RowSampling
from engine.sampling_params import SamplingParams
from engine.sparse import SparseQ, TopLogits
from engine.ssd.messages import MalformedMessage, Source, Speculation, decode, encode, payload_shapes
from engine.ssd.tree import draft_compact
from tests.engine.tiny import tiny_lm


@st.composite
def distributions(draw):
    """q [R, V] rows with supports of any width: one-hot, top-k-like, full."""
    R, V = draw(st.integers(1, 6)), draw(st.integers(1, 40))
    seed, width = draw(st.integers(0, 2**31)), draw(st.integers(1, V))
    g = torch.Generator().manual_seed(seed)
    q = torch.zeros(R, V)
    for r in range(R):
        n = int(torch.randint(1, width + 1, (1,), generator=g))
        ids = torch.randperm(V, generator=g)[:n]
        w = torch.rand(n, generator=g) + 1e-3
        q[r, ids] = w / w.sum()
    return q


@settings(max_examples=200, deadline=None)
@given(distributions())
def test_the_support_rebuilds_q_bit_exactly(q):
    kept = SparseQ.of(q)
    assert torch.equal(kept.dense(), q)
    if kept.ids is not None:
        assert kept.nbytes < q.numel() * 4  # kept sparse only where it saves memory


@settings(max_examples=100, deadline=None)
@given(distributions(), distributions())
def test_rows_and_concatenation_keep_every_value(a, b):
    if a.shape[-1] != b.shape[-1]:
        b = torch.nn.functional.one_hot(torch.zeros(b.shape[0], dtype=torch.long), a.shape[-1]).float()
    joined = SparseQ.cat([SparseQ.of(a), SparseQ.of(b)])
    assert torch.equal(joined.dense(), torch.cat([a, b]))
    order = torch.arange(joined.values.shape[0]).flip(0)
    assert torch.equal(joined.rows(order).dense(), torch.cat([a, b])[order])


def _draft(params, C, compact, depth=7):
    model = tiny_lm(3, vocab_size=50)
    N, K = 5, 4
    torch.manual_seed(0)
    prompt = torch.randint(0, 50, (N, 6), generator=torch.Generator().manual_seed(1))
    state = KVState(model, N, torch.device("cpu"))
    state.extend(prompt[:, :-1], None)
    gens = [torch.Generator().manual_seed(10 + i) for i in range(N)]
    rows = RowSampling([params] * N)
    top = (3, 2, 2, 1)
    if compact:
        return draft_compact(state, prompt[:, -1:], None, K, top, C, rows, gens, depth)
    return draft_tokens(state, prompt[:, -1:], None, K, top, C, rows, gens)


def test_compact_drafting_draws_the_same_tokens_from_the_same_q():
    for params, C in [
        (SamplingParams(temperature=0.0), 1.0),
        (SamplingParams(temperature=0.7), 1.0),
        (SamplingParams(temperature=0.7, top_k=5), 0.5),
        (SamplingParams(temperature=1.0), 0.3),
    ]:
        tokens, q, logits = _draft(params, C, compact=False)
        c_tokens, c_q, ranking = _draft(params, C, compact=True)
        assert torch.equal(tokens, c_tokens)
        assert torch.equal(c_q.dense(), q.dense()), (params, C)
        assert torch.equal(ranking.ids, ranked_ids(torch.stack(logits, 1), 7))
        if params.greedy or params.top_k:
            assert c_q.ids is not None and c_q.values.shape[-1] <= (params.top_k or 1)


def test_greedy_q_crosses_the_link_as_one_id_per_position():
    _, q, _ = _draft(SamplingParams(temperature=0.0), 1.0, compact=False)
    tokens, sparse, _ = _draft(SamplingParams(temperature=0.0), 1.0, compact=True)
    msg = Speculation(3, [Source.HIT] * 5, tokens, sparse, 0.0, 0.0, 7, [2, 2, 1, 1, 1], [0, 1, -1, 2, 0])
    wire = encode(msg)
    assert [tuple(t.shape) for t in wire[3:]] == [(5, 4, 1), (5, 4, 1)]
    shapes = payload_shapes(wire[0])
    assert [(tuple(t.shape), t.dtype) for t in wire[1:]] == [(s, d) for s, d in shapes]
    back = decode(wire, 4, 50)
    assert torch.equal(back.q.dense(), q.dense()) and torch.equal(back.tokens, tokens)


def test_the_ranking_gives_the_dense_ranks_below_its_depth():
    g = torch.Generator().manual_seed(5)
    logits = torch.randint(0, 6, (40, 30), generator=g).float()  # many ties
    bonus = torch.randint(0, 30, (40,), generator=g)
    excluded = torch.randint(-1, 30, (40,), generator=g)
    dense = bonus_ranks(logits, bonus, excluded)
    assert TopLogits.of(logits, 30).ranks(bonus, excluded) == dense
    shallow = TopLogits.of(logits, 8).ranks(bonus, excluded)
    for d, s in zip(dense, shallow, strict=True):
        assert s == d if d < 7 else s >= 7  # beyond the kept depth: reported at least as deep


def test_a_support_id_outside_the_vocabulary_is_refused():
    tokens, sparse, _ = _draft(SamplingParams(temperature=0.0), 1.0, compact=True)
    wire = encode(Speculation(3, [Source.HIT] * 5, tokens, sparse, 0.0, 0.0, 7, [2, 2, 1, 1, 1], []))
    wire[3] = wire[3].clone()
    wire[3][0, 0, 0] = 50
    with pytest.raises(MalformedMessage, match="support ids out of range"):
        decode(wire, 4, 50)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_the_devices_ranking_is_the_cpus(data):
    R, V = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 12))
    # Small integer logits (ties everywhere, at the cut too), now and then a row banned to -inf.
    values = data.draw(st.lists(st.integers(-3, 3), min_size=R * V, max_size=R * V))
    logits = torch.tensor(values, dtype=torch.float32).reshape(R, V)
    if data.draw(st.booleans()):
        logits[0] = -torch.inf
    n = data.draw(st.integers(1, V))
    assert torch.equal(_ranked_on_device(logits, n), _ranked_on_host(logits, n))


def test_the_later_ranking_keeps_logits_up_to_its_cap_per_sequence_and_ranks_as_at_each_step(monkeypatch):
    """draft_compact(later=True) keeps each step's logits for the branches that are taken unless they pass
    LATER_RANKING_BYTES for each of its sequences; the ranking made later is the one made at each step."""
    from engine.ssd import tree
    from engine.ssd.tree import LaterRanking

    params, N, K, V, depth = SamplingParams(temperature=0.0), 5, 4, 50, 7
    kept = N * K * V * 4  # the logits a build over five branch rows keeps, float32
    monkeypatch.setattr(tree, "LATER_RANKING_BYTES", kept // 2)  # more than a build of one sequence may keep

    def build(sequences):
        model = tiny_lm(3, vocab_size=V)
        prompt = torch.randint(0, V, (N, 6), generator=torch.Generator().manual_seed(1))
        state = KVState(model, N, torch.device("cpu"))
        state.extend(prompt[:, :-1], None)
        gens = [torch.Generator().manual_seed(10 + i) for i in range(N)]
        rows = RowSampling([params] * N)
        return draft_compact(
            state, prompt[:, -1:], None, K, (1,) * K, 1.0, rows, gens, depth, later=True, sequences=sequences
        )

    _, _, per_step = build(sequences=1)  # 5 rows of one sequence: over its cap, ranked at each step
    _, _, later = build(sequences=N)  # one row a sequence: within each one's cap, kept for later
    assert isinstance(per_step, TopLogits) and isinstance(later, LaterRanking)
    index = torch.tensor([3, 0])
    assert torch.equal(later.rows(index).ids, per_step.ids[index])

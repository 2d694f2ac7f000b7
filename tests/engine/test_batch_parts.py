"""The parts continuous batching rests on: per-row warp and random streams, KV rows that join, fork and
leave, the SSD round message, and the scheduler's limits."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.kv_cache import KVState, right_aligned
from engine.sampling import RowSampling, sample, uniforms, warp, warp_rows
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler, SchedulerConfig
from engine.ssd.messages import Join, MalformedMessage, Round, decode, encode
from tests.engine.kv_alone import alone
from tests.engine.tiny import tiny_lm

SETTINGS = st.builds(
    SamplingParams,
    temperature=st.sampled_from([0.0, 0.5, 1.0, 1.7]),
    top_k=st.one_of(st.none(), st.integers(1, 12)),
    top_p=st.one_of(st.none(), st.floats(0.05, 1.0)),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(SETTINGS, min_size=1, max_size=6), st.integers(0, 2**31 - 1))
def test_per_row_warp_equals_each_rows_own_warp(params, seed):
    logits = torch.randn(len(params), 3, 10, generator=torch.Generator().manual_seed(seed))  # [B, T, V]
    out = warp_rows(logits, RowSampling(params))
    for b, p in enumerate(params):
        assert torch.equal(out[b], warp(logits[b], p))


def test_per_row_streams_do_not_depend_on_the_other_rows():
    def gens(*seeds):
        return [torch.Generator().manual_seed(s) for s in seeds]

    a = uniforms(gens(1, 2, 3), 3, 4, torch.float64, torch.device("cpu"))
    b = uniforms(gens(9, 2), 2, 4, torch.float64, torch.device("cpu"))
    assert torch.equal(a[1], b[1])  # row with seed 2, whatever shares the batch
    probs = torch.full((3, 5), 0.2)
    assert sample(probs, gens(4, 5, 6))[2] == sample(probs[:1], gens(6))[0]
    with pytest.raises(ValueError, match="one per row"):
        uniforms(gens(1), 2, 1, torch.float64, torch.device("cpu"))


def test_concat_fork_and_select_keep_every_rows_logits():
    model = tiny_lm(3)
    cpu = torch.device("cpu")
    a = KVState(model, 2, cpu)
    a.extend(*right_aligned([[1, 2, 3, 4, 5, 6], [7, 8]], 0, cpu))
    b = KVState(model, 1, cpu)
    b.extend(*right_aligned([[9, 10, 11]], 0, cpu))
    both = KVState.concat([a, b])  # b is narrower: holes on its left
    assert both.lengths.tolist() == [6, 2, 3]
    logits = both.extend(torch.tensor([[12], [13], [14]]))[:, -1]
    assert torch.allclose(logits[0], alone(model, [1, 2, 3, 4, 5, 6, 12]), atol=1e-5)
    assert torch.allclose(logits[2], alone(model, [9, 10, 11, 14]), atol=1e-5)
    twins = both.fork(torch.tensor([2, 2, 1]))
    out = twins.extend(torch.tensor([[15], [16], [17]]))[:, -1]
    assert torch.allclose(out[1], alone(model, [9, 10, 11, 14, 16]), atol=1e-5)
    assert torch.allclose(out[2], alone(model, [7, 8, 13, 17]), atol=1e-5)
    both.select(torch.tensor([1, 2]))  # the long row leaves: its columns are dropped
    assert both.mask.shape[1] < 7 and both.lengths.tolist() == [3, 4]
    assert torch.allclose(both.extend(torch.tensor([[18], [19]]))[1, -1], alone(model, [9, 10, 11, 14, 19]), atol=1e-5)


def test_round_message_round_trips_and_rejects_inconsistent_joins():
    joins = [Join(7, [1, 2, 3], 4, 0.7, 5, 0.9, 2**62), Join(8, [5], 6, 0.0, 0, 1.0, 0)]
    msg = Round(3, [1, 2], [9, 9], [True, False], 12.5, joins, K=2, V=50)
    back = decode(encode(msg), expect_K=2, expect_V=50)
    assert back == msg
    tensors = encode(msg)
    tensors[1][-1] = 50  # a prompt token outside the vocabulary
    with pytest.raises(MalformedMessage, match="joining prompts"):
        decode(tensors, expect_K=2, expect_V=50)


def test_scheduler_admits_first_come_first_served_within_its_limits():
    class Seq:
        def __init__(self, n):
            self.prompt_ids = [0] * n

    s = Scheduler(SchedulerConfig(max_num_seqs=3, max_prefill_tokens=10))
    s.waiting.extend(Seq(n) for n in (4, 5, 2, 20, 1))
    assert [len(q.prompt_ids) for q in s.admit(running=0)] == [4, 5]  # 4 + 5 + 2 > 10
    assert [len(q.prompt_ids) for q in s.admit(running=2)] == [2]  # one place left
    assert [len(q.prompt_ids) for q in s.admit(running=0)] == [20]  # too long for the limit: alone
    assert [len(q.prompt_ids) for q in s.admit(running=0)] == [1]
    with pytest.raises(ValueError, match="max_num_seqs must be an integer >= 1"):
        SchedulerConfig(max_num_seqs=0)

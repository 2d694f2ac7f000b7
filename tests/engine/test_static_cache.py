"""The static slot cache (engine.static_cache) run eagerly in its buckets: ragged rows, per-row roll-back, rows
that join, leave and fork give the logits of each row run alone, and slots are reused, never copied, except
by fork."""

import gc

import pytest
import torch

from engine.compile_config import CompileConfig
from engine.compiled import SlotModel
from engine.kv_cache import KVState, new_state
from tests.engine.kv_alone import alone
from tests.engine.tiny import tiny_lm

ATOL = 1e-5  # fp32 block shapes round differently; anything larger is a real bug
CPU = torch.device("cpu")
EAGER = CompileConfig(max_len=32, batch_buckets=(2, 4), compiled=False)


def slot_model(seed: int, rows: int = 4, settings: CompileConfig = EAGER, max_tokens: int = 3) -> SlotModel:
    return SlotModel(tiny_lm(seed), settings, CPU, name="target", max_tokens=max_tokens, rows=rows)


def test_new_state_makes_a_slot_state_for_a_slot_model_and_a_kv_state_otherwise():
    runner = slot_model(0)
    assert type(new_state(runner, 2, CPU)).__name__ == "SlotState"
    assert type(new_state(runner.model, 2, CPU)) is KVState


def test_ragged_prefill_matches_each_row_alone():
    runner = slot_model(0)
    state = new_state(runner, 2, CPU)
    tokens = torch.tensor([[0, 0, 5, 6, 7], [1, 2, 3, 4, 5]])
    valid = torch.tensor([[False, False, True, True, True], [True] * 5])
    logits = state.extend(tokens, valid, logits_to_keep=1)[:, -1]
    assert torch.allclose(logits[0], alone(runner.model, [5, 6, 7]), atol=ATOL)
    assert torch.allclose(logits[1], alone(runner.model, [1, 2, 3, 4, 5]), atol=ATOL)
    assert state.lengths.tolist() == [3, 5]


def test_a_block_in_a_bucket_is_padded_and_gives_every_position_of_each_row():
    runner = slot_model(1)
    state = new_state(runner, 3, CPU)  # 3 rows run in the bucket of 4
    state.extend(torch.tensor([[1, 2], [3, 4], [5, 6]]))
    logits = state.extend(
        torch.tensor([[0, 7], [8, 9], [0, 10]]), torch.tensor([[False, True], [True] * 2, [False, True]])
    )
    assert logits.shape[:2] == (3, 2)  # a 2-token block runs padded to 3 tokens, holes on the left
    assert torch.allclose(logits[0, -1], alone(runner.model, [1, 2, 7]), atol=ATOL)
    assert torch.allclose(logits[1, 0], alone(runner.model, [3, 4, 8]), atol=ATOL)
    assert torch.allclose(logits[1, 1], alone(runner.model, [3, 4, 8, 9]), atol=ATOL)
    assert torch.allclose(logits[2, -1], alone(runner.model, [5, 6, 10]), atol=ATOL)
    assert (4, 3, 33) in runner.first_call_s


def test_rollback_only_lowers_the_lengths_and_the_next_tokens_overwrite_the_rejected_ones():
    runner = slot_model(1)
    state = new_state(runner, 2, CPU)
    state.extend(torch.tensor([[1, 2], [3, 4]]))
    state.extend(torch.tensor([[5, 6, 7], [8, 9, 10]]))
    state.rollback(torch.tensor([3, 1]))  # row 0 forgets 5,6,7; row 1 forgets 10
    assert state.lengths.tolist() == [2, 4]
    logits = state.extend(torch.tensor([[11], [12]]))[:, -1]
    assert torch.allclose(logits[0], alone(runner.model, [1, 2, 11]), atol=ATOL)
    assert torch.allclose(logits[1], alone(runner.model, [3, 4, 8, 9, 12]), atol=ATOL)


def test_rollback_refuses_a_negative_or_too_long_drop():
    state = new_state(slot_model(2), 2, CPU)
    state.extend(torch.tensor([[1, 2, 3], [4, 5, 6]]))
    for drop in ([-1, 0], [0, 4]):
        with pytest.raises(ValueError, match="can forget 0 up to its own length"):
            state.rollback(torch.tensor(drop))
    assert state.lengths.tolist() == [3, 3]


def test_select_keeps_rows_in_their_slots_and_frees_the_others():
    runner = slot_model(3)
    state = new_state(runner, 3, CPU)
    state.extend(torch.tensor([[1, 2], [3, 4], [5, 6]]))
    slots = list(state.slots)
    state.select(torch.tensor([2, 0]))
    assert state.slots == [slots[2], slots[0]]
    assert slots[1] in runner.cache.returned  # free again, for the next allocation
    logits = state.extend(torch.tensor([[7], [8]]))[:, -1]
    assert torch.allclose(logits[0], alone(runner.model, [5, 6, 7]), atol=ATOL)
    assert torch.allclose(logits[1], alone(runner.model, [1, 2, 8]), atol=ATOL)


def test_concat_joins_rows_without_moving_them_and_fork_copies_rows_into_new_slots():
    runner = slot_model(4)
    a, b = new_state(runner, 1, CPU), new_state(runner, 1, CPU)
    a.extend(torch.tensor([[1, 2, 3]]))
    b.extend(torch.tensor([[4, 5]]))
    slots = a.slots + b.slots
    both = KVState.concat([a, b])  # the engine's call: it dispatches to the slot state's own concat
    assert both.slots == slots and a.batch_size == b.batch_size == 0
    branches = both.fork(torch.tensor([1, 1, 0]))
    assert not set(branches.slots) & set(both.slots)
    branches.rollback(torch.tensor([1, 0, 2]))
    logits = branches.extend(torch.tensor([[9], [10], [11]]))[:, -1]
    assert torch.allclose(logits[0], alone(runner.model, [4, 9]), atol=ATOL)
    assert torch.allclose(logits[1], alone(runner.model, [4, 5, 10]), atol=ATOL)
    assert torch.allclose(logits[2], alone(runner.model, [1, 11]), atol=ATOL)
    after = both.extend(torch.tensor([[12], [13]]))[:, -1]  # the forked rows are untouched by their copies
    assert torch.allclose(after[0], alone(runner.model, [1, 2, 3, 12]), atol=ATOL)
    assert torch.allclose(after[1], alone(runner.model, [4, 5, 13]), atol=ATOL)


def test_a_dropped_state_gives_its_slots_back_and_the_cache_grows_when_full():
    runner = slot_model(5, rows=2)
    state = new_state(runner, 2, CPU)
    state.extend(torch.tensor([[1, 2], [3, 4]]))
    more = new_state(runner, 3, CPU)  # 5 rows alive in a cache made for 2: it grows, keeping what it held
    more.extend(torch.tensor([[5], [6], [7]]))
    assert torch.allclose(state.extend(torch.tensor([[8], [9]]))[1, -1], alone(runner.model, [3, 4, 9]), atol=ATOL)
    free = runner.cache.free_slots
    del more
    gc.collect()
    assert runner.cache.free_slots == free + 3


def test_a_row_longer_than_max_len_is_refused():
    state = new_state(slot_model(6, settings=CompileConfig(max_len=4, batch_buckets=(2,), compiled=False)), 1, CPU)
    with pytest.raises(ValueError, match="max_len"):
        state.extend(torch.tensor([[1, 2, 3, 4, 5]]))


@pytest.mark.parametrize("strategy", ["ar", "sd", "ssd"])
def test_a_request_as_long_as_the_cache_allows_runs_to_its_end_and_a_longer_one_is_refused(strategy):
    from engine import LLM, SamplingParams, SpeculativeConfig
    from engine.config import DraftPlacement
    from tests.engine.tiny import noisy_copy

    target = tiny_lm(0, scale=4.0)
    spec = SpeculativeConfig(K=3, placement=DraftPlacement(in_process=True))
    settings = CompileConfig(max_len=24, batch_buckets=(2,), compiled=False)
    llm = LLM(
        target,
        None if strategy == "ar" else noisy_copy(target, 1.0),
        strategy=strategy,
        speculative=spec,
        compile=settings,
    )
    room = llm.room([1, 2, 3])  # SSD's branch rows draft K past the speculation: its room is K shorter
    longest = SamplingParams(temperature=0, max_new_tokens=room, stop_on_eos=False)
    assert llm.generate([[1, 2, 3]], longest)[0].token_ids == LLM(target).generate([[1, 2, 3]], longest)[0].token_ids
    with pytest.raises(ValueError, match="exceeds the model's context"):
        llm.generate([[1, 2, 3]], SamplingParams(max_new_tokens=room + 1))

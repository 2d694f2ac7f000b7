"""`saguaro calibrate` times the target as the engine runs it: each AR step and verify is one round of the
engine's decode loop (its record's verify_ms), the batch rolls back exactly after it, and at batch > 1 the
rows differ in length as a real batch's do, so attention gets the mask (and the kernel) the engine's does."""

import pytest
import torch

from engine.kv_cache import KVState
from engine.loading.tiny import tiny_model
from saguaro.calibration.target_rounds import TargetRounds, ragged
from tests.engine.tiny import spy_on_sdpa

IDS = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4]


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=0)  # 4 attention heads over 2 key/value heads (grouped, as Qwen2.5's)


def prefilled(model, n: int) -> KVState:
    state = KVState(model, 1, torch.device("cpu"))
    state.extend(torch.tensor([IDS[:n]]), logits_to_keep=1)
    return state


def test_ragged_rows_are_copies_with_every_row_but_the_first_one_shorter(target):
    base = prefilled(target, 10)
    rows = ragged(base, 3)
    assert rows.lengths.tolist() == [10, 9, 9]
    assert rows.mask[0].all() and rows.mask[1:, :9].all() and not rows.mask[1:, 9].any()
    assert torch.equal(rows.cache.layers[0].keys[2], base.cache.layers[0].keys[0])
    one = ragged(base, 1)  # a batch of one has no hole, in the engine as here
    assert one.lengths.tolist() == [10] and one.mask.all()


def test_every_one_token_step_gives_attention_a_mask_with_or_without_holes(target, monkeypatch):
    """transformers drops an all-ones mask for a one-token forward and asks SDPA for enable_gqa (many times
    slower on CPU in bfloat16); KVState passes a 4-D mask, so equal rows, ragged rows and a single row all take
    the masked path, and the calibration's steps cost what the engine's do."""
    calls = spy_on_sdpa(monkeypatch)
    base = prefilled(target, 10)
    for rows in (
        base.fork(torch.zeros(2, dtype=torch.long)),
        ragged(base, 2),
        base.fork(torch.zeros(1, dtype=torch.long)),
    ):
        calls.clear()
        rows.extend(torch.full((rows.batch_size, 1), 7))
        assert calls and all(not no_mask and not gqa for no_mask, gqa in calls)


@pytest.mark.parametrize("temperature", [0.0, 0.7])
@pytest.mark.parametrize("T", [1, 2, 3, 5])
def test_a_timed_step_is_one_round_of_the_engines_loop_and_rolls_back_exactly(target, T, temperature):
    K, c, b = 2, 12, 3
    rounds = TargetRounds(target, IDS, K, widths=[2, 5], temperature=temperature)
    rounds.batch(prefilled(target, c), b)
    assert all(seq.params.temperature == temperature for seq in rounds.loop.running)  # the workload's sampling
    state = rounds.loop.state
    mask, lengths, keys = state.mask.clone(), state.lengths.clone(), state.cache.layers[0].keys.clone()
    for _ in range(2):
        t0, t1 = rounds.step(T)
        record = rounds.loop.recorder.records[-1]
        assert (record.strategy, record.K, record.batch_size, record.context_len) == (
            "ar" if T == 1 else "sd",
            T - 1,
            b,
            c,
        )
        assert record.phase == "decode" and len(record.accepted) == b
        assert (t1 - t0) * 1e3 == pytest.approx(record.verify_ms, rel=1e-9)
        state = rounds.loop.state
        assert torch.equal(state.mask, mask) and torch.equal(state.lengths, lengths)
        assert torch.equal(state.cache.layers[0].keys, keys)
        assert len(rounds.loop.running) == b


def test_a_round_of_another_width_is_refused(target):
    rounds = TargetRounds(target, IDS, 2, widths=[4])
    rounds.batch(prefilled(target, 8), 2)
    with pytest.raises(ValueError, match="1 \\(AR\\) or one of \\[3, 4\\]"):
        rounds.step(2)
    with pytest.raises(ValueError, match="too few for a block of 3 drafted tokens"):
        rounds.batch(prefilled(target, len(IDS) - 3), 1)

"""KVState: ragged batches and per-row roll-back give the logits of each row run alone."""

import torch

from engine.kv_cache import KVState, cache_keyword
from tests.engine.kv_alone import alone
from tests.engine.tiny import spy_on_sdpa, tiny_lm

ATOL = 1e-5  # fp32 block shapes round differently; anything larger is a real bug


def test_ragged_prefill_matches_each_row_alone():
    model = tiny_lm(0)
    state = KVState(model, 2, torch.device("cpu"))
    tokens = torch.tensor([[0, 0, 5, 6, 7], [1, 2, 3, 4, 5]])
    valid = torch.tensor([[False, False, True, True, True], [True] * 5])
    logits = state.extend(tokens, valid, logits_to_keep=1)[:, -1]
    assert torch.allclose(logits[0], alone(model, [5, 6, 7]), atol=ATOL)
    assert torch.allclose(logits[1], alone(model, [1, 2, 3, 4, 5]), atol=ATOL)
    assert state.lengths.tolist() == [3, 5]


def test_rollback_per_row_restores_the_shorter_prefix():
    model = tiny_lm(1)
    state = KVState(model, 2, torch.device("cpu"))
    state.extend(torch.tensor([[1, 2], [3, 4]]))
    state.extend(torch.tensor([[5, 6, 7], [8, 9, 10]]))
    state.rollback(torch.tensor([3, 1]))  # row 0 forgets 5,6,7; row 1 forgets 10
    assert state.lengths.tolist() == [2, 4]
    logits = state.extend(torch.tensor([[11], [12]]))[:, -1]
    assert torch.allclose(logits[0], alone(model, [1, 2, 11]), atol=ATOL)
    assert torch.allclose(logits[1], alone(model, [3, 4, 8, 9, 12]), atol=ATOL)


def test_rollback_refuses_a_negative_or_too_long_drop_and_keeps_the_cache():
    """A negative drop would look like a roll-forward (the lengths grow, the cache does not): a timing script
    that "rolled" a 128-token cache to 256 and 512 this way timed every build at 128."""
    import pytest

    model = tiny_lm(2)
    state = KVState(model, 2, torch.device("cpu"))
    state.extend(torch.tensor([[1, 2, 3], [4, 5, 6]]))
    for drop in ([-1, 0], [0, 4]):
        with pytest.raises(ValueError, match="can forget 0 up to its own length"):
            state.rollback(torch.tensor(drop))
    assert state.lengths.tolist() == [3, 3] and state.cache.get_seq_length() == 3
    state.rollback(torch.tensor([3, 0]))  # a whole row may go
    assert state.lengths.tolist() == [0, 3]


def test_rollback_of_every_row_frees_the_slots():
    model = tiny_lm(2)
    state = KVState(model, 2, torch.device("cpu"))
    state.extend(torch.tensor([[1, 2, 3], [4, 5, 6]]))
    state.rollback(torch.tensor([2, 2]))
    assert state.mask.shape[1] == 1
    assert state.cache.get_seq_length() == 1


def test_select_keeps_rows_and_their_caches():
    model = tiny_lm(3)
    state = KVState(model, 3, torch.device("cpu"))
    state.extend(torch.tensor([[1, 2], [3, 4], [5, 6]]))
    state.select(torch.tensor([0, 2]))
    logits = state.extend(torch.tensor([[7], [8]]))[:, -1]
    assert torch.allclose(logits[1], alone(model, [5, 6, 8]), atol=ATOL)


def test_logits_to_keep_gives_the_last_positions_through_a_contiguous_head_input():
    """The head gets a contiguous [B, k, H] (a strided slice made torch run it as a bmm over B weight copies,
    ~2.5 s per row at prefill for the default target), and the kept logits are the full forward's last k."""
    model = tiny_lm(3)
    tokens = torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]])
    full = KVState(model, 2, torch.device("cpu")).extend(tokens)
    seen = []
    hook = model.get_output_embeddings().register_forward_pre_hook(
        lambda module, args: seen.append(args[0].is_contiguous())
    )
    try:
        for k in (1, 2):
            kept = KVState(model, 2, torch.device("cpu")).extend(tokens, logits_to_keep=k)
            assert kept.shape == (2, k, full.shape[-1])
            assert torch.allclose(kept, full[:, -k:], atol=ATOL)
    finally:
        hook.remove()
    assert seen == [True, True]


def test_a_one_token_step_without_holes_still_gives_attention_a_mask_and_the_same_logits(monkeypatch):
    """transformers drops an all-ones mask for a one-token forward and asks SDPA for enable_gqa, a kernel many
    times slower on CPU in bfloat16 than the masked one a batch with holes gets. KVState passes a 4-D mask, so
    every one-token step (batch 1 above all) takes the masked kernel, with the logits of the unmasked one."""
    model = tiny_lm(2)  # 4 query heads over 2 key/value heads: grouped, as Qwen2.5's
    assert model.config._attn_implementation == "sdpa"
    calls = spy_on_sdpa(monkeypatch)
    state = KVState(model, 1, torch.device("cpu"))
    state.extend(torch.tensor([[1, 2, 3, 4, 5, 6]]), logits_to_keep=1)
    calls.clear()
    logits = state.extend(torch.tensor([[7]]))[:, -1]
    assert calls and all(not no_mask and not gqa for no_mask, gqa in calls)
    assert torch.allclose(logits[0], alone(model, [1, 2, 3, 4, 5, 6, 7]), atol=ATOL)
    before = KVState(model, 1, torch.device("cpu"))  # the 2-D mask the engine passed before: the unmasked kernel
    before.extend(torch.tensor([[1, 2, 3, 4, 5, 6]]), logits_to_keep=1)
    calls.clear()
    with torch.inference_mode():
        plain = model(
            input_ids=torch.tensor([[7]]),
            attention_mask=torch.ones(1, 7, dtype=torch.long),
            position_ids=torch.tensor([[6]]),
            use_cache=True,
            **{cache_keyword(model): before.cache},
        ).logits[:, -1]
    assert calls and all(no_mask and gqa for no_mask, gqa in calls)
    assert torch.allclose(logits, plain, atol=ATOL)

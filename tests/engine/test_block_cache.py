"""The block KV cache (engine.blocks): every row's logits are those of its tokens run alone, through ragged
feeds, roll-backs, selections, forks that share blocks and concatenations, and no block is lost or leaked."""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.blocks import BlockModel, BlockState, KVCacheFull
from tests.engine.kv_alone import alone
from tests.engine.tiny import tiny_lm

ATOL = 1e-5  # fp32 block shapes round differently; anything larger is a real bug
MODEL = tiny_lm(0)


def block_model(block_size: int = 4, max_bytes: int | None = None) -> BlockModel:
    return BlockModel(MODEL, torch.device("cpu"), block_size=block_size, max_bytes=max_bytes)


def feed(state: BlockState, rows: list[list[int]]) -> torch.Tensor:
    """Feed each row its tokens (right-aligned, holes on the left); the newest logits per row [B, V]."""
    width = max(len(r) for r in rows)
    tokens = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    return state.extend(tokens, fed=[len(r) for r in rows])[:, -1]


def test_ragged_prefill_matches_each_row_alone():
    state = block_model().new_kv_state(2, torch.device("cpu"))
    logits = feed(state, [[5, 6, 7], [1, 2, 3, 4, 5, 6, 7, 8, 9]])
    assert torch.allclose(logits[0], alone(MODEL, [5, 6, 7]), atol=ATOL)
    assert torch.allclose(logits[1], alone(MODEL, [1, 2, 3, 4, 5, 6, 7, 8, 9]), atol=ATOL)
    assert state.host_lengths == [3, 9]


def test_rollback_frees_the_blocks_past_the_new_length_and_reads_nothing_back():
    model = block_model(block_size=4)
    state = model.new_kv_state(1, torch.device("cpu"))
    feed(state, [list(range(1, 11))])  # 10 tokens: 3 blocks
    assert model.pool.used_blocks == 3
    state.rollback([7])  # 3 tokens left: 1 block
    assert model.pool.used_blocks == 1 and state.host_lengths == [3]
    logits = feed(state, [[11]])
    assert torch.allclose(logits[0], alone(MODEL, [1, 2, 3, 11]), atol=ATOL)


def test_rollback_refuses_a_negative_or_too_long_drop_and_keeps_the_rows():
    state = block_model().new_kv_state(2, torch.device("cpu"))
    feed(state, [[1, 2, 3], [4, 5, 6]])
    for drop in ([-1, 0], [0, 4]):
        with pytest.raises(ValueError, match="can forget 0 up to its own length"):
            state.rollback(drop)
    assert state.host_lengths == [3, 3]


def test_a_fork_shares_blocks_and_copies_only_the_block_it_writes_into():
    model = block_model(block_size=4)
    state = model.new_kv_state(1, torch.device("cpu"))
    feed(state, [list(range(1, 7))])  # 6 tokens: a full block and a half one
    branches = state.fork([0, 0, 0])
    assert model.pool.used_blocks == 2  # shared, not copied
    logits = feed(branches, [[20], [21], [22]])
    assert model.pool.used_blocks == 2 + 3  # each branch copied the half block it wrote into
    for i, t in enumerate((20, 21, 22)):
        assert torch.allclose(logits[i], alone(MODEL, list(range(1, 7)) + [t]), atol=ATOL)
    logits = feed(state, [[9]])  # the parent's own block was never written by a branch
    assert torch.allclose(logits[0], alone(MODEL, list(range(1, 7)) + [9]), atol=ATOL)


def test_dropping_a_state_gives_its_blocks_back():
    model = block_model(block_size=4)
    state = model.new_kv_state(2, torch.device("cpu"))
    feed(state, [[1, 2, 3, 4, 5], [6, 7]])
    fork = state.fork([1, 0])
    del state
    assert model.pool.used_blocks == 3  # the fork still holds them
    del fork
    assert model.pool.used_blocks == 0


def test_a_budget_too_small_for_a_forward_raises_kv_cache_full():
    model = block_model(block_size=4)
    per_block = model.pool.bytes_per_block
    model = block_model(block_size=4, max_bytes=3 * per_block)  # block 0 is the scratch block: 2 usable
    state = model.new_kv_state(1, torch.device("cpu"))
    feed(state, [list(range(1, 9))])
    with pytest.raises(KVCacheFull, match="budget"):
        feed(state, [[9]])


# -- random sequences of operations against each row's tokens run alone --------------------------------------------
Op = st.one_of(
    st.tuples(st.just("feed"), st.lists(st.integers(0, 4), min_size=1, max_size=4)),
    st.tuples(st.just("rollback"), st.lists(st.integers(0, 3), min_size=1, max_size=4)),
    st.tuples(st.just("select"), st.randoms(use_true_random=False)),
    st.tuples(st.just("fork"), st.lists(st.integers(0, 3), min_size=1, max_size=5)),
    st.tuples(st.just("concat"), st.lists(st.integers(1, 3), min_size=1, max_size=2)),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(1, 5), min_size=1, max_size=3), st.lists(Op, max_size=8), st.integers(1, 5))
def test_any_sequence_of_operations_gives_each_row_its_logits_alone(prompt_lengths, ops, block_size):
    model = block_model(block_size)
    gen = np.random.default_rng(len(ops) * 7 + block_size)
    state = model.new_kv_state(len(prompt_lengths), torch.device("cpu"))
    rows = [gen.integers(1, 40, n).tolist() for n in prompt_lengths]
    feed(state, rows)
    for kind, arg in ops:
        B = len(rows)
        if B == 0:
            break
        if kind == "feed":
            new = [gen.integers(1, 40, arg[b % len(arg)]).tolist() for b in range(B)]
            if not any(new):
                continue
            logits = feed(state, new)
            rows = [r + n for r, n in zip(rows, new, strict=True)]
            for b in range(B):
                if new[b]:
                    assert torch.allclose(logits[b], alone(MODEL, rows[b]), atol=ATOL)
        elif kind == "rollback":
            drop = [min(arg[b % len(arg)], len(rows[b]) - 1) for b in range(B)]
            state.rollback(drop)
            rows = [r[: len(r) - d] for r, d in zip(rows, drop, strict=True)]
        elif kind == "select":
            keep = sorted(arg.sample(range(B), arg.randint(1, B)))
            arg.shuffle(keep)
            state.select(keep)
            rows = [rows[i] for i in keep]
        elif kind == "fork":
            index = [i % B for i in arg]
            state, rows = state.fork(index), [list(rows[i]) for i in index]  # the old state is dropped here
        else:  # concat: new rows prefilled apart join at the end
            extra = [gen.integers(1, 40, n).tolist() for n in arg]
            other = model.new_kv_state(len(extra), torch.device("cpu"))
            feed(other, extra)
            state = BlockState.concat([state, other])
            rows = rows + extra
        assert state.host_lengths == [len(r) for r in rows]
    if rows:
        logits = feed(state, [[7]] * len(rows))
        for b, r in enumerate(rows):
            assert torch.allclose(logits[b], alone(MODEL, r + [7]), atol=ATOL)
    del state
    assert model.pool.used_blocks == 0  # nothing leaked


# -- tree decode --------------------------------------------------------------------------------------------------
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(1, 9), min_size=1, max_size=3), st.integers(1, 4), st.integers(1, 5), st.data())
def test_tree_branches_get_the_logits_of_each_branch_run_alone(prompt_lengths, steps, block_size, data):
    model = block_model(block_size)
    gen = np.random.default_rng(sum(prompt_lengths) * 13 + steps)
    rows = [gen.integers(1, 40, n).tolist() for n in prompt_lengths]
    state = model.new_kv_state(len(rows), torch.device("cpu"))
    feed(state, rows)
    parent = data.draw(st.lists(st.integers(0, len(rows) - 1), min_size=1, max_size=7))
    keep = [data.draw(st.integers(1, len(rows[p]))) for p in parent]
    tree = state.tree(parent, keep, steps)
    fed = [[] for _ in parent]
    for _ in range(steps):
        tokens = gen.integers(1, 40, len(parent)).tolist()
        logits = tree.extend(torch.tensor(tokens)[:, None])[:, -1]
        for i, (p, k, t) in enumerate(zip(parent, keep, tokens, strict=True)):
            fed[i].append(t)
            assert torch.allclose(logits[i], alone(MODEL, rows[p][:k] + fed[i]), atol=ATOL)
    taken = tree.take(list(range(len(parent)))[::-1])  # rows of their own, any order
    logits = feed(taken, [[7]] * len(parent))
    for j, i in enumerate(reversed(range(len(parent)))):
        assert torch.allclose(logits[j], alone(MODEL, rows[parent[i]][: keep[i]] + fed[i] + [7]), atol=ATOL)
    logits = feed(state, [[9]] * len(rows))  # the parents are as they were
    for b, r in enumerate(rows):
        assert torch.allclose(logits[b], alone(MODEL, r + [9]), atol=ATOL)
    del state, tree, taken
    assert model.pool.used_blocks == 0  # nothing leaked


def test_a_tree_reads_each_rows_prefix_once_per_step():
    """The forward's rows are the parent rows, not the branches: its keys hold each prefix once."""
    model = block_model(block_size=4)
    state = model.new_kv_state(2, torch.device("cpu"))
    feed(state, [list(range(1, 31)), list(range(1, 21))])
    tree = state.tree([0, 0, 0, 1, 1], [30, 29, 28, 20, 19], steps=3)
    widths = []
    forward = model.forward

    def spy(tokens, positions, mask, binding, width, keep):
        widths.append((tuple(tokens.shape), tuple(binding.read.shape)))
        return forward(tokens, positions, mask, binding, width, keep)

    model.forward = spy
    for _ in range(3):
        tree.extend(torch.tensor([[3]] * 5))
    # 2 rows of 3 queries; each row's columns: its 30 (20) prefix tokens, then the 3 (2) branches' areas of 3 steps
    # each (the tokens fed so far, and the columns of the later ones, masked), + scratch: the same at every step
    assert widths == [((2, 3), (2, 30 + 3 * 3 + 1))] * 3


# -- the prefix cache -------------------------------------------------------------------------------------------
def test_a_row_takes_the_cached_blocks_of_a_shared_prefix_and_gets_the_logits_it_would_alone():
    model = block_model(block_size=4)
    first = model.new_kv_state(1, torch.device("cpu"))
    prompt = list(range(1, 15))  # 14 tokens: 3 full blocks
    feed(first, [prompt])
    first.register(0, prompt)
    second = model.new_kv_state(1, torch.device("cpu"))
    other = prompt[:10] + [30, 31, 32]  # shares 10 tokens: 2 full blocks
    held = second.reuse_prefix(0, other, len(other) - 1)
    assert held == 8 and model.pool.hit_tokens == 8
    logits = feed(second, [other[held:]])
    assert torch.allclose(logits[0], alone(MODEL, other), atol=ATOL)
    logits = feed(first, [[40]])  # the first row is as it was
    assert torch.allclose(logits[0], alone(MODEL, prompt + [40]), atol=ATOL)


def test_a_prefix_is_matched_by_its_tokens_and_never_past_the_last_one():
    model = block_model(block_size=4)
    row = model.new_kv_state(1, torch.device("cpu"))
    prompt = list(range(1, 9))  # 2 full blocks
    feed(row, [prompt])
    row.register(0, prompt)
    probe = model.new_kv_state(3, torch.device("cpu"))
    assert probe.reuse_prefix(0, prompt, len(prompt) - 1) == 4  # the last token is always fed
    assert probe.reuse_prefix(1, [9] + prompt[1:], 7) == 0  # another first block: nothing
    assert probe.reuse_prefix(2, prompt[:4] + [0, 6, 7, 8, 9], 8) == 4  # the chain breaks at the second block


def test_cached_blocks_no_row_holds_are_kept_until_their_slots_are_needed():
    model = block_model(block_size=4, max_bytes=None)
    row = model.new_kv_state(1, torch.device("cpu"))
    prompt = list(range(1, 13))
    feed(row, [prompt])
    row.register(0, prompt)
    del row
    assert model.pool.used_blocks == 0 and len(model.pool.evictable) == 3  # cached, held by no one
    again = model.new_kv_state(1, torch.device("cpu"))
    assert again.reuse_prefix(0, prompt + [5], 12) == 12
    assert len(model.pool.evictable) == 0
    del again
    capacity = model.pool.capacity
    hungry = model.new_kv_state(1, torch.device("cpu"))
    feed(hungry, [[7] * (4 * (capacity - 1))])  # every block: the cached ones are taken back before the pool grows
    assert model.pool.capacity == capacity and not model.pool.block_of


def test_a_growing_row_takes_the_free_blocks_after_its_own_so_its_keys_stay_a_view():
    model = block_model(block_size=4)
    other = model.new_kv_state(1, torch.device("cpu"))
    feed(other, [[9, 9, 9]])  # block 1
    row = model.new_kv_state(1, torch.device("cpu"))
    prompt = list(range(1, 9))
    feed(row, [prompt])  # blocks 2 and 3
    del other  # block 1 free again: the lowest free block, but not the one after the row's
    views = []
    forward = model.forward

    def spy(tokens, positions, mask, binding, width, keep):
        views.append(binding.view is not None)
        return forward(tokens, positions, mask, binding, width, keep)

    model.forward = spy
    tokens = [20, 21, 22, 23, 24, 25]
    logits = None
    for t in tokens:  # one token a forward, as a single request decodes
        logits = feed(row, [[t]])
    assert row._rows.table[0, :4].tolist() == [2, 3, 4, 5]  # in order
    assert all(views)  # every forward read its keys as a view of the pool, nothing gathered
    assert torch.allclose(logits[0], alone(MODEL, prompt + tokens), atol=ATOL)
    del row
    assert model.pool.used_blocks == 0


def test_a_growing_row_leaves_cached_blocks_to_their_prefix():
    model = block_model(block_size=4)
    first = model.new_kv_state(1, torch.device("cpu"))
    prompt = list(range(1, 13))  # 3 full blocks, cached when the row is dropped
    feed(first, [prompt])
    first.register(0, prompt)
    del first
    second = model.new_kv_state(1, torch.device("cpu"))
    assert second.reuse_prefix(0, prompt[:4] + [30, 31, 32, 33, 34], 8) == 4  # block 1; blocks 2 and 3 stay cached
    logits = feed(second, [[30, 31, 32, 33, 34]])
    assert 2 not in second._rows.table[0].tolist()  # not taken for the row's order
    assert torch.allclose(logits[0], alone(MODEL, prompt[:4] + [30, 31, 32, 33, 34]), atol=ATOL)
    third = model.new_kv_state(1, torch.device("cpu"))
    assert third.reuse_prefix(0, prompt + [1], 12) == 12  # the whole prefix is still found


def test_a_row_never_writes_into_a_cached_block():
    model = block_model(block_size=4)
    row = model.new_kv_state(1, torch.device("cpu"))
    prompt = list(range(1, 9))
    feed(row, [prompt])
    row.register(0, prompt)
    row.rollback([2])  # back into the second (cached) block
    logits = feed(row, [[20, 21]])  # copies the block before writing
    assert torch.allclose(logits[0], alone(MODEL, prompt[:6] + [20, 21]), atol=ATOL)
    other = model.new_kv_state(1, torch.device("cpu"))
    assert other.reuse_prefix(0, prompt + [1], 8) == 8
    logits = feed(other, [[1]])
    assert torch.allclose(logits[0], alone(MODEL, prompt + [1]), atol=ATOL)  # the cached block still holds prompt's


# -- through the engine -----------------------------------------------------------------------------------------
def test_greedy_output_is_the_same_with_the_prefix_cache_on_and_off():
    from engine import LLM, SamplingParams, SpeculativeConfig
    from engine.config import DraftPlacement
    from tests.engine.tiny import noisy_copy

    target = tiny_lm(3, scale=3.0)
    draft = noisy_copy(target, 0.5)
    system = list(range(1, 40))  # a shared 39-token system prompt
    prompts = [system + [40 + i, 41 + i] for i in range(4)]
    params = SamplingParams(temperature=0.0, max_new_tokens=20, stop_on_eos=False)
    outs = {}
    for strategy in ("ar", "sd", "ssd"):
        for caching in (True, False):
            spec = SpeculativeConfig(K=3, placement=DraftPlacement(in_process=True))
            with LLM(
                target,
                None if strategy == "ar" else draft,
                strategy=strategy,
                speculative=spec,
                prefix_caching=caching,
                max_num_seqs=2,
            ) as llm:
                first = llm.generate(prompts, params)  # the later prompts join after the first ones finish
                again = llm.generate(prompts, params)
                outs[strategy, caching] = [o.token_ids for o in first], [o.token_ids for o in again]
                stats = llm.loop.stats
                cached = [o.metrics.cached_prompt_tokens for o in again]
                if caching:
                    assert min(cached) >= 32 and stats.prefix_cache_hits > 0  # the shared blocks were reused
                else:
                    assert max(cached) == 0 and stats.prefix_cache_hits == 0
    reference = outs["ar", False][0]
    for key, (first, again) in outs.items():
        assert first == reference and again == reference, key


def test_a_kv_cache_budget_refuses_a_request_that_could_never_fit_and_admits_the_rest_in_turn():
    from engine import LLM, SamplingParams

    target = tiny_lm(4)
    probe = LLM(target, strategy="ar")
    per_block = probe._fed_target.pool.bytes_per_block
    probe.close()
    with LLM(target, strategy="ar", kv_cache_memory=10 * per_block) as llm:  # 9 usable blocks of 16 tokens
        with pytest.raises(ValueError, match="kv_cache_memory"):
            llm.make_sequence(list(range(1, 100)), SamplingParams(max_new_tokens=100))
        params = SamplingParams(temperature=0.0, max_new_tokens=40, stop_on_eos=False)
        out = llm.generate([list(range(1, 30 + i)) for i in range(4)], params)  # ~5 blocks each: two at a time
        assert [len(o.token_ids) for o in out] == [40] * 4
        assert llm.loop.stats.kv_blocks_total == 10

"""What the SSD draft worker's cache costs, estimated before it builds anything (so an absurd budget is
refused with a number instead of eating the host).

Per sequence the worker keeps the row's own KV, 2 · layers · kv_heads · head_dim · element bytes per token for
the context plus the K drafted positions, and per round, for each of its `branches` (= the budget, Σ_k F_k):
- the branch's own KV: on the block KV cache (`tree=True`, the eager path) the branches are decoded as a tree
  over the row (engine.blocks.BlockTree), so a branch holds only its K new tokens, in whole blocks; a state
  without blocks (the compiled static-slot path, `tree=False`) copies the row per branch, context and all;
- the branch's q at its K positions (tree.Branches, engine.sparse): its support, one id + value per
  position at temperature 0 and at most k with top-k, but dense float32 over the vocabulary at T > 0
  without top-k (the estimate charges that worst case);
- the ranking the next guesses come from: the draft's best M (RANK_DEPTH) token ids per position, and on the tree
  path the logits it is made from, kept until the outcome says which branch to rank (engine.ssd.tree.LaterRanking:
  K · V float32 a branch, at most LATER_RANKING_BYTES a sequence).
Plus the glue logits, (K+1) · V float32 per row while the glue runs. The estimate is for one sequence at
`context` tokens; a batch needs that many times more. While it builds, the worker's resident memory grows
over what it keeps (the model's activations, the allocator), so the check charges PEAK_OVER_KEPT times the
estimate: measured with benchmarks/memory.py on SmolLM2-135M (batch 8, budget 12, T = 0, prompts of 256 and
1,024 tokens; reports/2026-12-cpu-shared-kv), the worker's growth over its resident memory before the
batch was 1.6 times this estimate (the copying path's, before the tree: 1.0-2.2 times its own).

`memory_limit` turns the same estimate into an admission limit: the scheduler admits a sequence only while
the caches of those in flight, each at its full length, fit in the worker's share of the device (engine.scheduler).
"""

from __future__ import annotations

import torch

from engine.blocks.pool import DEFAULT_BLOCK_SIZE
from engine.scheduler import MemoryLimit
from engine.sequence import Sequence
from engine.sparse import RANK_DEPTH
from engine.ssd.tree import LATER_RANKING_BYTES

NOMINAL_CONTEXT = 512  # tokens the up-front check assumes (longer contexts need more)
SHARE = 0.5  # of the device's memory the worker's cache may take (one sequence's, or the whole batch's)
PEAK_OVER_KEPT = 2.5  # peak growth over the kept cache while building (measured 1.0-2.2x)


def kv_bytes_per_token(model: torch.nn.Module, element_bytes: int | None = None) -> int:
    cfg = model.config
    heads = cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    if element_bytes is None:  # the cache holds activations: float32 for an int8 model, else the weights' dtype
        weight = next(model.parameters())
        element_bytes = 4 if weight.dtype == torch.int8 else weight.element_size()
    return 2 * cfg.num_hidden_layers * kv_heads * head_dim * element_bytes


def worker_bytes_per_sequence(
    model: torch.nn.Module, K: int, branches: int, context: int = NOMINAL_CONTEXT, tree: bool = True
) -> int:
    """Bytes the worker keeps for one sequence (module docstring). `tree`: the branches are decoded as a tree over
    the row (the block KV cache): the row's KV once, each branch's K tokens in whole blocks and the logits its
    ranking waits on. Without: the row's KV copied per branch (the compiled static-slot path)."""
    V = int(model.get_output_embeddings().out_features)  # nn.Linear and its int8 dynamic twin alike
    kv = kv_bytes_per_token(model)
    q_and_ranking = K * V * 4 + K * min(RANK_DEPTH, V) * 8
    glue = (K + 1) * V * 4
    if not tree:
        return branches * (kv * (context + K + 1) + q_and_ranking) + glue
    own = kv * DEFAULT_BLOCK_SIZE * -(-K // DEFAULT_BLOCK_SIZE)  # a branch's K tokens, in whole blocks
    later = min(branches * K * V * 4, LATER_RANKING_BYTES)  # the logits kept for the ranking of the branch that hits
    return kv * (context + K + 1) + branches * (own + q_and_ranking) + later + glue


def memory_limit(model: torch.nn.Module, K: int, branches: int, device: torch.device, tree: bool = True) -> MemoryLimit:
    """The scheduler's admission limit for SSD: the worker's caches at their peak, each sequence at its full
    length (prompt + max_new_tokens), within SHARE of the draft device's memory."""

    def need(seq: Sequence) -> int:
        context = len(seq.prompt_ids) + seq.params.max_new_tokens
        return int(PEAK_OVER_KEPT * worker_bytes_per_sequence(model, K, branches, context, tree))

    return MemoryLimit(
        int(SHARE * device_bytes(device)),
        need,
        f"the SSD draft worker's speculation caches ({branches} branches each, on {device.type})",
    )


def device_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    import psutil

    return int(psutil.virtual_memory().total)


def check_budget(model: torch.nn.Module, K: int, branches: int, device: torch.device, tree: bool = True) -> None:
    """ValueError if one sequence's speculation cache alone would take over half the device's memory."""
    need = PEAK_OVER_KEPT * worker_bytes_per_sequence(model, K, branches, tree=tree)
    have = device_bytes(device)
    if need <= SHARE * have:
        return
    most = _most_branches(model, K, tree, SHARE * have)
    kept = (
        "its K tokens' KV, K rows of q over the vocabulary and the logits its ranking is made from"
        if tree
        else f"a KV copy of a {NOMINAL_CONTEXT}-token context and K rows of q over the vocabulary"
    )
    raise ValueError(
        f"an SSD fan-out budget of {branches} branches needs about {need / 2**30:.1f} GiB of draft-worker memory "
        f"per sequence (each branch keeps {kept}; K = {K}), but the draft's {device.type} has "
        f"{have / 2**30:.1f} GiB: "
        f"lower --budget to at most {most} (or use --budget auto)"
    )


def _most_branches(model: torch.nn.Module, K: int, tree: bool, room: float) -> int:
    """The largest budget whose estimate, at its peak, fits in `room` bytes (0 if none does)."""

    def fits(n: int) -> bool:
        return PEAK_OVER_KEPT * worker_bytes_per_sequence(model, K, n, tree=tree) <= room

    if not fits(0):
        return 0
    lo, hi = 0, 1
    while fits(hi):
        lo, hi = hi, 2 * hi
    while hi - lo > 1:  # fits(lo), not fits(hi)
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo

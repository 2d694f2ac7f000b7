"""What the SSD draft worker's cache costs, estimated before it builds anything (so an absurd budget is
refused with a number instead of eating the host).

Per sequence and round the worker keeps, for each of its `branches` (= the budget, Σ_k F_k):
- a copy of the row's KV cache (engine.kv_cache fork): 2 · layers · kv_heads · head_dim · element bytes
  per token, for the context plus the K drafted positions;
- the branch's q at its K positions (tree.Branches, engine.sparse): its support, one id + value per
  position at temperature 0 and at most k with top-k, but dense float32 over the vocabulary at T > 0
  without top-k (the estimate charges that worst case);
- the ranking the next guesses come from: the draft's best M (RANK_DEPTH) token ids per position.
Plus the glue logits, (K+1) · V float32 per row while the glue runs. The estimate is for one sequence at
`context` tokens; a batch needs that many times more. While it builds, the worker's resident memory grows
over what it keeps (forks, the model's activations, the allocator), so the check charges PEAK_OVER_KEPT
times the estimate: measured with benchmarks/memory.py on SmolLM2-135M (batch 8-32, budget 8-24, T = 0,
README), the worker's peak less ~1 GiB for the model and runtime was 1.0-2.2 times this estimate.

`memory_limit` turns the same estimate into an admission limit: the scheduler admits a sequence only while
the caches of those in flight, each at its full length, fit in the worker's share of the device (engine.scheduler).
"""

from __future__ import annotations

import torch

from engine.scheduler import MemoryLimit
from engine.sequence import Sequence
from engine.sparse import RANK_DEPTH

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


def worker_bytes_per_sequence(model: torch.nn.Module, K: int, branches: int, context: int = NOMINAL_CONTEXT) -> int:
    """Bytes of the speculation cache for one sequence: branches × (KV copy + dense q + ranking) + glue logits."""
    V = int(model.get_output_embeddings().out_features)  # nn.Linear and its int8 dynamic twin alike
    per_branch = kv_bytes_per_token(model) * (context + K + 1) + K * V * 4 + K * min(RANK_DEPTH, V) * 8
    return branches * per_branch + (K + 1) * V * 4


def memory_limit(model: torch.nn.Module, K: int, branches: int, device: torch.device) -> MemoryLimit:
    """The scheduler's admission limit for SSD: the worker's caches at their peak, each sequence at its full
    length (prompt + max_new_tokens), within SHARE of the draft device's memory."""

    def need(seq: Sequence) -> int:
        context = len(seq.prompt_ids) + seq.params.max_new_tokens
        return int(PEAK_OVER_KEPT * worker_bytes_per_sequence(model, K, branches, context))

    return MemoryLimit(int(SHARE * device_bytes(device)), need, f"the SSD draft worker's speculation caches "
                       f"({branches} branches each, on {device.type})")


def device_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    import psutil

    return int(psutil.virtual_memory().total)


def check_budget(model: torch.nn.Module, K: int, branches: int, device: torch.device) -> None:
    """ValueError if one sequence's speculation cache alone would take over half the device's memory."""
    need = PEAK_OVER_KEPT * worker_bytes_per_sequence(model, K, branches)
    have = device_bytes(device)
    if need <= SHARE * have:
        return
    one = PEAK_OVER_KEPT * (worker_bytes_per_sequence(model, K, 1) - worker_bytes_per_sequence(model, K, 0))
    most = max(int((SHARE * have - PEAK_OVER_KEPT * worker_bytes_per_sequence(model, K, 0)) // one), 0)
    raise ValueError(
        f"an SSD fan-out budget of {branches} branches needs about {need / 2**30:.1f} GiB of draft-worker memory "
        f"per sequence (each branch keeps a KV copy of a {NOMINAL_CONTEXT}-token context and K = {K} rows of "
        f"q over the vocabulary), but the draft's {device.type} has {have / 2**30:.1f} GiB: "
        f"lower --budget to at most {most} (or use --budget auto)")

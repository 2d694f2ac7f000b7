"""What the SSD draft worker's cache costs, estimated before it builds anything (so an absurd budget is
refused with a number instead of eating the host).

Per sequence and round the worker keeps, for each of its `branches` (= the budget, Σ_k F_k):
- a copy of the row's KV cache (engine.kv_cache fork): 2 · layers · kv_heads · head_dim · element bytes
  per token, for the context plus the K drafted positions;
- the branch's q and draft logits over the vocabulary at its K positions, dense float32 (tree.Branches).
Plus the glue logits, (K+1) · V float32 per row. The estimate is for one sequence at `context` tokens;
a batch needs that many times more. While it builds, the worker's resident memory grows by about 2.3×
what it keeps (forks, float copies, stacking: measured with scripts/measure_memory.py on SmolLM2-135M at
batch 1-32 and budget 6-24), so the check charges PEAK_OVER_KEPT times the estimate.
"""

from __future__ import annotations

import torch

NOMINAL_CONTEXT = 512  # tokens the up-front check assumes (longer contexts need more)
SHARE = 0.5  # of the device's memory the worker's cache may take for one sequence
PEAK_OVER_KEPT = 2.5  # peak growth over the kept cache while building (measured ~2.3x)


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
    """Bytes of the speculation cache for one sequence: branches × (KV copy + q + logits) + glue logits."""
    V = int(model.get_output_embeddings().weight.shape[0])
    per_branch = kv_bytes_per_token(model) * (context + K + 1) + 2 * K * V * 4
    return branches * per_branch + (K + 1) * V * 4


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
        f"q and logits over the vocabulary), but the draft's {device.type} has {have / 2**30:.1f} GiB: "
        f"lower --budget to at most {most} (or use --budget auto)")

"""One rank's shard of the target, loaded by transformers' own tensor parallelism (from_pretrained with a
`DistributedConfig`) on the process group the engine set up.

transformers shards by the model type's plan (`base_model_tp_plan`): attention by heads, the MLP by its
intermediate width, the embeddings and the output head by the vocabulary. Heads are only split whole: a model
whose attention or key-value heads do not divide among the ranks (smollm2-135m: 9 and 3 heads on 2 ranks)
cannot run its attention sharded (transformers cuts a head in two and the forward fails), so its attention
rules are overridden to "replicate" (every rank runs all heads) and the rest is sharded as planned. A model
type without a plan is refused with a ValueError.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

log = logging.getLogger(__name__)
ATTENTION_MODULES = ("self_attn", "attention", "attn")  # a plan rule naming one of these shards attention


def heads_divide(config, ranks: int) -> bool:
    text = config.get_text_config()
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    return heads % ranks == 0 and kv_heads % ranks == 0


def shard_plan(config, ranks: int, speak: bool = True) -> dict[str, str] | None:
    """Overrides of the model type's plan for `ranks` ranks: None (the plan as it is), or attention replicated
    when its heads do not divide (said in a warning when `speak`: rank 0). ValueError for a model type
    transformers has no plan for."""
    base = getattr(config.get_text_config(), "base_model_tp_plan", None)
    if not base:
        raise ValueError(
            f"transformers has no tensor-parallel plan for model type {config.model_type!r}: run this target with tp=1"
        )
    if heads_divide(config, ranks):
        return None
    text = config.get_text_config()
    prefix = AutoModelForCausalLM._model_mapping[type(config)].base_model_prefix  # the plan's rules sit under it
    attention = {
        f"{prefix}.{rule}": "replicate" for rule in base if any(f".{m}." in f".{rule}." for m in ATTENTION_MODULES)
    }
    if speak:
        log.warning(
            "%d attention heads (%s key-value heads) do not divide among %d ranks: every rank runs the "
            "whole attention, and the MLP, embeddings and output head are sharded",
            text.num_attention_heads,
            getattr(text, "num_key_value_heads", None) or text.num_attention_heads,
            ranks,
        )
    return attention


def load_shard(folder: str | Path, ranks: int, dtype: torch.dtype, speak: bool) -> PreTrainedModel:
    """This rank's shard of the model in `folder` (torch.distributed's default group: one process per rank)."""
    from transformers.distributed import DistributedConfig

    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    plan = shard_plan(config, ranks, speak)
    distributed = DistributedConfig(tp_size=ranks, tp_plan=plan) if plan else DistributedConfig(tp_size=ranks)
    model = AutoModelForCausalLM.from_pretrained(
        folder, distributed_config=distributed, dtype=dtype, local_files_only=True
    )
    return model.eval().requires_grad_(False)

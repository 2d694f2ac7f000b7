"""A model fed through a block pool: what the engine's eager path runs (engine.blocks)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from engine.blocks.layers import Binding
from engine.blocks.pool import DEFAULT_BLOCK_SIZE, BlockPool, bytes_per_token

if TYPE_CHECKING:
    from engine.blocks.state import BlockState


class BlockModel:
    """A model whose KV lives in a BlockPool: what the engine feeds on the eager path. Attribute reads other than
    its own go to the model (config, embeddings, dtype)."""

    def __init__(
        self,
        model: torch.nn.Module,
        device: torch.device,
        block_size: int = DEFAULT_BLOCK_SIZE,
        max_bytes: int | None = None,
        prefix_caching: bool = True,
    ):
        from engine.kv_cache import cache_keyword
        from engine.loading.devices import model_device

        self.model = model
        self.device = model_device(model)  # where its weights are (a low-bit draft stays on the CPU)
        layers = model.config.get_text_config().num_hidden_layers
        self.pool = BlockPool(layers, bytes_per_token(model), block_size, max_bytes, self.device, prefix_caching)
        self.keyword = cache_keyword(model)
        attention = getattr(model.config, "_attn_implementation", "sdpa")
        self.additive_mask = attention == "eager"  # eager attention adds its mask; sdpa takes booleans

    def __getattr__(self, name: str):
        return getattr(self.__dict__["model"], name)

    def __call__(self, *args, **kwargs):
        """The model's own forward (with whatever cache the caller passes)."""
        return self.model(*args, **kwargs)

    def new_kv_state(self, batch_size: int, device: torch.device) -> BlockState:
        from engine.blocks.state import BlockState

        return BlockState(self, np.zeros((batch_size, 0), dtype=np.int64), np.zeros(batch_size, dtype=np.int64))

    def forward(
        self, tokens: Tensor, positions: Tensor, mask: Tensor, binding: Binding, width: int, logits_to_keep: int
    ) -> Tensor:
        self.pool.binding, self.pool.width = binding, width
        T = tokens.shape[1]
        if 0 < logits_to_keep < T:
            # positions as a tensor: transformers then gathers a contiguous block for the head (engine.kv_cache)
            logits_to_keep = torch.arange(T - logits_to_keep, T, device=tokens.device)
        if self.additive_mask:
            dtype = self.model.dtype
            mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
        try:
            out = self.model(
                input_ids=tokens,
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                logits_to_keep=logits_to_keep,
                **{self.keyword: self.pool.cache},
            )
        finally:
            self.pool.binding = None
        return out.logits

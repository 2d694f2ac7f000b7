"""A model's KV cache for a batch of sequences of different lengths, with exact per-row roll-back.

Every forward appends the same number of slots to all rows (the cache is one tensor per layer), so
rows that need fewer tokens, or that rejected speculated tokens, get *holes*: slots whose attention
mask is 0. Keys in a hole are never attended to, and each row carries its own position ids, so a
row's logits equal those of the same tokens run alone (up to float rounding of block shapes).

Roll-back is exact because the rejected tokens are always the newest ones: the kept tokens' keys
and values were computed before the rejected ones existed (causal attention), so masking the
rejected slots restores precisely the state before they were fed.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel


class KVState:
    """KV cache, attention mask and position counters of one model over a batch."""

    def __init__(self, model: PreTrainedModel, batch_size: int, device: torch.device):
        self.model = model
        self.cache = DynamicCache(config=model.config)
        self.mask = torch.zeros(batch_size, 0, dtype=torch.long, device=device)  # [B, L], 1 = real
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)  # [B] real tokens

    @property
    def batch_size(self) -> int:
        return self.mask.shape[0]

    @torch.inference_mode()
    def extend(self, tokens: Tensor, valid: Tensor | None = None, logits_to_keep: int = 0) -> Tensor:
        """Feed tokens [B, T] (slots where valid [B, T] is False are holes); return logits.

        logits_to_keep > 0 computes logits for the last that many slots only (prefill wants one).
        Returns [B, T or logits_to_keep, V] in the model's dtype.
        """
        if valid is None:
            valid = torch.ones_like(tokens, dtype=torch.bool)
        valid = valid.to(torch.long)
        # A real token's position is the number of real tokens before it in its row.
        positions = (self.lengths[:, None] + valid.cumsum(-1) - 1).clamp(min=0)  # [B, T]
        mask = torch.cat([self.mask, valid], dim=1)  # [B, L + T]
        out = self.model(
            input_ids=tokens,
            attention_mask=mask,
            position_ids=positions,
            cache=self.cache,
            use_cache=True,
            logits_to_keep=logits_to_keep,
        )
        self.mask = mask
        self.lengths = self.lengths + valid.sum(-1)
        return out.logits

    def rollback(self, drop: Tensor) -> None:
        """Forget the newest drop[b] real tokens of each row b (drop: [B], >= 0)."""
        if drop.numel() == 0 or int(drop.max()) == 0:
            return
        # Rank of each real slot counted from the end of its row: 1 = newest.
        rank_from_end = self.mask.flip(-1).cumsum(-1).flip(-1)  # [B, L]
        forget = (self.mask == 1) & (rank_from_end <= drop[:, None])
        self.mask = self.mask.masked_fill(forget, 0)
        self.lengths = self.lengths - drop
        self._trim()

    def select(self, rows: Tensor) -> None:
        """Keep only the given rows (finished sequences leave the batch)."""
        self.cache.batch_select_indices(rows)
        self.mask = self.mask[rows]
        self.lengths = self.lengths[rows]
        self._trim()

    def _trim(self) -> None:
        """Free trailing slots that are holes in every row, so the cache does not keep growing."""
        live = self.mask.any(dim=0)  # [L]
        if live.all() or self.mask.shape[1] == 0:
            return
        last_live = int(live.nonzero().max()) + 1 if live.any() else 0
        extra = self.mask.shape[1] - last_live
        if extra > 0:
            self.cache.crop(-extra)
            self.mask = self.mask[:, :last_live]

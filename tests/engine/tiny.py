"""Tiny seeded models built from a config in memory, shared by the engine tests."""

from __future__ import annotations

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


def tiny_lm(seed: int, vocab_size: int = 50, layers: int = 2, hidden: int = 32, scale: float = 1.0):
    """A random Qwen2 causal LM; `scale` multiplies the output head (sharper distributions)."""
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=256, tie_word_embeddings=False,
    )
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


def noisy_copy(model, noise: float, seed: int = 0):
    """The model with Gaussian noise added to its output head: a draft that partly agrees."""
    import copy

    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        w = draft.lm_head.weight
        w.add_(noise * w.std() * torch.randn(w.shape, generator=gen))
    return draft

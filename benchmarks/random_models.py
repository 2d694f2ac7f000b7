"""Random-weight causal LMs shaped like real pairs, built on the spot (no weights travel, no hub).

A forward's cost depends on the shapes, not on the weight values, so these time like the real models. Their
outputs are not language: at temperature 0 two unrelated random models rarely agree (α near 0), at temperature 1
their wide distributions overlap but the outcome is spread over the whole vocabulary, so SSD's cache of a few
guesses per outcome misses. `agree=True` forces the other extreme at the same cost: every layer's output
projections are zero (the matmuls still run), so the residual stream is the input embedding and the head, tied to
it in value, predicts the last token again: target and draft agree on every token (α = 1, every outcome cached).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


@dataclass(frozen=True)
class Shape:
    """A Qwen2 decoder's shape (the fields of transformers' Qwen2Config that set a forward's cost)."""

    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool

    def config(self, vocab: int | None = None) -> Qwen2Config:
        return Qwen2Config(
            vocab_size=vocab or self.vocab,
            hidden_size=self.hidden,
            intermediate_size=self.intermediate,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            max_position_embeddings=32768,
            tie_word_embeddings=self.tied,
            use_sliding_window=False,
        )


# Qwen2.5 published configurations (config.json of each model).
QWEN25_0_5B = Shape("qwen2.5-0.5b", 896, 4864, 24, 14, 2, 151936, True)
QWEN25_1_5B = Shape("qwen2.5-1.5b", 1536, 8960, 28, 12, 2, 151936, True)
QWEN25_7B = Shape("qwen2.5-7b", 3584, 18944, 28, 28, 4, 152064, False)
# For a CPU dry run of the same code paths in seconds: the same structure, tiny.
TINY_DRAFT = Shape("tiny-draft", 64, 128, 2, 4, 2, 2048, True)
TINY_TARGET = Shape("tiny-target", 128, 256, 3, 4, 2, 2048, True)

# (target, draft): a draft takes its target's vocabulary, as a real pair shares one tokenizer.
PAIRS = {
    "1.5b/0.5b": (QWEN25_1_5B, QWEN25_0_5B),
    "7b/0.5b": (QWEN25_7B, QWEN25_0_5B),
}
TINY_PAIRS = {"tiny/tiny": (TINY_TARGET, TINY_DRAFT)}


def build(
    shape: Shape,
    device: torch.device | str,
    dtype: torch.dtype,
    seed: int,
    vocab: int | None = None,
    agree: bool = False,
) -> Qwen2ForCausalLM:
    """A random-weight model of `shape`, made directly on `device` in `dtype` (transformers' own initialisation,
    seeded; the global RNG is restored afterwards); `agree`: a model that repeats its last input token."""
    device = torch.device(device)
    previous = torch.get_default_dtype()
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.device(device):
        torch.manual_seed(seed)
        torch.set_default_dtype(dtype)
        try:
            model = Qwen2ForCausalLM(shape.config(vocab))
        finally:
            torch.set_default_dtype(previous)
    model = model.eval().requires_grad_(False)
    if agree:
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith(("o_proj.weight", "down_proj.weight")):
                    param.zero_()
            if not shape.tied:
                model.lm_head.weight.copy_(model.model.embed_tokens.weight)
    return model


def pair(
    target: Shape, draft: Shape, device: torch.device | str, dtype: torch.dtype, seed: int = 0, agree: bool = False
) -> tuple[Qwen2ForCausalLM, Qwen2ForCausalLM]:
    """A target and a draft sharing the target's vocabulary size (`agree`: both repeat the last token)."""
    return (
        build(target, device, dtype, seed, agree=agree),
        build(draft, device, dtype, seed + 1, vocab=target.vocab, agree=agree),
    )

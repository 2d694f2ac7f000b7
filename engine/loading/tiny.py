"""Tiny seeded causal LMs for tests: a random Qwen2 model and a target/draft pair that partly agree."""

from __future__ import annotations

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


def tiny_model(
    *,
    vocab_size: int = 32,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    seed: int = 0,
    max_position_embeddings: int = 512,
    logit_scale: float = 1.0,
) -> Qwen2ForCausalLM:
    """A random fp32 Qwen2 causal LM in eval mode; the same arguments give identical weights.

    Weights come from a private generator (the global RNG is left as it was). Embeddings are
    N(0, 1) and linear layers N(0, 1/fan_in), so activations stay O(1) and logits have a spread of
    about `logit_scale`: raise it for sharper, more greedy-like distributions.
    """
    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise ValueError(
            f"hidden_size ({hidden_size}) must be a multiple of num_heads ({num_heads}), "
            f"and num_heads a multiple of num_kv_heads ({num_kv_heads})"
        )
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=False,
        use_sliding_window=False,
    )
    with torch.random.fork_rng(devices=[]):  # construction draws from the global RNG: undo that
        model = Qwen2ForCausalLM(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():  # a fixed order, so a fixed draw sequence
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name.endswith(".bias"):
                param.zero_()
            elif param.dim() == 2 and "embed_tokens" in name:
                param.normal_(0.0, 1.0, generator=generator)
            else:
                std = (logit_scale if name.startswith("lm_head") else 1.0) / param.shape[1] ** 0.5
                param.normal_(0.0, std, generator=generator)
    return model.eval().requires_grad_(False)


def tiny_pair(
    *,
    vocab_size: int = 32,
    seed: int = 0,
    target_layers: int = 2,
    draft_layers: int = 1,
    logit_scale: float = 1.0,
) -> tuple[Qwen2ForCausalLM, Qwen2ForCausalLM]:
    """A tiny target and a draft made of its first `draft_layers` layers (same vocab, same head).

    Sharing embeddings, head and early layers makes the draft agree with the target often but
    not always, like a real small draft.
    """
    if not 1 <= draft_layers < target_layers:
        raise ValueError(
            f"need 1 <= draft_layers < target_layers, got draft_layers={draft_layers}, target_layers={target_layers}"
        )
    target = tiny_model(vocab_size=vocab_size, seed=seed, num_layers=target_layers, logit_scale=logit_scale)
    draft = tiny_model(vocab_size=vocab_size, seed=seed, num_layers=draft_layers, logit_scale=logit_scale)
    # Every draft parameter name also exists in the target (layers 0..draft_layers-1).
    draft.load_state_dict(
        {name: t for name, t in target.state_dict().items() if name in draft.state_dict()}, strict=True
    )
    return target, draft

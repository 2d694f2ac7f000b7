"""Peers run on the very same model objects: transformers' own `generate` and assisted generation."""

from __future__ import annotations

import time

import torch

from engine import SamplingParams


def hf_generate(
    model, prompt_ids: list[int], params: SamplingParams, eos_ids: frozenset[int], pad_id: int,
    assistant=None, K: int | None = None,
) -> tuple[list[int], float]:
    """One prompt through `model.generate` (assisted when `assistant` is given); returns (new ids, seconds)."""
    ids = torch.tensor([prompt_ids], device=model.device)
    kwargs = dict(
        max_new_tokens=params.max_new_tokens,
        do_sample=not params.greedy,
        pad_token_id=pad_id,
        eos_token_id=sorted(eos_ids) if params.stop_on_eos and eos_ids else None,
    )
    if not params.greedy:
        kwargs.update(temperature=params.temperature, top_k=params.top_k or 0, top_p=params.top_p or 1.0)
    if assistant is not None:
        # A constant K and no confidence-based early stop: the same speculation as our SD.
        kwargs.update(
            assistant_model=assistant, num_assistant_tokens=K,
            num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0,
        )
    torch.manual_seed(params.seed)  # transformers samples from the global RNG; ours takes a Generator
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
    seconds = time.perf_counter() - t0
    return out[0, len(prompt_ids) :].tolist(), seconds

"""Peers run on the very same model objects: transformers' own `generate` and assisted generation."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from engine import SamplingParams


@dataclass(frozen=True)
class PeerOutput:
    token_ids: list[int]
    finish_reason: str  # "eos" or "length"


def _trim(ids: list[int], eos_ids: frozenset[int], stop_on_eos: bool) -> PeerOutput:
    """A row of generate's output without the padding that follows an early finish."""
    if stop_on_eos:
        for i, t in enumerate(ids):
            if t in eos_ids:
                return PeerOutput(ids[: i + 1], "eos")
    return PeerOutput(ids, "length")


@contextmanager
def _assistant_settings(assistant, K: int | None) -> Iterator[None]:
    """A constant K and no confidence-based early stop: the same speculation as our SD.

    transformers reads these from the *assistant's* generation_config (its defaults are K = 20 and a
    0.4 confidence threshold that ends drafting early); passed to generate() they are ignored. They are
    set for the call and restored afterwards.
    """
    if assistant is None:
        yield
        return
    config = assistant.generation_config
    names = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
    saved = {n: getattr(config, n, None) for n in names}
    config.num_assistant_tokens = K
    config.num_assistant_tokens_schedule = "constant"
    config.assistant_confidence_threshold = 0.0
    try:
        yield
    finally:
        for n, v in saved.items():
            setattr(config, n, v)


def hf_generate(
    model, prompts: list[list[int]], params: SamplingParams, eos_ids: frozenset[int], pad_id: int,
    assistant=None, K: int | None = None,
) -> tuple[list[PeerOutput], float]:
    """Prompts through `model.generate` as one left-padded batch (assisted when `assistant` is given).

    Returns each prompt's new tokens and the call's wall time in seconds.
    """
    if assistant is not None and len(prompts) != 1:
        raise ValueError("transformers' assisted generation supports batch size 1 only")
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for b, p in enumerate(prompts):  # [B, width], prompts right-aligned (holes on the left)
        ids[b, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[b, width - len(p):] = 1
    # None (passed explicitly) keeps generate from stopping at the generation_config's EOS without
    # suppressing EOS the way min_new_tokens would: the same as our engine's stop_on_eos=False.
    eos = sorted(eos_ids) if params.stop_on_eos and eos_ids else None
    kwargs = dict(max_new_tokens=params.max_new_tokens, do_sample=not params.greedy, pad_token_id=pad_id,
                  eos_token_id=eos)
    if not params.greedy:
        kwargs.update(temperature=params.temperature, top_k=params.top_k or 0, top_p=params.top_p or 1.0)
    if assistant is not None:
        kwargs.update(assistant_model=assistant)
    if params.seed is not None:  # transformers samples from the global RNG; ours takes a Generator
        torch.manual_seed(params.seed)
    with _assistant_settings(assistant, K):
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids.to(model.device), attention_mask=mask.to(model.device), **kwargs)
        seconds = time.perf_counter() - t0
    rows = out[:, width:].tolist()  # [B, new]
    return [_trim(r, eos_ids, params.stop_on_eos) for r in rows], seconds

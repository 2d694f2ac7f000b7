"""Tiny seeded models built from a config in memory, and the enumeration and chi-square functions of the
statistical exactness tests, shared by the engine tests (the fixtures built from them are in conftest.py)."""

from __future__ import annotations

import copy
import itertools

import numpy as np
import torch
from scipy.stats import chisquare
from transformers import Qwen2Config, Qwen2ForCausalLM

from engine.keyed_random import Purpose
from engine.sampling import Keys, sample, warp
from engine.verifier import Verification

# The statistical tests: an 8-token vocabulary makes the exact distribution of the first STEPS generated
# tokens after PROMPT computable by enumeration (8^3 = 512 sequences); each test rejects at p < FALSE_ALARM.
V, STEPS = 8, 3
PROMPT = [1, 5, 2]
FALSE_ALARM = 1e-3


def tiny_lm(seed: int, vocab_size: int = 50, layers: int = 2, hidden: int = 32, scale: float = 1.0):
    """A random Qwen2 causal LM; `scale` multiplies the output head (sharper distributions)."""
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


def noisy_copy(model, noise: float, seed: int = 0):
    """The model with Gaussian noise added to its output head: a draft that partly agrees."""
    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        w = draft.lm_head.weight
        w.add_(noise * w.std() * torch.randn(w.shape, generator=gen))
    return draft


def exact_distribution(model, params, prompt: list[int] = PROMPT) -> np.ndarray:
    """P(first STEPS tokens = s) for every s in V^STEPS after `prompt` under `model` alone, by enumeration
    (float64)."""
    prefixes, table = [()], {(): 1.0}
    for _ in range(STEPS):
        batch = torch.tensor([prompt + list(s) for s in prefixes])
        with torch.inference_mode():
            p = warp(model(batch).logits[:, -1].double(), params).numpy()  # [n, V]
        table = {s + (x,): table[s] * p[i, x] for i, s in enumerate(prefixes) for x in range(V)}
        prefixes = list(table)
    return np.array([table[s] for s in itertools.product(range(V), repeat=STEPS)])


def sequence_counts(outputs) -> np.ndarray:
    """How often each of the V^STEPS sequences was generated, over outputs of STEPS tokens each."""
    index = [np.ravel_multi_index(o.token_ids, (V,) * STEPS) for o in outputs]
    return np.bincount(index, minlength=V**STEPS)


def chi_square_p(counts: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square goodness of fit, pooling cells whose expected count is below 5."""
    expected = probs * counts.sum()
    small = expected < 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


def argmax_verifier(draft_tokens, q, p, generator, checks=None):
    """The negative controls' broken verifier (the reference engine's bug): accept while the draft token equals
    the target's argmax, then sample the bonus from p, at temperature > 0. (`checks`: as engine.verifier.verify
    takes them; this verifier checks nothing.)"""
    matches = draft_tokens == p[:, :-1].argmax(-1)  # [B, K]
    accepted = matches.long().cumprod(dim=1).sum(dim=1)  # [B]
    rows = torch.arange(len(accepted))
    if isinstance(generator, Keys):  # the engine's keyed numbers: the target's draw at the bonus's position
        u = torch.from_numpy(generator.uniforms(Purpose.TARGET, 1, offset=accepted.cpu().numpy())[:, 0])
        bonus = sample(p[rows, accepted], None, u=u)
    else:
        bonus = sample(p[rows, accepted], generator)
    return Verification(accepted=accepted, bonus=bonus, draft_tokens=draft_tokens)


def spy_on_sdpa(monkeypatch) -> list[tuple[bool, bool]]:
    """Record (no mask, enable_gqa) for every call of torch's SDPA from now on (the list fills as calls come)."""
    calls: list[tuple[bool, bool]] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append((kwargs.get("attn_mask") is None, kwargs.get("enable_gqa", False)))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return calls

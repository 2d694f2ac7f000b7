"""Proposal distributions of the fast backups (docs/ssd.md §6), so each backup is verified against its true q.

Rejection sampling is exact for ANY proposal, but only if the verifier is given the distribution the
tokens were actually drawn from: uniform for random tokens, a one-hot for a deterministic lookup draft.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _check_vocab_size(vocab_size: int) -> None:
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")


def uniform(shape: tuple[int, ...], vocab_size: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """q of the random-token backup: uniform over the vocabulary, `[*shape, V]`."""
    _check_vocab_size(vocab_size)
    return torch.full((*shape, vocab_size), 1.0 / vocab_size, dtype=dtype)


def random_tokens(shape: tuple[int, ...], vocab_size: int, generator: torch.Generator) -> Tensor:
    """Tokens of the random-token backup, LongTensor `[*shape]`, drawn from `uniform(shape, vocab_size)`."""
    _check_vocab_size(vocab_size)
    return torch.randint(0, vocab_size, shape, generator=generator, device=generator.device)


def point_mass(tokens: Tensor, vocab_size: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """q of a lookup / n-gram backup that proposes one deterministic token: a one-hot, `[..., V]`."""
    _check_vocab_size(vocab_size)
    if tokens.is_floating_point() or tokens.dtype == torch.bool:
        raise ValueError(f"tokens must be an integer tensor, got {tokens.dtype}")
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
        raise ValueError(f"tokens must lie in [0, {vocab_size}), got range [{int(tokens.min())}, {int(tokens.max())}]")
    return torch.nn.functional.one_hot(tokens.long(), vocab_size).to(dtype)  # [..., V]

"""Autoregressive decoding: no draft. Verifying an empty speculation samples one token from the target."""

from __future__ import annotations

import torch

from engine.sampling import RowSampling
from engine.sequence import Sequence
from engine.strategies.base import Proposal
from engine.verifier import Verification


class NoDraft:
    name = "ar"
    K = 0

    def __init__(self, vocab_size: int, device: torch.device):
        self.vocab_size = vocab_size
        self.device = device

    def admit(self, seqs: list[Sequence]) -> None:
        pass

    def retire(self, keep: list[int]) -> None:
        pass

    def propose(self, rows: RowSampling) -> Proposal:
        n = len(rows)
        return Proposal(torch.zeros(n, 0, dtype=torch.long, device=self.device),
                        torch.zeros(n, 0, self.vocab_size, device=self.device), draft_ms=0.0, draft_forwards=0)

    def observe(self, result: Verification, verify_ms: float) -> None:
        pass

    def close(self) -> None:
        pass

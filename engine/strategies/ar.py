"""Autoregressive decoding: no draft. Verifying an empty speculation samples one token from the target.

FixedDraft is NoDraft with a speculation of fixed tokens: what `saguaro calibrate` times a verify with.
"""

from __future__ import annotations

import torch

from engine.checks import Checks
from engine.sampling import RowSampling
from engine.sequence import Sequence
from engine.strategies.base import Proposal, RoundTelemetry
from engine.verifier import Verification


class NoDraft:
    name = "ar"
    K = 0
    faults = ()

    def __init__(self, vocab_size: int, device: torch.device):
        self.vocab_size = vocab_size
        self.device = device
        self.last_round = RoundTelemetry()  # drafting costs nothing

    def prefetch(self, seqs: list[Sequence]) -> None:
        pass

    def admit(self, seqs: list[Sequence]) -> None:
        pass

    def retire(self, keep: list[int]) -> None:
        pass

    def propose(self, rows: RowSampling, checks: Checks | None = None) -> Proposal:
        n = len(rows)
        return Proposal(
            torch.zeros(n, 0, dtype=torch.long, device=self.device),
            torch.zeros(n, 0, self.vocab_size, device=self.device),
        )

    def observe(self, result: Verification, verify_ms: float) -> None:
        pass

    def close(self) -> None:
        pass


class FixedDraft(NoDraft):
    """A proposer whose speculation is always the same tokens `x` [b, K], drawn from a point mass: the verify
    costs what it costs for any q, and the rounds stay reproducible (saguaro.calibration.target_rounds)."""

    name = "sd"

    def __init__(self, x: torch.Tensor, vocab_size: int):
        super().__init__(vocab_size, x.device)
        self.x, self.K = x, x.shape[1]
        self.q = torch.zeros(*x.shape, vocab_size, device=x.device).scatter_(-1, x[..., None], 1.0)  # [b, K, V]

    def propose(self, rows: RowSampling, checks: Checks | None = None) -> Proposal:
        return Proposal(self.x, self.q)

"""What every strategy shares: the clock, prefill of a ragged batch, and retiring finished rows."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod

import torch
from torch import Tensor

from engine.kv_cache import KVState
from engine.metrics import RoundRecord
from engine.sampling import warp
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from engine.verifier import Verification, verify


class Clock:
    """Seconds since the start of a generate() call."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.start


def ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1e3


def right_aligned(rows: list[list[int]], pad_id: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Pack token lists into a block whose rows end together (holes on the left).

    Returns tokens [B, T] and valid [B, T]; the last slot of every non-empty row is real, so the
    last position's logits are each row's next-token logits.
    """
    width = max(len(r) for r in rows)
    tokens = torch.full((len(rows), width), pad_id, dtype=torch.long)
    valid = torch.zeros((len(rows), width), dtype=torch.bool)
    for b, row in enumerate(rows):
        if row:
            tokens[b, width - len(row) :] = torch.tensor(row, dtype=torch.long)
            valid[b, width - len(row) :] = True
    return tokens.to(device), valid.to(device)


def prefill(state: KVState, seqs: list[Sequence], pad_id: int, device: torch.device) -> Tensor:
    """Run the prompts through one model as one batch; returns next-token logits [B, V]."""
    tokens, valid = right_aligned([s.prompt_ids for s in seqs], pad_id, device)
    return state.extend(tokens, valid, logits_to_keep=1)[:, -1]


class Decoder(ABC):
    """A generation strategy: turns a batch of sequences into output tokens and round records."""

    name: str

    def __init__(self, target: torch.nn.Module, pad_id: int, device: torch.device):
        self.target = target
        self.pad_id = pad_id
        self.device = device

    @abstractmethod
    def run(
        self, seqs: list[Sequence], params: SamplingParams, generator: torch.Generator, clock: Clock
    ) -> list[RoundRecord]:
        """Generate until every sequence is finished; fill their outputs and metrics."""


def surviving_rows(active: list[Sequence]) -> tuple[list[Sequence], Tensor | None]:
    """The unfinished sequences and their row indices, or None when nobody finished."""
    keep = [i for i, s in enumerate(active) if not s.finished]
    if len(keep) == len(active):
        return active, None
    return [active[i] for i in keep], torch.tensor(keep, dtype=torch.long)


def verify_block(
    target: KVState, pending: Tensor, x: Tensor, q: Tensor, params: SamplingParams, generator: torch.Generator
) -> Verification:
    """One target forward over [pending, x_1..x_K] and rejection sampling of x [B, K] against the q
    [B, K, V] it was drawn from; the target cache is rolled back to the accepted prefix (it then holds
    every committed token but the bonus, which becomes the next `pending`)."""
    block = torch.cat([pending[:, None].to(x.device), x], dim=1)  # [B, K + 1]
    p = warp(target.extend(block).float(), params)  # [B, K + 1, V]
    result = verify(x, q, p, generator)
    target.rollback(x.shape[1] - result.accepted.to(target.lengths.device))
    return result


def emit_round(active: list[Sequence], result: Verification, x: Tensor, now_s: float) -> list[int]:
    """Append each row's x_1..x_k, t* to its sequence (cut at EOS / the limit); returns tokens kept."""
    emitted = []
    for seq, tokens, k in zip(active, result.emitted(x), result.accepted.tolist()):
        emitted.append(seq.append(tokens, now_s))
        seq.metrics.rounds += 1
        seq.metrics.target_forwards += 1
        seq.metrics.accepted_hist[k] += 1
    return emitted

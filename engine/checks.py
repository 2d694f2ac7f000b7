"""Input checks read on the host together.

Sampling checks its inputs (logits with a finite maximum, a positive mass to draw from, tokens inside the
vocabulary), and each check is a read of a device tensor on the host: on a GPU, a wait for the device. A loop of
steps (the draft's K steps; a verify's warp, token check and draw) hands its checks to one `Checks` and reads
them all at once, after the last step.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


class Checks:
    """Input checks read on the host together. Each check adds a device mask of its bad rows and the error it
    would raise; `raise_first()` reads every mask in one transfer and raises the first failed check's error, as
    that check alone would have. Passed through a loop of sampling steps (the draft's K steps; a verify's warp,
    token check and draw), the host then waits for the device once instead of at every step. Without a Checks
    object each function checks at once."""

    def __init__(self) -> None:
        self._pending: list[tuple[Tensor, Callable[[Tensor], Exception]]] = []

    def add(self, bad: Tensor, error: Callable[[Tensor], Exception]) -> None:
        """`bad`: a bool mask of the rows that fail; `error(bad)` the exception to raise if any does."""
        self._pending.append((bad, error))

    def raise_first(self) -> None:
        if self._pending:
            self.raise_from(self.flags().tolist())  # one read

    def flags(self) -> Tensor:
        """[n] int64 on the first check's device, 1 where a check failed: to read on the host together with other
        values (the decode loop reads them with the round's outcome), then hand to `raise_from`."""
        if not self._pending:
            return torch.zeros(0, dtype=torch.long)
        device = self._pending[0][0].device
        return torch.stack([bad.any().to(device) for bad, _ in self._pending]).long()

    def raise_from(self, failed: list[int]) -> None:
        """Raise the first failed check's error, given the values of `flags()` as read on the host."""
        pending, self._pending = self._pending, []
        for flag, (bad, error) in zip(failed, pending, strict=True):
            if flag:
                raise error(bad)


def check(bad: Tensor, error: Callable[[Tensor], Exception], checks: Checks | None) -> None:
    """Raise error(bad) now if any row is bad, or leave the check to `checks` (read later, with others)."""
    if checks is not None:
        checks.add(bad, error)
    elif bool(bad.any()):
        raise error(bad)

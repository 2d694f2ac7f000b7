"""The draft worker in the target's own process: the same DraftWorker, called directly.

No overlap (the cache is built before the answer returns), identical results, and statistical
tests can run tens of thousands of sequences without a second process.
"""

from __future__ import annotations

import torch

from engine.config import SpeculativeConfig
from engine.ssd.draft_worker import DraftWorker
from engine.ssd.messages import Prefill, Round, Speculation


class InProcessChannel:
    target_threads = None

    def __init__(self, draft: torch.nn.Module, spec: SpeculativeConfig, pad_id: int, device: torch.device):
        self.worker = DraftWorker(draft, spec, pad_id, device)

    def wait_ready(self) -> None:
        """The worker is built with the channel: always ready."""

    def prefetch(self, msg: Prefill) -> None:
        self.worker.prefill_ahead(msg)

    def exchange(self, msg: Round) -> Speculation:
        reply = self.worker.respond(msg)
        self.worker.build_cache()
        return reply

    def close(self) -> None:
        self.worker = None

"""A fake backend for the SSD link (engine.ssd.transport.Backend): both ends of a process group of two in one
process, with gloo's failure rules and NCCL's watchdog, so the endpoint's timeouts, waits and staging can be
tested without a second process or a GPU.

- A receive waits for the peer's next transfer; a wait that ends without one fails and closes the pair for good
  (gloo: "Application timeout caused pair closure").
- Watchdog: no operation may stay in flight longer than the group's timeout, whatever its wait asks for; one that
  does is torn down with the pair (NCCL's watchdog does this to an idle receive).
- Every tensor handed to the group is kept (`handed`), every wait's timeout too (`waits_s`), for the tests to
  check what crossed and how long anyone waited.
"""

from __future__ import annotations

import datetime
import queue
import threading

import torch

from engine.ssd.transport import DRAFT_RANK, TARGET_RANK


class FakeLink:
    def __init__(self) -> None:
        self.inbox = {TARGET_RANK: queue.Queue(), DRAFT_RANK: queue.Queue()}
        self.closed = threading.Event()
        self.handed: list[torch.Tensor] = []
        self.waits_s: list[float] = []
        self.group_timeout_s: float | None = None

    def backend(self, store, rank: int, timeout: datetime.timedelta) -> FakeGroup:
        self.group_timeout_s = timeout.total_seconds()
        return FakeGroup(self, rank, timeout.total_seconds())


class FakeGroup:
    def __init__(self, link: FakeLink, rank: int, timeout_s: float):
        self.link, self.rank, self.timeout_s = link, rank, timeout_s

    def send(self, tensors, peer, tag):
        self.link.handed.append(tensors[0])
        if not self.link.closed.is_set():
            self.link.inbox[peer].put(tensors[0].clone())
        return _Work(self, None)

    def recv(self, tensors, peer, tag):
        self.link.handed.append(tensors[0])
        return _Work(self, tensors[0])

    def shutdown(self) -> None:
        pass


class _Work:
    def __init__(self, group: FakeGroup, buf: torch.Tensor | None):
        self.group, self.buf = group, buf

    def wait(self, timeout: datetime.timedelta) -> bool:
        link, asked = self.group.link, timeout.total_seconds()
        link.waits_s.append(asked)
        if link.closed.is_set():
            raise RuntimeError("Application timeout caused pair closure")
        if self.buf is None:  # a send: delivered at once
            return True
        limit = min(asked, self.group.timeout_s)
        try:
            data = link.inbox[self.group.rank].get(timeout=limit)
        except queue.Empty:
            link.closed.set()
            if limit < asked:
                raise RuntimeError(f"watchdog: an operation stayed in flight past the group's {limit:g} s") from None
            raise RuntimeError(f"Timed out waiting {asked * 1e3:.0f}ms for recv operation to complete") from None
        self.buf.copy_(data)
        return True

"""Where SSD's draft worker runs: its device (always indexed when a GPU), its CPU cores, and the checks that need
no model (run before any loads). The link is gloo whatever the devices (engine.ssd.transport)."""

from __future__ import annotations

import os

import torch

from engine.config import DraftPlacement
from engine.ssd.lifetime import refuse_unguarded_main
from engine.ssd.transport import check_port_free


def draft_device_for(target_device: torch.device, draft_device: str | None) -> torch.device:
    """The worker's device, resolved before the worker starts (a worker given plain "cuda" could not pick its GPU):
    an indexed device as asked; "cuda" (no index, or None beside a CUDA target) = the next GPU after the target's,
    wrapping round, or the target's own GPU when it is the only one (the worker keeps its own process), or cuda:0
    beside a CPU target; None beside a CPU target = the CPU."""
    if not draft_device and target_device.type != "cuda":
        return torch.device("cpu")
    asked = torch.device(draft_device or "cuda")
    if asked.type != "cuda" or asked.index is not None:
        return asked
    if target_device.type != "cuda":
        return torch.device("cuda", 0)
    index = target_device.index or 0
    count = torch.cuda.device_count()
    return torch.device("cuda", (index + 1) % count if count > 1 else index)


def worker_cores(threads: int) -> tuple[list[int] | None, int]:
    """The draft's cores (the last `threads` usable ones) and how many remain for the target."""
    if not hasattr(os, "sched_getaffinity"):
        return None, max(1, (os.cpu_count() or 2) - threads)
    usable = sorted(os.sched_getaffinity(0))
    if len(usable) <= threads:
        return None, max(1, len(usable) - threads)
    return usable[-threads:], len(usable) - threads


def preflight(placement: DraftPlacement) -> None:
    """Checks that need no model, run before loading any: the rendezvous port is free, and this is not a
    spawned process re-running the caller's unguarded script, and the draft device exists here."""
    if not placement.in_process:
        if not placement.external:
            refuse_unguarded_main()
            check_draft_device(placement.draft_device)
        check_port_free(placement.init_method)


def check_draft_device(draft_device: str | None) -> None:
    """Refuse a draft device this machine lacks (a worker started elsewhere is not checked here)."""
    if not draft_device:
        return
    from engine.loading.devices import check_device

    try:
        check_device(draft_device)
    except ValueError as err:
        reason = str(err).replace("use --device cpu", "use --draft-device cpu")
        raise ValueError(f"draft device: {reason}") from None

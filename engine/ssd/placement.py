"""Where SSD's draft worker runs: its device, the link's backend both sides must agree on, its CPU cores, and the
checks that need no model (run before any loads)."""

from __future__ import annotations

import os

import torch

from engine.config import DraftPlacement
from engine.ssd.lifetime import refuse_unguarded_main
from engine.ssd.transport import check_port_free


def draft_device_for(target_device: torch.device, draft_device: str | None) -> torch.device:
    """The worker's device: the one asked for; else the CPU beside a CPU target; else a second GPU when
    there is one, and the target's own GPU otherwise (the worker still runs in its own process)."""
    if draft_device:
        return torch.device(draft_device)
    if target_device.type != "cuda":
        return torch.device("cpu")
    index = target_device.index or 0
    if torch.cuda.device_count() > 1:
        return torch.device("cuda", 1 if index == 0 else 0)
    return torch.device("cuda", index)


def uses_nccl(target_device: torch.device, draft_device: torch.device) -> bool:
    """Both sides must pick the same backend. NCCL links two different GPUs; a CPU on either side, or
    both ranks on one GPU (which NCCL refuses), goes over gloo with the tensors on the CPU."""
    if target_device.type != "cuda" or draft_device.type != "cuda":
        return False
    return (target_device.index or 0) != (draft_device.index or 0)


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

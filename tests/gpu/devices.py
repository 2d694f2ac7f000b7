"""Where the device-parametrised tests put things. Their `device` (conftest.py) is "cpu" always, and "cuda" with
--run-gpu where torch sees a GPU. On "cuda" the target is on cuda:0 and SSD's worker is asked for plain "cuda",
which the engine resolves to the next GPU, or to cuda:0 when it is the only one (engine.ssd.placement); on
"cpu" everything is on the CPU. Nothing here touches CUDA at import time."""

from __future__ import annotations

import torch


def gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def target_device(device: str) -> str:
    return "cuda:0" if device == "cuda" else "cpu"


def worker_device(device: str) -> str:
    """What SSD's placement is asked for: plain "cuda" (the engine picks the GPU) or "cpu"."""
    return device


def peer_device(device: str) -> str:
    """The far end of the link test: a second GPU when there is one, else the target's."""
    if device != "cuda":
        return "cpu"
    return "cuda:1" if gpu_count() >= 2 else "cuda:0"

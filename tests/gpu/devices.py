"""Where the CUDA tests put things: the target on cuda:0; SSD's draft worker on cuda:1 when there is a
second GPU, else on cuda:0 in its own process. Nothing here touches CUDA at import time."""

from __future__ import annotations

import torch

TARGET_DEVICE = "cuda:0"


def gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def draft_device() -> str:
    return "cuda:1" if gpu_count() >= 2 else "cuda:0"

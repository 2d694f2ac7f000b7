"""Where SSD's worker goes and which backend links it: both sides must agree (NCCL only between two
different GPUs; a CPU side, or both ranks on one GPU, goes over gloo with CPU tensors)."""

import pytest
import torch

from engine.ssd import placement
from engine.ssd.placement import draft_device_for, uses_nccl

cpu, gpu0, gpu1 = torch.device("cpu"), torch.device("cuda", 0), torch.device("cuda", 1)


@pytest.mark.parametrize("gpus, target, asked, want", [
    (0, cpu, None, cpu),
    (0, cpu, "cuda:0", gpu0),      # asked for: taken as given
    (1, gpu0, None, gpu0),         # one GPU: the worker shares it, in its own process
    (2, gpu0, None, gpu1),         # two GPUs: the other one
    (2, gpu1, None, gpu0),
    (2, torch.device("cuda"), None, gpu1),  # "cuda" means cuda:0
    (2, gpu0, "cpu", cpu),
])
def test_the_worker_device_by_default_and_as_asked(monkeypatch, gpus, target, asked, want):
    monkeypatch.setattr(placement.torch.cuda, "device_count", lambda: gpus)
    assert draft_device_for(target, asked) == want


@pytest.mark.parametrize("target, draft, nccl", [
    (cpu, cpu, False),
    (cpu, gpu0, False),   # gloo on both sides, not gloo on one and NCCL on the other
    (gpu0, cpu, False),
    (gpu0, gpu0, False),  # NCCL refuses two ranks on one GPU
    (torch.device("cuda"), gpu0, False),
    (gpu0, gpu1, True),
])
def test_the_link_backend_is_decided_once_for_both_sides(target, draft, nccl):
    assert uses_nccl(target, draft) is nccl

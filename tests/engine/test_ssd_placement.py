"""Where SSD's worker goes: resolved to an indexed device before it starts (a worker given plain "cuda" cannot
pick its GPU), on one GPU and on two or more; the GPU count is faked, so this runs on any machine."""

import pytest
import torch

from engine.ssd import placement
from engine.ssd.placement import draft_device_for

cpu, gpu0, gpu1, gpu2 = (torch.device(d) for d in ("cpu", "cuda:0", "cuda:1", "cuda:2"))
cuda = torch.device("cuda")


@pytest.mark.parametrize(
    "gpus, target, asked, want",
    [
        (0, cpu, None, cpu),
        (0, cpu, "cuda:0", gpu0),  # an index: taken as given
        (1, gpu0, None, gpu0),  # one GPU: the worker shares it, in its own process
        (2, gpu0, None, gpu1),  # two GPUs: the other one
        (2, gpu1, None, gpu0),
        (2, cuda, None, gpu1),  # a target on plain "cuda" is on cuda:0
        (2, gpu0, "cpu", cpu),
        (1, gpu0, "cuda", gpu0),  # "cuda" on one GPU: the target's
        (2, gpu0, "cuda", gpu1),  # "cuda" on two: the next one
        (4, gpu1, "cuda", gpu2),  # ... after the target's
        (4, torch.device("cuda:3"), "cuda", gpu0),  # wrapping round
        (2, cpu, "cuda", gpu0),  # "cuda" beside a CPU target: the first GPU
        (2, gpu0, "cuda:0", gpu0),  # sharing the target's GPU on purpose
    ],
)
def test_the_worker_device_is_resolved_to_an_index(monkeypatch, gpus, target, asked, want):
    monkeypatch.setattr(placement.torch.cuda, "device_count", lambda: gpus)
    got = draft_device_for(target, asked)
    assert got == want
    assert got.type == "cpu" or got.index is not None

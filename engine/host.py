"""Host staging: what crosses between the host and a CUDA device every round, without stalling the host.

A copy to a GPU from ordinary (pageable) host memory waits until the device has run everything queued before
it, and so does every read of a device tensor on the host (`.tolist()`, `int(t)`, `bool(t)`). Per round the
engine needs only a few such crossings: token ids and a few indices up, the outcome and the draft's answer
down. So:

- `upload` takes a tensor built on the host to the device through page-locked (pinned) memory with a
  non-blocking copy: the host goes on at once, and the copy runs in stream order;
- `download` brings several device tensors to the host with one wait: non-blocking copies into pinned memory,
  then one synchronisation of the stream.

On the CPU both are identity maps (and pinned memory is never asked for: it needs a CUDA build and device).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def reads_are_free(device: torch.device) -> bool:
    """Whether reading a tensor on `device` from the host costs no wait: True on the CPU, where a routine may
    read values to take a shortcut that a device's path must do without (engine.ranking.ranked_ids). Both
    paths give the same result; tests run the device's path on the CPU by making this False."""
    return torch.device(device).type == "cpu"


def pinned_empty(shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> Tensor:
    """A host buffer to fill and then `upload` to `device`: page-locked when `device` is a CUDA device."""
    return torch.empty(tuple(shape), dtype=dtype, pin_memory=torch.device(device).type == "cuda")


def upload(t: Tensor, device: torch.device | str) -> Tensor:
    """`t` on `device`: from the host to a CUDA device through pinned memory, without waiting for the device."""
    device = torch.device(device)
    if t.device == device or (device.type == t.device.type and device.index is None):
        return t
    if device.type == "cuda" and t.device.type == "cpu":
        if not t.is_pinned():
            t = t.pin_memory()
        return t.to(device, non_blocking=True)
    return t.to(device)


def tensor(values: Sequence, dtype: torch.dtype, device: torch.device | str) -> Tensor:
    """A host list as a tensor on `device` (`upload`ed: no wait for the device's queue)."""
    return upload(torch.tensor(values, dtype=dtype), device)


def index(values: Tensor | Sequence[int], device: torch.device | str) -> Tensor:
    """Row indices or counts as an int64 tensor on `device`: a host list is `upload`ed, a tensor moved as it is."""
    if isinstance(values, Tensor):
        return upload(values, device)
    return tensor(list(values), torch.long, device)


def download(tensors: Sequence[Tensor]) -> list[Tensor]:
    """The tensors on the host, with one synchronisation per CUDA device among them (none on the CPU).
    The results are complete when this returns (non-blocking copies, then a wait on each stream)."""
    devices = {t.device for t in tensors if t.device.type == "cuda"}
    if not devices:
        return list(tensors)
    out = [t.to("cpu", non_blocking=True) if t.device.type == "cuda" else t for t in tensors]
    for device in devices:
        torch.cuda.current_stream(device).synchronize()
    return out

"""Counting the host's waits for the device on a CPU-only machine.

On a GPU every read of a device tensor on the host (`.item()`, `.tolist()`, `bool(t)`, `int(t)`, `float(t)`,
`.cpu()`, `.numpy()`, `.nonzero()`, a boolean-mask index, which needs the mask's count) waits until the device
has run everything queued before it, and so do the engine's own sync points: a device `Stopwatch` read
(engine.timing) and a `download` (engine.host). On the CPU those calls cost nothing but are still made, so
counting them counts what a GPU run would wait for. `count_host_syncs()` counts them while it is open; with it the
routines that take a shortcut through reads only on the CPU take their device path (engine.host.reads_are_free is
False), so the count is the device's. On a real GPU, `torch.cuda.set_sync_debug_mode("warn")` reports the same waits.
"""

from __future__ import annotations

import traceback
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from engine import host, timing

READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy", "nonzero")


class SyncCount:
    def __init__(self) -> None:
        self.by_kind: Counter = Counter()
        self.by_place: Counter = Counter()  # (kind, file, line) of the engine's call

    @property
    def total(self) -> int:
        return sum(self.by_kind.values())

    def add(self, kind: str) -> None:
        self.by_kind[kind] += 1
        for frame in reversed(traceback.extract_stack()[:-2]):
            if "/engine/" in frame.filename:  # engine/...: the same for another checkout's engine (PYTHONPATH)
                place = frame.filename[frame.filename.rindex("/engine/") + 1 :]
                self.by_place[(kind, place, frame.lineno)] += 1
                return
        self.by_place[(kind, "?", 0)] += 1

    def __str__(self) -> str:
        lines = [f"{self.total} host syncs: {dict(self.by_kind)}"]
        lines += [f"  {n} x {kind} at {path}:{line}" for (kind, path, line), n in self.by_place.most_common()]
        return "\n".join(lines)


def _is_mask(index) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts)


@contextmanager
def count_host_syncs() -> Iterator[SyncCount]:
    count = SyncCount()
    saved = {name: getattr(torch.Tensor, name) for name in READS + ("__getitem__", "__setitem__")}
    saved_fn = {
        "nonzero": torch.nonzero,
        "reads_are_free": host.reads_are_free,
        "download": host.download,
        "ms": timing.Stopwatch.ms,
    }

    def reading(name, method):
        def wrapped(self, *args, **kwargs):
            count.add(name)
            return method(self, *args, **kwargs)

        return wrapped

    def indexing(name, method):
        def wrapped(self, index, *args):
            if _is_mask(index):
                count.add(f"{name} with a mask")
            return method(self, index, *args)

        return wrapped

    def download(tensors):
        count.add("download")
        return saved_fn["download"](tensors)

    def stopwatch_ms(self):
        if self.device is not None:  # a device's stopwatch (the host's own clock reads nothing)
            count.add("Stopwatch.ms")
        return saved_fn["ms"](self)

    def nonzero(*args, **kwargs):
        count.add("torch.nonzero")
        return saved_fn["nonzero"](*args, **kwargs)

    for name in READS:
        setattr(torch.Tensor, name, reading(name, saved[name]))
    for name in ("__getitem__", "__setitem__"):
        setattr(torch.Tensor, name, indexing(name, saved[name]))
    torch.nonzero = nonzero
    host.reads_are_free = lambda device: False
    host.download = download
    timing.Stopwatch.ms = stopwatch_ms
    try:
        yield count
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)
        torch.nonzero = saved_fn["nonzero"]
        host.reads_are_free = saved_fn["reads_are_free"]
        host.download = saved_fn["download"]
        timing.Stopwatch.ms = saved_fn["ms"]

"""The one stopwatch for every time the engine acts on or records: the verify, draft, wait and round times that
feed adaptive K (engine.strategies.lookahead), the draft worker's policy (engine.ssd.policy: cache build and
backup times) and the round records (engine.metrics.RoundRecord).

`Stopwatch(device).ms()` is the time from the stopwatch's start to now. On the CPU both ends are
time.perf_counter() readings, and so they are for `Stopwatch()` (no device): the host's own clock, for a wait
that ends in host memory (SSD's wait for its worker's answer), which reads nothing from a device. On a CUDA
device the work a time covers is only queued when the host moves on, so a host clock would time the launches,
not the work: there each end is a CUDA event recorded on the device's current stream, and `ms()` waits for the
newest one (a host synchronisation) and returns the device's time between the two.
"""

from __future__ import annotations

import time

import torch


class Stopwatch:
    """Started at construction on `device` (None: the host's clock); `ms()` reads it (any number of times, each up
    to that moment)."""

    def __init__(self, device: torch.device | str | None = None):
        self.device = None if device is None else torch.device(device)
        self.on_cuda = self.device is not None and self.device.type == "cuda"
        self._start = self._now()

    def _now(self):
        if not self.on_cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def ms(self) -> float:
        """Milliseconds from the start to now (on CUDA: until the work queued so far has run)."""
        end = self._now()
        if not self.on_cuda:
            return (end - self._start) * 1e3
        end.synchronize()
        return float(self._start.elapsed_time(end))


class Interval:
    """A time on the device that is read after the host has waited for the device anyway (a round's one read):
    started at construction, `stop()` where the work it covers has been queued, `ms()` afterwards. On the CPU both
    ends are the host's clock. On CUDA they are events, and `ms()` returns the device's time between them without a
    wait of its own, or None while the end has not been reached (read it later, after the round's read)."""

    def __init__(self, device: torch.device | str | None = None):
        self.on_cuda = device is not None and torch.device(device).type == "cuda"
        self._device = None if device is None else torch.device(device)
        self._start = self._now()
        self._end = None

    def _now(self):
        if not self.on_cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self._device))
        return event

    def stop(self) -> Interval:
        self._end = self._now()
        return self

    def ms(self) -> float | None:
        if self._end is None:
            raise RuntimeError("Interval.ms() before stop()")
        if not self.on_cuda:
            return (self._end - self._start) * 1e3
        if not self._end.query():  # not reached yet: reading it now would wait for the device
            return None
        return float(self._start.elapsed_time(self._end))

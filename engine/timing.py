"""The one stopwatch for every time the engine acts on or records: the verify, draft, wait and round times that
feed adaptive K (engine.strategies.lookahead), the draft worker's policy (engine.ssd.policy: cache build and
backup times) and the round records (engine.metrics.RoundRecord).

`Stopwatch(device).ms()` is the time from the stopwatch's start to now. On the CPU both ends are
time.perf_counter() readings. On a CUDA device the work a time covers is only queued when the host moves on, so
a host clock would time the launches, not the work: there each end is a CUDA event recorded on the device's
current stream, and `ms()` waits for the newest one (a host synchronisation) and returns the device's time
between the two.
"""

from __future__ import annotations

import time

import torch


class Stopwatch:
    """Started at construction on `device`; `ms()` reads it (any number of times, each up to that moment)."""

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self._start = self._now()

    def _now(self):
        if self.device.type != "cuda":
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def ms(self) -> float:
        """Milliseconds from the start to now (on CUDA: until the work queued so far has run)."""
        end = self._now()
        if self.device.type != "cuda":
            return (end - self._start) * 1e3
        end.synchronize()
        return float(self._start.elapsed_time(end))

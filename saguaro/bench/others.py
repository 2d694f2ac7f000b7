"""How much CPU other processes used while a benchmark call ran: a run disturbed by them is marked.

Timings on a small machine are void when something else computes next to them (SSD's worker needs
its own core). Before and after each call the bench sums the CPU time of every process outside its
own tree (itself, the SSD draft worker and any other child); if the others used more than
DISTURBED_SHARE of one core over the call's wall time, the call's result lines carry a `disturbed`
reason, which `saguaro report` marks with † in tables and hollow / hatched in figures.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import psutil

DISTURBED_SHARE = 0.25  # others' CPU seconds per wall second above which a call counts as disturbed


def _own_tree() -> set[int]:
    me = psutil.Process(os.getpid())
    try:
        return {me.pid, *(c.pid for c in me.children(recursive=True))}
    except psutil.Error:
        return {me.pid}


def others_cpu() -> dict[int, float]:
    """CPU seconds (user + system) so far of every process outside this one's tree, by pid."""
    try:
        own = _own_tree()
        seen: dict[int, float] = {}
        for p in psutil.process_iter(["pid", "cpu_times"]):
            times = p.info.get("cpu_times")
            if p.info["pid"] not in own and times is not None:
                seen[p.info["pid"]] = times.user + times.system
        return seen
    except psutil.Error:  # the process table can change under us; a missed snapshot is not an error
        return {}


@dataclass
class OtherLoad:
    """A snapshot at the start of a call; `share()` after it: others' CPU seconds per wall second."""

    start_cpu: dict[int, float]
    start_s: float

    @classmethod
    def now(cls) -> OtherLoad:
        return cls(others_cpu(), time.perf_counter())

    def share(self) -> float:
        wall = time.perf_counter() - self.start_s
        end = others_cpu()
        # a process that started during the call counts from 0; one that ended is lost (a short job may hide)
        used = sum(t - self.start_cpu.get(pid, 0.0) for pid, t in end.items())
        return max(0.0, used) / wall if wall > 0 else 0.0


def disturbed_reason(share: float, threshold: float = DISTURBED_SHARE) -> str | None:
    if share <= threshold:
        return None
    return f"other processes used {share:.0%} of a core during this call (over {threshold:.0%})"

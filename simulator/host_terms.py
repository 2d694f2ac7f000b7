"""An engine's host work, measured with its forwards taken out, and the simulator's host terms it gives.

saguaro.calibration.host_terms runs the engine (AR, SD and SSD, the SSD worker in the target's process) with
every forward replaced by one that returns fixed logits at once, and times its decode rounds at two batch
sizes or more: `HostRound` holds one strategy's medians at one batch size. Everything left in a round is the
engine's own work (sampling, verification, KV bookkeeping, the worker's lookups, rankings and cache), which a
forward's time does not show. This module turns those rounds into `EngineCosts` (the roofline's terms) and
into the per-strategy work outside the timed verify and draft (a fitted timing's overhead), each a line in the
batch size (fixed ms, ms per sequence): with two batch sizes the lines pass through both points exactly, unless
that would put a term below zero (then it is held at zero and the other part misses each point by the least
fraction of it: least squares on relative error with both parts >= 0).

With the forwards at zero the simulator's host parts of a round over b sequences are (simulator.timing):
- AR's round:            A(b) = round_host_ms + b·round_row_us;
- SD's and SSD's verify: A(b) + V(b), V(b) = verify_host_ms + b·verify_row_us;
- SD's round:            A(b) + V(b) + K·D(b), D(b) = draft_host_ms + b·draft_row_us (per draft forward);
- SSD's cache build:     (K + 1)·D(b) + K·(tree_step_overhead_ms + n·build_row_us) over n branch rows (its glue
                         forward and K tree steps, each a draft forward).
So `engine_costs` reads A from AR's steps, V from SSD's target side (its step less its wait for the worker),
D from SD's steps less A and V, and the tree-step terms from SSD's builds against their branches. What the
simulator has no term for is kept as measured: the in-process worker's answer before its build (the wait less
the build), which the link latency stands for.

No torch here: the simulator never imports the engine.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
from scipy.optimize import nnls

from simulator.timing import EngineCosts
from theory.glossary import Strategy


@dataclass(frozen=True)
class HostRound:
    """One strategy's decode rounds at one batch size with the forwards taken out: medians over `rounds`, ms.

    step_ms        one step of the decode loop that ran the round (all of the engine's work for it);
    verify_ms      the round record's verify (the target's forward, at zero, and the verification around it);
    draft_ms       the round record's drafting on the critical path: SD's K forwards, SSD's wait for the worker
                   (in the target's process: its answer and then its next cache build);
    target_ms      the target's side of the round: its step less its drafting (SSD: less its wait);
    outside_ms     the step's work outside its timed verify and drafting (what a round record's timers leave out);
    draft_forwards draft forwards a round on the critical path (SD);
    build_ms       SSD: the worker's cache build;
    branches       SSD: branch rows a build decodes (the batch's);
    answer_ms      SSD: the worker's answer before its build (the in-process wait less that round's build);
    accepted       the fraction of drafted tokens accepted (1: every speculation right, as the fixed logits
                   make it).
    The differences (target_ms, outside_ms, answer_ms) are medians of each round's own, not differences of
    medians: a round that a busy machine slowed moves both of its parts at once.
    """

    strategy: str
    batch: int
    step_ms: float
    verify_ms: float
    draft_ms: float
    target_ms: float
    outside_ms: float
    rounds: int
    draft_forwards: float = 0.0
    build_ms: float | None = None
    branches: float | None = None
    answer_ms: float | None = None
    accepted: float | None = None

    def __post_init__(self) -> None:
        Strategy(self.strategy)  # a ValueError names the strategy that is not one
        if self.batch < 1 or self.rounds < 1:
            raise ValueError(f"a host round needs batch >= 1 and rounds >= 1; got {self.batch}, {self.rounds}")
        if self.strategy == Strategy.SSD.value and (self.build_ms is None or self.branches is None):
            raise ValueError("an SSD host round needs its build_ms and branches")


def _line(points: Mapping[Any, float], what: str) -> tuple[float, float]:
    """(value at 0, slope) of the line through (x, y) points, least squares on relative error with neither below
    zero: exact through two points whose line has both >= 0; where it would not, the line with the other held at
    zero that misses each point by the least fraction of it (work that grows faster than the rows, such as SSD's
    vocabulary-wide ranking of 120 branch rows whose logits outgrow the caches, would put the fixed part below
    zero)."""
    if len(points) < 2:
        raise ValueError(f"{what} needs rounds at two batch sizes or more; got {sorted(points)}")
    xs = np.asarray(list(points), dtype=float)
    ys = np.asarray(list(points.values()), dtype=float)
    w = 1.0 / np.maximum(np.abs(ys), 1e-9)
    (intercept, slope), _ = nnls(np.stack([w, xs * w], axis=1), ys * w)
    return float(intercept), float(slope)


def _by_batch(rounds: list[HostRound], strategy: Strategy) -> dict[int, HostRound]:
    found = {r.batch: r for r in rounds if r.strategy == strategy.value}
    if not found:
        raise ValueError(f"no {strategy.value} host rounds: measure ar, sd and ssd (saguaro.calibration.host_terms)")
    return found


def engine_costs(rounds: list[HostRound], K: int) -> EngineCosts:
    """The EngineCosts host terms that make the simulator's host parts of AR's and SD's rounds, SSD's target
    side and SSD's builds equal the measured ones at each batch size (module docstring; terms the points would
    put below zero are held at zero, `_line`). ValueError without AR, SD and SSD at the same two batch sizes or
    more."""
    if K < 1:
        raise ValueError(f"K must be >= 1; got {K}")
    ar, sd, ssd = (_by_batch(rounds, s) for s in (Strategy.AR, Strategy.SD, Strategy.SSD))
    batches = sorted(set(ar) & set(sd) & set(ssd))
    if len(batches) < 2:
        raise ValueError(
            f"AR, SD and SSD need host rounds at two common batch sizes or more; got AR {sorted(ar)}, "
            f"SD {sorted(sd)}, SSD {sorted(ssd)}"
        )
    A = {b: ar[b].step_ms for b in batches}
    V = {b: ssd[b].target_ms - A[b] for b in batches}
    D = {b: (sd[b].step_ms - A[b] - V[b]) / K for b in batches}
    # an SSD HostRound always has its build and branches (HostRound.__post_init__)
    step = {cast(float, ssd[b].branches): (cast(float, ssd[b].build_ms) - (K + 1) * D[b]) / K for b in batches}
    round_ms, round_row = _line(A, "AR's round")
    verify_ms, verify_row = _line(V, "SSD's target side")
    draft_ms, draft_row = _line(D, "SD's draft forward")
    tree_ms, branch_row = _line(step, "SSD's tree step")
    return EngineCosts(
        round_host_ms=round_ms,
        round_row_us=round_row * 1e3,
        verify_host_ms=verify_ms,
        verify_row_us=verify_row * 1e3,
        draft_host_ms=draft_ms,
        draft_row_us=draft_row * 1e3,
        tree_step_overhead_ms=tree_ms,
        build_row_us=branch_row * 1e3,
    )


def outside_terms(rounds: list[HostRound]) -> dict[str, tuple[float, float]]:
    """Per strategy measured at two batch sizes or more, the work outside a round record's timed verify and
    drafting as a line in the batch: (ms at batch 0, ms per sequence). A fitted timing's overhead (the round
    less its verify and drafting) is this where its records time nothing outside them, as a calibration's
    points do (simulator.fit.FittedTiming.with_host_overhead)."""
    out = {}
    for strategy in Strategy:
        points = {r.batch: r.outside_ms for r in rounds if r.strategy == strategy.value}
        if len(points) >= 2:
            out[strategy.value] = _line(points, f"{strategy.value}'s outside work")
    return out


@dataclass(frozen=True)
class HostTerms:
    """A host-work measurement: its rounds, the K they ran at, and where and how it ran (`meta`: the CPU model,
    the commit, the date, the load average, the models' vocabulary, the command)."""

    K: int
    rounds: tuple[HostRound, ...]
    meta: dict = field(default_factory=dict)

    def costs(self) -> EngineCosts:
        return engine_costs(list(self.rounds), self.K)

    def outside(self) -> dict[str, tuple[float, float]]:
        return outside_terms(list(self.rounds))

    def to_dict(self) -> dict:
        """JSON-ready: the measurement, and the terms derived from it, for reading (`from_dict` derives anew; where
        the rounds give no terms, "engine_costs" says why)."""
        try:
            costs = self.costs()
            terms: dict = {name: round(getattr(costs, name), 4) for name in HOST_FIELDS}
        except ValueError as err:
            terms = {"error": str(err)}
        return {
            "K": self.K,
            "meta": self.meta,
            "rounds": [asdict(r) for r in self.rounds],
            "engine_costs": terms,
            "outside_ms": {s: [round(a, 4), round(b, 4)] for s, (a, b) in self.outside().items()},
        }

    @classmethod
    def from_dict(cls, data: dict) -> HostTerms:
        try:
            rounds = tuple(HostRound(**r) for r in data["rounds"])
            return cls(int(data["K"]), rounds, dict(data.get("meta") or {}))
        except (KeyError, TypeError) as err:
            raise ValueError(
                f"not a host-terms measurement ({err}): it needs K and rounds, as "
                "saguaro.calibration.host_terms writes them"
            ) from None


HOST_FIELDS = (
    "round_host_ms",
    "round_row_us",
    "verify_host_ms",
    "verify_row_us",
    "draft_host_ms",
    "draft_row_us",
    "tree_step_overhead_ms",
    "build_row_us",
)  # the EngineCosts fields a host measurement sets


def read_host_terms(path: str | Path) -> HostTerms:
    """A host-terms file (simulator/data/, or `saguaro calibrate`'s summary's "host_terms")."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no host-terms file at {path}")
    return HostTerms.from_dict(json.loads(path.read_text()))

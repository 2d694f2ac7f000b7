"""What one engine replica asks of Ray, and the check that N of them fit the cluster before anything starts.

An AR or SD replica is one process: on a CPU `threads` cores (1 unless --threads says more), on a GPU one device.
An SSD replica is two processes, the target and its draft worker, each with hardware of its own: on a CPU
`threads` + `draft_threads` cores, on GPUs two devices (the worker takes the one after the target's). The replica
actor holds them all, so Ray places the pair on one node and the worker, a child of the actor, sees both GPUs.
Ray's CPU counts are logical: Ray does not pin processes to cores.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ReplicaResources:
    """The hardware of one replica: `device` "cpu" or "cuda", the target's and the draft worker's share of it."""

    device: str = "cpu"
    threads: int = 1  # the target's cores on a CPU
    draft_threads: int = 0  # SSD's draft worker's cores on a CPU (0: no worker)
    draft_worker: bool = False  # SSD: the replica is two processes

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"replicas run on --device cpu or cuda, got {self.device!r}")
        if self.threads < 1 or self.draft_threads < 0:
            raise ValueError(f"threads must be >= 1 and draft threads >= 0, got {self.threads}, {self.draft_threads}")

    @classmethod
    def for_strategy(cls, strategy: str, device: str, threads: int | None, draft_threads: int) -> ReplicaResources:
        ssd = strategy == "ssd"
        device = "cuda" if device.startswith("cuda") else device
        return cls(device=device, threads=threads or 1, draft_threads=draft_threads if ssd else 0, draft_worker=ssd)

    def demand(self) -> dict[str, float]:
        """Ray resources of one replica (its actor's num_cpus / num_gpus)."""
        if self.device == "cuda":
            return {"CPU": 1.0, "GPU": 2.0 if self.draft_worker else 1.0}
        return {"CPU": float(self.threads + self.draft_threads)}

    def actor_options(self) -> dict[str, float]:
        demand = self.demand()
        return {"num_cpus": demand["CPU"], "num_gpus": demand.get("GPU", 0.0)}

    def describe(self) -> str:
        if self.device == "cuda":
            return "2 GPUs (target and SSD draft worker)" if self.draft_worker else "1 GPU"
        if self.draft_worker:
            return (
                f"{self.threads + self.draft_threads} CPUs (target {self.threads}, SSD draft worker "
                f"{self.draft_threads})"
            )
        return f"{self.threads} CPU{'s' if self.threads > 1 else ''}"


def replicas_that_fit(resources: ReplicaResources, nodes: Sequence[Mapping[str, float]]) -> int:
    """How many replicas the nodes' resources hold, each replica on one node."""
    demand = resources.demand()
    return sum(min(math.floor(node.get(kind, 0.0) / need + 1e-9) for kind, need in demand.items()) for node in nodes)


def check_fit(replicas: int, resources: ReplicaResources, nodes: Sequence[Mapping[str, float]]) -> None:
    """ValueError, saying what is missing, unless `replicas` replicas fit the nodes' resources."""
    if replicas < 1:
        raise ValueError(f"--replicas must be >= 1, got {replicas}")
    fit = replicas_that_fit(resources, nodes)
    if fit < replicas:
        have = ", ".join(f"{node.get('CPU', 0):g} CPUs and {node.get('GPU', 0):g} GPUs" for node in nodes)
        raise ValueError(
            f"{replicas} replicas need {resources.describe()} each on one node, and the Ray cluster "
            f"holds {fit} ({len(nodes)} node{'s' if len(nodes) != 1 else ''}: {have}): lower --replicas "
            "or --threads, or add nodes"
        )

"""How many engine replicas, on what hardware, routed how (no Ray import here: the launcher must set up Ray's
environment before ray is first imported)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from server.replicas.resources import ReplicaResources

PREFIX_TOKENS = 32  # prompts that share this many leading token ids share a home replica (routing `prefix`)
LOAD_BOUND = 4  # the home is passed over once it has this many more requests in flight than the least loaded


class Routing(str, Enum):
    """`saguaro serve --routing` (server.replicas.routing)."""

    POWER_OF_TWO = "pow2"  # Ray Serve's power of two choices on requests in flight
    PREFIX = "prefix"  # a home replica per prompt prefix, within a load bound


@dataclass(frozen=True)
class ReplicaOptions:
    """The engine replicas of one application.

    batch        each engine's batch rows (its --batch)
    max_waiting  requests each engine queues beyond its batch rows; the router queues up to max_waiting more in
                 front of all replicas, then answers 503
    """

    replicas: int = 1
    resources: ReplicaResources = ReplicaResources()
    routing: Routing = Routing.POWER_OF_TWO
    batch: int = 8
    max_waiting: int = 64
    prefix_tokens: int = PREFIX_TOKENS
    load_bound: int = LOAD_BOUND

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"--replicas must be >= 1, got {self.replicas}")
        if self.batch < 1 or self.max_waiting < 1:
            raise ValueError(f"batch and max_waiting must be >= 1, got {self.batch} and {self.max_waiting}")
        if self.prefix_tokens < 1 or self.load_bound < 0:
            raise ValueError(
                f"--prefix-tokens must be >= 1 and --load-bound >= 0, got {self.prefix_tokens} and {self.load_bound}"
            )
        try:
            object.__setattr__(self, "routing", Routing(self.routing))
        except ValueError:
            raise ValueError(
                f"--routing must be one of {', '.join(r.value for r in Routing)}, got {self.routing!r}"
            ) from None

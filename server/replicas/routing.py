"""How the ingress picks an engine replica for a request: Ray Serve's request router, with one of two policies.

- `pow2` (the default): Ray Serve's own PowerOfTwoChoicesRequestRouter: two replicas at random, the one with fewer
  requests in flight.
- `prefix`: `PrefixAffinityRouter`, written against Ray Serve's RequestRouter interface. Requests whose prompts
  begin with the same `prefix_tokens` token ids share a home replica, the one that ranks first by rendezvous
  hashing of (that prefix, replica id): every router computes the same home without shared state, and when a
  replica leaves only its own prefixes move. The home is chosen while it has at most `load_bound` more requests in
  flight than the least loaded replica; past that, and for prompts shorter than the prefix, power of two choices.
  Affinity pays once the engine keeps a prefix cache (a replica that has seen a prefix skips its prefill); until
  then it only concentrates load.

Ray Serve LLM's PrefixCacheAffinityRouter matches prompts character by character in a prefix tree held by an
actor of its own; this policy keeps no state and reads the token ids the ingress has already made.
"""

from __future__ import annotations

import hashlib
import random

import numpy as np
from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica

from server.replicas.options import LOAD_BOUND, PREFIX_TOKENS, Routing


def router_config(routing: Routing, prefix_tokens: int = PREFIX_TOKENS, load_bound: int = LOAD_BOUND):
    """Ray Serve's RequestRouterConfig for the engine replicas' deployment."""
    from ray.serve.config import RequestRouterConfig

    if Routing(routing) is Routing.POWER_OF_TWO:
        return RequestRouterConfig()  # Ray Serve's PowerOfTwoChoicesRequestRouter
    return RequestRouterConfig(
        request_router_class=f"{__name__}:PrefixAffinityRouter",
        request_router_kwargs={"prefix_tokens": prefix_tokens, "load_bound": load_bound},
    )


def prefix_key(prompt_ids: list[int], prefix_tokens: int) -> bytes | None:
    """The bytes a prompt's home is hashed from: its first `prefix_tokens` ids; None for a shorter prompt."""
    if len(prompt_ids) < prefix_tokens:
        return None
    return np.asarray(prompt_ids[:prefix_tokens], dtype=np.int64).tobytes()


def rendezvous_order(key: bytes, replica_ids: list[str]) -> list[str]:
    """The replicas by their rendezvous score for `key`, highest first (the home is the first)."""

    def score(replica: str) -> bytes:
        return hashlib.blake2b(key + replica.encode(), digest_size=8).digest()

    return sorted(replica_ids, key=score, reverse=True)


def prompt_ids_of(request: PendingRequest | None) -> list[int] | None:
    """The prompt ids of an engine request (server.replicas.replica.EngineRequest), None for any other call."""
    if request is None or not request.args:
        return None
    return getattr(request.args[0], "prompt_ids", None)


class PrefixAffinityRouter(FIFOMixin, RequestRouter):
    """Prefix affinity with a load bound, else power of two choices (the module's docstring)."""

    def initialize_state(self, prefix_tokens: int = PREFIX_TOKENS, load_bound: int = LOAD_BOUND, **_):
        self.prefix_tokens = prefix_tokens
        self.load_bound = load_bound

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        ids = prompt_ids_of(pending_request)
        key = None if ids is None else prefix_key(ids, self.prefix_tokens)
        if key is not None and len(candidate_replicas) > 1:
            by_id = {r.replica_id.to_full_id_str(): r for r in candidate_replicas}
            home = by_id[rendezvous_order(key, list(by_id))[0]]
            loads = await self._in_flight(candidate_replicas)
            known = [n for n in loads.values() if n is not None]
            home_load = loads.get(home.replica_id)
            if home_load is not None and known and home_load <= min(known) + self.load_bound:
                others = [r for r in candidate_replicas if r is not home]
                return [[home], random.sample(others, min(2, len(others)))]
        return [random.sample(candidate_replicas, min(2, len(candidate_replicas)))]

    async def _in_flight(self, replicas: list[RunningReplica]) -> dict:
        """Requests in flight at each replica: from Ray Serve's queue-length cache, probing the ones it lacks."""
        loads = {r.replica_id: self.replica_queue_len_cache.get(r.replica_id) for r in replicas}
        missing = [r for r in replicas if loads[r.replica_id] is None]
        if missing:
            for replica, queue_len in await self._probe_queue_lens(missing, 0):
                loads[replica.replica_id] = queue_len
        return loads

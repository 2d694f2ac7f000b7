"""The engine replicas as the ingress sees them: the server's `AsyncEngine` and `ServedModel` (server.engine_api)
over a Ray Serve DeploymentHandle, so that `server.create_app` serves them as it serves one local engine.

A request goes to the replica the handle's request router picks, and its chunks stream back through the handle.
Errors keep their meaning: a replica's ValueError, QueueFull or EngineStopped is raised as itself (not wrapped in
Ray's RayTaskError), a router whose queue is full (Ray Serve's BackPressureError) is QueueFull, and a replica that
dies is EngineFailed. A replica that dies before a request's first chunk costs the request nothing: it is sent
again, to another replica (up to SEND_ATTEMPTS times); one that dies mid-stream ends that stream with an error.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence

from engine import Chunk, EngineFailed, QueueFull, SamplingParams, ServingStats
from engine.prompt_input import encode_chat, encode_ids, encode_text
from server.replicas.replica import EngineRequest, ModelFacts, ReplicaReport

log = logging.getLogger("server")

SEND_ATTEMPTS = 3  # tries of a request whose replica died before its first chunk
REPORT_STALE_S = 5.0  # a replica that has not reported for this long is taken for gone


class ReplicaBoard:
    """The latest report of each replica, by replica id (kept in the ingress)."""

    def __init__(self, stale_s: float = REPORT_STALE_S):
        self.stale_s = stale_s
        self._reports: dict[str, tuple[float, ReplicaReport]] = {}

    def note(self, report: ReplicaReport) -> None:
        self._reports[report.replica] = (time.monotonic(), report)

    def live(self) -> dict[str, ReplicaReport]:
        """The replicas heard from within `stale_s`, by id; older reports are dropped."""
        now = time.monotonic()
        for replica in [r for r, (at, _) in self._reports.items() if now - at > self.stale_s]:
            del self._reports[replica]
        return {replica: report for replica, (_, report) in sorted(self._reports.items())}


def total(stats: Sequence[ServingStats], strategy: str) -> ServingStats:
    """The replicas' counters added up (gauges too: requests running and waiting over all replicas)."""
    if not stats:
        return ServingStats(strategy=strategy)

    def add(values):
        first = values[0]
        if isinstance(first, tuple):
            width = max(len(v) for v in values)
            return tuple(sum(v[i] for v in values if i < len(v)) for i in range(width))
        if first is None or isinstance(first, str):
            return first
        return sum(values)

    fields = {f.name: add([getattr(s, f.name) for s in stats]) for f in dataclasses.fields(ServingStats)}
    strategies = sorted({s.strategy for s in stats})
    fields["strategy"] = strategies[0] if len(strategies) == 1 else ",".join(strategies)
    capacities = [s.cache_capacity_tokens for s in stats]
    fields["cache_capacity_tokens"] = None if None in capacities else sum(capacities)
    return ServingStats(**fields)


class RemoteModel:
    """ServedModel from a replica's ModelFacts: the ingress tokenizes and checks requests with the engine's own
    functions (engine.prompt_input), so a request is refused or sized exactly as one engine would."""

    def __init__(self, facts: ModelFacts, board: ReplicaBoard):
        self.facts = facts
        self.tokenizer = facts.tokenizer
        self.model_name = facts.model_name
        self.max_context = facts.max_context
        self.config = facts.config
        self._board = board

    @property
    def strategy_in_use(self) -> str:
        reports = self._board.live().values()
        return total([r.stats for r in reports], self.facts.strategy).strategy

    @property
    def fault(self) -> str | None:
        faults = [f"{replica}: {r.fault}" for replica, r in self._board.live().items() if r.fault]
        return "; ".join(faults) or None

    def encode(self, prompt: str | list[int], chat: bool = False) -> list[int]:
        if isinstance(prompt, str):
            return encode_text(self.tokenizer, prompt, chat)
        return encode_ids(prompt, self.facts.vocab_size)

    def encode_chat(self, messages: Sequence[dict[str, str]]) -> list[int]:
        return encode_chat(self.tokenizer, messages)

    def room(self, prompt_ids: list[int]) -> int | None:
        if self.max_context is None:
            return None
        return self.max_context - len(prompt_ids) - self.facts.lookahead


def _dead_replica(err: BaseException) -> bool:
    from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

    return isinstance(err, (ActorDiedError, ActorUnavailableError, RayActorError))


def _unwrapped(err: BaseException) -> BaseException:
    """What the replica raised, without Ray's wrapping; Ray Serve's back-pressure as QueueFull."""
    from ray.exceptions import RayTaskError
    from ray.serve.exceptions import BackPressureError

    if isinstance(err, BackPressureError):
        return QueueFull(f"every replica's queue is full: {err}")
    if isinstance(err, RayTaskError) and err.cause is not None:
        return err.cause
    return err


class RemoteStream:
    """One request's chunks from whichever replica the router picks (server.engine_api.ChunkStream)."""

    def __init__(self, handle, request: EngineRequest, on_end):
        self._handle = handle
        self._request = request
        self._on_end = on_end
        self._calls = 0
        self._replies = None  # Ray Serve's DeploymentResponseGenerator
        self._chunks = 0

    def __aiter__(self):
        return self

    async def __anext__(self) -> Chunk:
        while True:
            try:
                if self._replies is None:
                    self._calls += 1
                    self._replies = self._handle.options(stream=True).generate.remote(self._request)
                chunk = await self._replies.__anext__()
            except StopAsyncIteration:
                self._end()
                raise
            except Exception as err:  # noqa: BLE001  Ray wraps the replica's error: unwrapped and raised below
                cause = _unwrapped(err)
                if _dead_replica(cause):
                    if self._chunks == 0 and self._calls < SEND_ATTEMPTS:
                        log.warning(
                            "the replica died before %s began (%s): sending it again",
                            self._request.request_id,
                            type(cause).__name__,
                        )
                        self._replies = None
                        continue
                    self._end()
                    raise EngineFailed(f"the replica serving this request died ({type(cause).__name__})") from None
                self._end()
                raise cause from None
            self._chunks += 1
            # The replica's perf_counter is another process's (another host's, on a cluster): times move to ours.
            now = time.perf_counter()
            shift = now - chunk.time_s
            scheduled = None if chunk.scheduled_s is None else chunk.scheduled_s + shift
            return dataclasses.replace(chunk, time_s=now, scheduled_s=scheduled)

    async def aclose(self) -> None:
        """Stop the request: Ray cancels the replica's generator, which aborts it in that engine."""
        if self._replies is not None:
            self._replies.cancel()
        self._end()

    def _end(self) -> None:
        self._on_end(self._request.request_id)


class RemoteEngine:
    """AsyncEngine over the engine replicas' DeploymentHandle. `stats()` adds the replicas' reports up;
    `stats_by_replica()` gives them one by one (the metrics' `replica` label)."""

    def __init__(self, handle, board: ReplicaBoard, strategy: str):
        self.handle = handle
        self.board = board
        self.strategy = strategy
        self._streams: dict[str, RemoteStream] = {}

    def generate(self, prompt_ids: list[int], params: SamplingParams, request_id: str) -> RemoteStream:
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already in flight")
        stream = RemoteStream(
            self.handle, EngineRequest(request_id, list(prompt_ids), params), lambda rid: self._streams.pop(rid, None)
        )
        self._streams[request_id] = stream
        return stream

    def abort(self, request_id: str) -> None:
        stream = self._streams.get(request_id)
        if stream is not None and stream._replies is not None:
            stream._replies.cancel()

    def stats(self) -> ServingStats:
        return total([r.stats for r in self.board.live().values()], self.strategy)

    def stats_by_replica(self) -> Mapping[str, ServingStats]:
        return {replica: report.stats for replica, report in self.board.live().items()}

    def shutdown(self, deadline_s: float = 30.0) -> None:
        """Nothing to stop here: Ray Serve stops the replicas (server.replicas.launch drains the ingress first)."""

    @property
    def in_flight(self) -> int:
        return len(self._streams)

"""The Ray Serve application: N engine replicas behind one FastAPI ingress that is the plain server's app.

    client -> Ray Serve's HTTP proxy -> Ingress (server.create_app over RemoteEngine) -> request router
           -> EngineReplica x N (engine.LLM + AsyncLLM), chunks streamed back through the DeploymentHandle

The ingress tokenizes and checks each request with the engine's own functions, so the OpenAI API (streaming,
errors, API key, request-size limit, /health, /metrics, /v1/models) is exactly the plain server's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from ray import serve

from engine import LLM
from server.app import create_app
from server.context import ServerSettings
from server.replicas.loopback import keep_serve_on_loopback
from server.replicas.options import ReplicaOptions
from server.replicas.remote import RemoteEngine, RemoteModel, ReplicaBoard
from server.replicas.replica import EngineReplica, ReplicaReport
from server.replicas.routing import router_config

APP_NAME = "saguaro"
INGRESS = "Ingress"
ENGINE = "EngineReplica"
DRAIN_POLL_S = 0.05
HEALTH_CHECK_PERIOD_S = 2.0  # how often Ray checks a replica (a dead actor is also reported at once)


class Ingress:
    """The FastAPI ingress deployment: the plain server's app, whose engine is the replicas' DeploymentHandle."""

    async def __init__(self, engine, settings: ServerSettings):
        keep_serve_on_loopback()
        self.board = ReplicaBoard()
        facts = await engine.facts.remote()  # from any replica: all serve the same model
        self.engine = RemoteEngine(engine, self.board, facts.strategy)
        self.model = RemoteModel(facts, self.board)
        self.settings = settings
        self.served = None

    def __serve_build_asgi_app__(self):
        self.served = create_app(self.model, self.engine, self.settings)
        return self.served

    def note_replica(self, report: ReplicaReport) -> None:
        """A replica's counters (every replica sends them each server.replicas.replica.STATS_PERIOD_S)."""
        self.board.note(report)

    def replicas(self) -> list[str]:
        """The replicas heard from lately."""
        return list(self.board.live())

    async def drain(self, timeout_s: float) -> int:
        """Turn new requests away (503) and wait up to `timeout_s` for those in flight; returns how many are left."""
        ctx = self.served.state.ctx
        ctx.draining = True
        end = time.monotonic() + timeout_s
        while ctx.in_flight and time.monotonic() < end:
            await asyncio.sleep(DRAIN_POLL_S)
        return ctx.in_flight


def application(build: Callable[[], LLM], options: ReplicaOptions, settings: ServerSettings):
    """The bound Ray Serve application (serve.run takes it)."""
    engine = serve.deployment(EngineReplica, name=ENGINE).options(
        num_replicas=options.replicas,
        ray_actor_options=options.resources.actor_options(),
        max_ongoing_requests=options.batch + options.max_waiting,
        max_queued_requests=options.max_waiting,
        request_router_config=router_config(options.routing, options.prefix_tokens, options.load_bound),
        health_check_period_s=HEALTH_CHECK_PERIOD_S,
        graceful_shutdown_timeout_s=1.0,  # the ingress has drained the requests already
    )
    ingress = serve.deployment(serve.ingress()(Ingress), name=INGRESS).options(
        num_replicas=1,
        ray_actor_options={"num_cpus": 0},  # waits on the replicas; tokenizing is its only CPU work
    )
    replicas = engine.bind(build, options.max_waiting, INGRESS, APP_NAME)
    return ingress.bind(replicas, settings)

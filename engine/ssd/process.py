"""The draft worker's own OS process: `serve` is its main loop; `python -m engine.ssd.process tcp://host:port`
starts one by hand (e.g. on another host), which fetches its settings from the target's store.

The target starts it with torch.multiprocessing "spawn" (no state forked from the target; engine.ssd.channel's
ProcessChannel). The child gets a picklable recipe for its model (engine.loading.recipe), never a live model;
it sets its torch threads and, on CPU, pins itself to its own cores. It connects to the rendezvous the target
hosts (engine.ssd.transport), sets JOINED_KEY once connected and READY_KEY once its model is built, and serves
until STOP or until the link breaks. It watches its parent, ignores Ctrl-C (engine.ssd.lifetime) and beats
(engine.ssd.heartbeat) from the moment it has joined, so the target can tell a stopped process from a busy one.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import sys
import time
from dataclasses import dataclass

import torch

from engine.config import SpeculativeConfig, StartFault, WorkerFaults
from engine.loading.recipe import DraftRecipe
from engine.ssd.heartbeat import beat
from engine.ssd.lifetime import WorkerExit, die_with_parent, ignore_sigint, silence_stderr
from engine.ssd.messages import MalformedMessage, Prefill, Round, Stop
from engine.ssd.transport import (
    DRAFT_RANK,
    Backend,
    DraftUnavailable,
    answer_challenge,
    connect,
    join_store,
    process_group,
)

log = logging.getLogger(__name__)
SPEC_KEY = "saguaro/worker_spec"
JOINED_KEY = "saguaro/worker_joined"  # the worker's answer to the challenge, once connected, before the group forms
SECRET_VARIABLE = "SAGUARO_DRAFT_SECRET"  # a worker started by hand reads the run's secret here
READY_KEY = "saguaro/worker_ready"  # set by the worker once its model is built
IDLE_S = 7 * 24 * 3600.0  # the worker waits for the next batch as long as the link is up (kept alive by the target)


@dataclass
class WorkerSpec:
    recipe: DraftRecipe
    spec: SpeculativeConfig
    pad_id: int
    address: str
    device: str  # with an index when a GPU (engine.ssd.placement.draft_device_for)
    threads: int
    cores: list[int] | None
    connect_s: float  # joining the store; also the longest send of an answer
    faults: WorkerFaults | None
    parent_pid: int | None = None  # the target's process (None: started by hand, maybe on another host)
    death_signal: bool = False  # Linux parent-death signal (only when the target's main thread started us)
    link_timeout_s: float = 300.0  # the link's timeout: no single wait on it is longer (engine.ssd.transport)
    backend: Backend = process_group  # makes the link's process group (engine.ssd.transport)
    secret: str = ""  # the run's secret, which the worker proves it holds when it joins (never posted in the store)


def serve(ws: WorkerSpec) -> None:
    """The worker process's main loop."""
    from engine.ssd.draft_worker import DraftWorker

    die_with_parent(ws.parent_pid, ws.death_signal)
    # Ctrl-C in a terminal reaches the whole process group: the target decides when the worker stops
    # (it sends STOP), so the worker neither dies mid-round nor prints its own traceback.
    ignore_sigint()
    faults = ws.faults or WorkerFaults()
    torch.set_num_threads(ws.threads)
    if ws.cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, ws.cores)
    device = torch.device(ws.device)
    if device.type == "cuda":
        if device.index is None:  # a hand-started worker given plain "cuda": the current GPU, named
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)  # no stray context on cuda:0 for a worker on another GPU
    if faults.at_start is StartFault.EXIT_BEFORE_JOINING:
        os._exit(WorkerExit.FAULT_INJECTED)
    store = join_store(ws.address, ws.connect_s)
    store.set(JOINED_KEY, answer_challenge(store, ws.secret))
    beat(store)
    endpoint = connect(store, DRAFT_RANK, device, ws.link_timeout_s, ws.backend)
    if faults.at_start is StartFault.EXIT_WHILE_LOADING:
        os._exit(WorkerExit.FAULT_INJECTED)
    if faults.at_start is StartFault.HANG_WHILE_LOADING:
        time.sleep(IDLE_S)
    worker = DraftWorker(ws.recipe.build(device), ws.spec, ws.pad_id, device, host_answers=True)
    store.set(READY_KEY, "1")
    try:
        while True:
            # adaptive K: the lengths asked for are checked in respond
            msg = endpoint.recv(IDLE_S, expect_K=None if ws.spec.adaptive else ws.spec.K)
            if isinstance(msg, Stop):
                return
            if isinstance(msg, Prefill):
                worker.prefill_ahead(msg)  # no answer: the next Round brings them as joins
                continue
            if isinstance(msg, Round):
                if msg.round == faults.exit_at_round:
                    os._exit(WorkerExit.FAULT_INJECTED)
                if msg.round == faults.hang_at_round:
                    time.sleep(IDLE_S)
                if msg.round == faults.stop_at_round:
                    os.kill(os.getpid(), signal.SIGSTOP)  # the whole process stops, its heartbeat with it
                reply = worker.respond(msg)
                if msg.round == faults.malformed_at_round:
                    reply.q = -reply.q  # not a distribution: the target must refuse it
            else:
                raise MalformedMessage(f"the worker cannot handle {type(msg).__name__}")
            endpoint.send(reply, ws.connect_s)
            worker.build_cache()
    except (DraftUnavailable, MalformedMessage, ValueError) as err:
        log.info("draft worker stops: %s", err)  # the target reports faults; the worker stays quiet
    finally:
        silence_stderr()
        endpoint.close()


def main(argv: list[str]) -> int:
    """Start a draft worker by hand (e.g. on another host): `SAGUARO_DRAFT_SECRET=... python -m engine.ssd.process
    tcp://host:port`, with the secret and address the target logged."""
    if len(argv) != 1:
        print("usage: python -m engine.ssd.process tcp://TARGET_HOST:PORT", file=sys.stderr)
        return 2
    secret = os.environ.get(SECRET_VARIABLE)
    if not secret:
        print(f"set {SECRET_VARIABLE} to the secret the target logged with its address", file=sys.stderr)
        return 2
    store = join_store(argv[0], 300.0)
    ws: WorkerSpec = pickle.loads(store.get(SPEC_KEY))
    ws.address, ws.cores, ws.parent_pid, ws.secret = argv[0], None, None, secret
    del store
    serve(ws)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

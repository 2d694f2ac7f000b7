"""The typed boundary between SSD's proposer (engine.strategies.ssd) and its draft worker: a `Channel`.

Two implementations: `InProcessChannel` calls the same DraftWorker directly in the target's process (no
overlap, identical results, so statistical tests can run tens of thousands of sequences without a second
process), and `ProcessChannel` talks to a worker in its own OS process (engine.ssd.process) over a
`Transport` (engine.ssd.transport). `open_channel` picks one from the placement.

The process channel starts the worker with torch.multiprocessing "spawn" and watches it while it starts: it
polls the store for the worker's JOINED and READY keys and the process's liveness, so a worker that dies before
it connects or while it loads its model is noticed at once (not at the start deadline). Once the worker has
connected, the channel keeps the link alive while it is idle (engine.ssd.transport); once it is ready, it
watches the worker's heartbeat (engine.ssd.heartbeat): a worker process that stops is killed within seconds,
which fails the exchange under way, so the fallback takes over as for a worker that died, long before
`deadline_s`. Closing always reaps the child: STOP, join, then terminate / kill if it does not leave. Faults
surface as `FAULTS`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import threading
import time
from collections.abc import Callable
from typing import Protocol

import torch
import torch.multiprocessing as mp

from engine.config import EngineConfig, SpeculativeConfig
from engine.loading.recipe import DraftRecipe, draft_recipe
from engine.ssd.draft_worker import DraftWorker
from engine.ssd.heartbeat import HeartbeatWatch
from engine.ssd.lifetime import explain_exit, spawn_with_sigint_blocked
from engine.ssd.messages import MalformedMessage, Prefill, Round, Speculation, Stop
from engine.ssd.placement import draft_device_for, worker_cores
from engine.ssd.process import JOINED_KEY, READY_KEY, SECRET_VARIABLE, SPEC_KEY, WorkerSpec, serve
from engine.ssd.transport import (
    TARGET_RANK,
    Backend,
    DraftUnavailable,
    Transport,
    check_answer,
    connect,
    host_store,
    new_secret,
    process_group,
)

log = logging.getLogger(__name__)
FAULTS = (DraftUnavailable, MalformedMessage)  # what an exchange may raise: the worker is lost
POLL_S = 0.05
JOIN_S = 10.0
TERM_S = 1.0  # the worker has no SIGTERM handler, so one that is running dies at once; a stopped one gets SIGKILL


class Channel(Protocol):
    """The target's handle on a draft worker: one Round out, one Speculation back, in order."""

    in_step: bool  # False while an exchange is under way: a stream broken off mid-way is out of step

    def wait_ready(self) -> None:
        """Block until the worker can answer (interruptible: nothing has been sent yet)."""

    def prefetch(self, msg: Prefill) -> None:
        """Announce prompts about to join, so the worker prefills them while the target does (no answer)."""

    def exchange(self, msg: Round) -> Speculation:
        """Send a Round and return the worker's answer (raises one of FAULTS)."""

    def close(self) -> None:
        """Stop the worker; safe to call twice and after a fault."""


class InProcessChannel:
    """The draft worker in the target's own process: the same DraftWorker, called directly."""

    in_step = True

    def __init__(self, draft: torch.nn.Module, spec: SpeculativeConfig, pad_id: int, device: torch.device):
        self.worker = DraftWorker(draft, spec, pad_id, device)

    def wait_ready(self) -> None:
        """The worker is built with the channel: always ready."""

    def prefetch(self, msg: Prefill) -> None:
        self.worker.prefill_ahead(msg)

    def exchange(self, msg: Round) -> Speculation:
        reply = self.worker.respond(msg)
        self.worker.build_cache()
        return reply

    def close(self) -> None:
        self.worker = None


class ProcessChannel:
    """The target's side of a draft worker process.

    take_cores  on a CPU-only pair, set the target's torch threads to the cores the worker leaves it while the
                worker runs (given back at close); off when the caller fixed the thread count.
    backend     makes the link's process group on both sides (engine.ssd.transport.process_group).
    """

    def __init__(
        self,
        recipe: DraftRecipe,
        spec: SpeculativeConfig,
        pad_id: int,
        target_device: torch.device,
        *,
        take_cores: bool = False,
        backend: Backend = process_group,
    ):
        placement = spec.placement
        self.spec = spec
        self.deadline_s = placement.deadline_s
        if recipe.slots is not None:  # a compiled worker compiles each shape the first time a round needs it
            self.deadline_s = max(placement.deadline_s, placement.start_deadline_s)
        self.start_deadline_s = placement.start_deadline_s
        draft_device = draft_device_for(target_device, placement.draft_device)  # indexed when a GPU
        # the worker's cores: only when both sides compute on the CPU (a GPU side needs no core of its own)
        on_cpu = target_device.type != "cuda" and draft_device.type == "cpu"
        cores, self.target_threads = worker_cores(placement.draft_threads) if on_cpu else (None, None)
        store, address = host_store(placement.init_method, placement.start_deadline_s)
        secret = new_secret()
        # every wait on the link fits in its timeout: the longest is the first answer's (max of the two deadlines)
        link_timeout_s = max(placement.start_deadline_s, self.deadline_s)
        ws = WorkerSpec(
            recipe,
            spec,
            pad_id,
            address,
            str(draft_device),
            placement.draft_threads,
            cores,
            placement.start_deadline_s,
            placement.faults,
            parent_pid=os.getpid(),
            death_signal=threading.current_thread() is threading.main_thread(),
            link_timeout_s=link_timeout_s,
            backend=backend,
            secret=secret,
        )
        self.process = None
        self.store = store
        self.endpoint: Transport | None = None
        self.ready = False  # the worker has built its model
        self.in_step = True  # False while an exchange is under way: a stream broken off mid-way is out of step
        self.fault: DraftUnavailable | None = None  # a Prefill that could not be sent, for the next exchange to raise
        self.posting: threading.Thread | None = None  # the last Prefill's send, under way while the worker builds
        self.threads_before: int | None = None  # the target's torch threads before it gave the worker its cores
        self.watch: HeartbeatWatch | None = None  # the worker's heartbeat, watched once it is ready
        self.lost: str | None = None  # why the heartbeat watch declared the worker lost
        self.address = address
        self.started = time.monotonic()
        if placement.external:
            store.set(SPEC_KEY, pickle.dumps(dataclasses.replace(ws, secret="")))  # its settings, without the secret
            log.warning(
                "waiting for a draft worker: run `%s=%s python -m engine.ssd.process %s` on the draft host",
                SECRET_VARIABLE,
                secret,
                address,
            )
        else:
            self.process = mp.get_context("spawn").Process(target=serve, args=(ws,), name="saguaro-draft", daemon=True)
        try:
            if self.process is not None:  # a Ctrl-C held while it starts is raised here, and reaps it below
                spawn_with_sigint_blocked(self.process.start)
                log.info("starting the draft worker (pid %d) on %s ...", self.process.pid, draft_device)
            self._await(JOINED_KEY, "connect")
            if not check_answer(store, JOINED_KEY, secret):
                raise DraftUnavailable("a process joined the draft link without this run's secret")
            self.endpoint = connect(store, TARGET_RANK, target_device, link_timeout_s, backend)
            self.endpoint.keep_alive()  # from now on: the worker may wait for its first batch for days
        except RuntimeError as err:  # DraftUnavailable included
            self.close()
            raise DraftUnavailable(f"the draft worker did not connect: {err}") from None
        except BaseException:  # Ctrl-C while it starts: reap it before leaving
            self.close()
            raise
        if take_cores and self.target_threads:
            self.threads_before = torch.get_num_threads()
            torch.set_num_threads(self.target_threads)  # the draft has its own core(s) now

    def _await(self, key: str, what: str) -> None:
        """Wait for the worker to set `key`, watching the process: a worker that died is reported at once."""
        deadline = time.monotonic() + self.start_deadline_s
        while not self.store.check([key]):
            if self.process is not None and not self.process.is_alive():
                code = self.process.exitcode
                raise DraftUnavailable(f"the draft worker process left before it could {what} ({explain_exit(code)})")
            if time.monotonic() > deadline:
                raise DraftUnavailable(f"the draft worker did not {what} within {self.start_deadline_s:g} s")
            time.sleep(POLL_S)

    def wait_ready(self) -> None:
        """Block until the worker has built its model (the first exchange only); interruptible, as nothing
        has been sent yet."""
        if not self.ready:
            self._await(READY_KEY, "load its model")
            self._now_ready()
            log.info("draft worker ready in %.1f s", time.monotonic() - self.started)

    def _now_ready(self) -> None:
        """The worker has built its model: watch its heartbeat (not while it loads: a long load may hold the
        interpreter for seconds at a time, and `_await` watches the process then)."""
        self.ready = True
        self.watch = HeartbeatWatch(self.store, self._lost)

    def _lost(self, reason: str) -> None:
        """The heartbeat watch's verdict (on its thread): a worker this channel started is killed, which breaks
        the link at once, so the exchange under way (or the next) fails and the fallback takes over; a worker on
        another host cannot be killed from here, and its deadline applies."""
        self.lost = reason
        if self.process is not None:
            log.info("%s; stopping it", reason)
            self.process.kill()  # SIGKILL ends a stopped process too
        else:
            log.warning("%s; a worker started by hand is not stopped from here (its deadline applies)", reason)

    def prefetch(self, msg: Prefill) -> None:
        """Announce prompts about to join, so the worker prefills them while the target does. Sent from a thread:
        a gloo send completes only once the worker posts its receive, which it does between rounds, so sent here
        it held the target until the worker's cache build ended. The next exchange (or close) waits for that
        thread before its own message, so the stream keeps its order; several Prefills go one after another.
        Skipped while the worker is still loading its model or between the two halves of an exchange; a link
        that fails here is reported by the next exchange."""
        if self.endpoint is None or self.endpoint.broken or not self.in_step or self.fault is not None:
            return
        if not self.ready:
            if not self.store.check([READY_KEY]):
                return
            self._now_ready()
        endpoint, before = self.endpoint, self.posting

        def send() -> None:
            if before is not None:
                before.join()
            if self.fault is None:
                try:
                    endpoint.send(msg, self.deadline_s)
                except DraftUnavailable as err:
                    self.fault = err  # the stream may hold half a message: the next exchange reports the fault

        self.posting = threading.Thread(target=send, name="saguaro-prefill", daemon=True)
        self.posting.start()

    def _posted(self, timeout_s: float | None = None) -> bool:
        """Wait for the Prefills under way (each send has its own deadline); False if one still is."""
        if self.posting is not None:
            self.posting.join(timeout_s)
            if self.posting.is_alive():
                return False
            self.posting = None
        return True

    def exchange(self, msg: Round) -> Speculation:
        self.wait_ready()
        if self.endpoint is None or (self.process is not None and not self.process.is_alive()):
            raise DraftUnavailable(self.lost or "the draft worker is not running")
        self._posted()  # the worker takes a Prefill after its build, before it can take this Round
        if self.fault is not None:
            raise self.fault
        if not self.in_step:
            raise DraftUnavailable("an earlier exchange with the draft worker broke off mid-way")
        # The first answer also prefills the batch; a long prefill is fine until the start deadline.
        timeout_s = self.deadline_s if msg.round else max(self.deadline_s, self.start_deadline_s)
        self.in_step = False
        try:
            self.endpoint.send(msg, timeout_s)
            reply = self.endpoint.recv(timeout_s, expect_K=(msg.K, msg.K_miss), expect_V=msg.V)
        except DraftUnavailable:
            if self.lost:  # the heartbeat watch killed the worker: say why
                raise DraftUnavailable(self.lost) from None
            raise
        self.in_step = True
        if not isinstance(reply, Speculation):
            raise DraftUnavailable(f"the draft worker answered {type(reply).__name__}, not a speculation")
        return reply

    def close(self) -> None:
        """Stop the worker and reap it; safe to call twice and after a fault."""
        if self.watch is not None:  # before the reaping: the watch must not kill a reaped pid
            self.watch.stop()
            self.watch = None
        # STOP only on a stream in step; a worker still loading its model is not waited for.
        orderly = self._posted(2.0) and self.endpoint is not None and not self.endpoint.broken and self.in_step
        if orderly and (self.process is None or self.process.is_alive()):
            try:
                self.endpoint.send(Stop(), 2.0)
            except DraftUnavailable:
                orderly = False
        if self.process is not None and self.process.pid is not None:
            self.process.join(JOIN_S if orderly and self.ready else 0.5)
            if self.process.is_alive():
                self.process.terminate()
                self.process.join(TERM_S)
            if self.process.is_alive():
                self.process.kill()
                self.process.join()
        if not self._posted(2.0):  # a Prefill still waits on a worker now gone: its send fails, the link is closed
            log.info("a Prefill to the draft worker is still under way at close")
        if self.endpoint is not None:
            self.endpoint.close()
            self.endpoint = None
        if self.threads_before is not None:  # the draft's core(s) are free again: the target takes them back
            torch.set_num_threads(self.threads_before)
            self.threads_before = None


def open_channel(
    draft: torch.nn.Module | None,
    given: torch.nn.Module | None,
    config: EngineConfig,
    pad_id: int,
    device: torch.device,
) -> Callable[[], Channel]:
    """A function that starts the draft worker: in process (on `draft`, the engine's draft model), or in its own
    process from a recipe (`given`: the model object the caller passed, None if passed by name)."""
    spec = config.speculative
    if spec.placement.in_process:
        return lambda: InProcessChannel(draft, spec, pad_id, device)
    recipe = draft_recipe(given, config)
    take_cores = config.threads is None and device.type == "cpu"
    return lambda: ProcessChannel(recipe, spec, pad_id, device, take_cores=take_cores)

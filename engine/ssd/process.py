"""The draft worker in its own OS process, and the target's handle on it.

Start: torch.multiprocessing "spawn" (no state forked from the target). The child gets a picklable
recipe for its model (an alias/path to load, or a config + state dict for in-memory models), never a
live model; it sets its torch threads and, on CPU, pins itself to its own cores. It connects to the
rendezvous the target hosts (engine.ssd.transport) and serves until STOP or until the link breaks.
Closing always reaps the child: STOP, join, then terminate / kill if it does not leave.

The target watches the child while it starts: it polls the store for the worker's JOINED and READY keys and
the process's liveness, so a worker that dies before it connects or while it loads its model is noticed at
once (not at the start deadline). The child watches its parent (engine.ssd.lifetime).
"""

from __future__ import annotations

import datetime
import logging
import os
import pickle
import sys
import threading
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from engine.config import DraftPlacement, SpeculativeConfig, StartFault, WorkerFaults
from engine.ssd.lifetime import (WorkerExit, die_with_parent, explain_exit, ignore_sigint, refuse_unguarded_main,
                                 silence_stderr, spawn_with_sigint_blocked)
from engine.ssd.messages import Prefill, Round, Speculation, Stop
from engine.ssd.transport import (DRAFT_RANK, DraftUnavailable, Endpoint, check_port_free, host_store,
                                  parse_init_method)

log = logging.getLogger(__name__)
SPEC_KEY = "saguaro/worker_spec"
JOINED_KEY = "saguaro/worker_joined"  # set by the worker once connected to the store, before the group forms
READY_KEY = "saguaro/worker_ready"  # set by the worker once its model is built
POLL_S = 0.05
IDLE_S = 7 * 24 * 3600.0  # the worker waits for the next batch as long as the link is up
JOIN_S = 10.0


@dataclass
class ModelRecipe:
    """How the child rebuilds the draft: load `path` (alias, folder, .gguf), or build `config` and load `state`."""

    path: str | None = None
    dtype: str = "float32"
    int8: bool = False
    cache_dir: str | None = None
    config: dict | None = None
    state: dict | None = None

    @classmethod
    def from_model(cls, model: torch.nn.Module, int8: bool = False) -> "ModelRecipe":
        if not hasattr(model, "config"):
            raise ValueError("an in-memory draft must be a transformers model (or pass it by alias / path)")
        if any(type(m).__module__.startswith("torch.ao") for m in model.modules()):
            raise ValueError("an int8-quantised draft object cannot be sent to SSD's worker process: pass the "
                             "float32 model (or its alias / path) with draft_int8=True")
        return cls(int8=int8, config=model.config.to_dict(),
                   state={k: v.detach().cpu() for k, v in model.state_dict().items()})

    def build(self, device: torch.device) -> torch.nn.Module:
        from transformers import AutoConfig, AutoModelForCausalLM

        if self.path is not None:
            from engine.models import TORCH_DTYPES, int8_dynamic, load_model

            model = load_model(self.path, dtype=TORCH_DTYPES[self.dtype], device=device, cache_dir=self.cache_dir).model
            return int8_dynamic(model) if self.int8 else model.eval()
        config = dict(self.config)
        config_class = AutoConfig.for_model(config.pop("model_type"), **config)
        dtype = next((v.dtype for v in self.state.values() if v.is_floating_point()), torch.float32)
        model = AutoModelForCausalLM.from_config(config_class).to(dtype)  # the weights' own dtype
        model.load_state_dict(self.state)
        model = model.to(device).eval()
        if self.int8:
            from engine.models import int8_dynamic

            model = int8_dynamic(model)
        return model


@dataclass
class WorkerSpec:
    recipe: ModelRecipe
    spec: SpeculativeConfig
    pad_id: int
    address: str
    device: str
    threads: int
    cores: list[int] | None
    connect_s: float
    faults: WorkerFaults | None
    parent_pid: int | None = None  # the target's process (None: started by hand, maybe on another host)
    death_signal: bool = False  # Linux parent-death signal (only when the target's main thread started us)
    nccl: bool | None = None  # the link: NCCL between two GPUs, else gloo over CPU tensors (None: by `device`)


def draft_device_for(target_device: torch.device, draft_device: str | None) -> torch.device:
    """The worker's device: the one asked for; else the CPU beside a CPU target; else a second GPU when
    there is one, and the target's own GPU otherwise (the worker still runs in its own process)."""
    if draft_device:
        return torch.device(draft_device)
    if target_device.type != "cuda":
        return torch.device("cpu")
    index = target_device.index or 0
    if torch.cuda.device_count() > 1:
        return torch.device("cuda", 1 if index == 0 else 0)
    return torch.device("cuda", index)


def uses_nccl(target_device: torch.device, draft_device: torch.device) -> bool:
    """Both sides must pick the same backend. NCCL links two different GPUs; a CPU on either side, or
    both ranks on one GPU (which NCCL refuses), goes over gloo with the tensors on the CPU."""
    if target_device.type != "cuda" or draft_device.type != "cuda":
        return False
    return (target_device.index or 0) != (draft_device.index or 0)


def preflight(placement: DraftPlacement) -> None:
    """Checks that need no model, run before loading any: the rendezvous port is free, and this is not a
    spawned process re-running the caller's unguarded script, and the draft device exists here."""
    if not placement.in_process:
        if not placement.external:
            refuse_unguarded_main()
            check_draft_device(placement.draft_device)
        check_port_free(placement.init_method)


def check_draft_device(draft_device: str | None) -> None:
    """Refuse a draft device this machine lacks (a worker started elsewhere is not checked here)."""
    if not draft_device:
        return
    from engine.models import check_device

    try:
        check_device(draft_device)
    except ValueError as err:
        reason = str(err).replace("use --device cpu", "use --draft-device cpu")
        raise ValueError(f"draft device: {reason}") from None


def serve(ws: WorkerSpec) -> None:
    """The worker process's main loop."""
    from engine.ssd.draft_worker import DraftWorker
    from engine.ssd.messages import MalformedMessage

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
        torch.cuda.set_device(device)  # no stray context on cuda:0 for a worker on another GPU
    nccl = ws.nccl if ws.nccl is not None else device.type == "cuda"
    host, port = parse_init_method(ws.address)
    if faults.at_start is StartFault.EXIT_BEFORE_JOINING:
        os._exit(WorkerExit.FAULT_INJECTED)
    store = dist.TCPStore(host, port, 2, False, timeout=datetime.timedelta(seconds=ws.connect_s))
    store.set(JOINED_KEY, str(os.getpid()))
    endpoint = Endpoint(store, DRAFT_RANK, host, device if nccl else torch.device("cpu"), ws.connect_s)
    if faults.at_start is StartFault.EXIT_WHILE_LOADING:
        os._exit(WorkerExit.FAULT_INJECTED)
    if faults.at_start is StartFault.HANG_WHILE_LOADING:
        time.sleep(IDLE_S)
    worker = DraftWorker(ws.recipe.build(device), ws.spec, ws.pad_id, device)
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


def _cores(threads: int) -> tuple[list[int] | None, int]:
    """The draft's cores (the last `threads` usable ones) and how many remain for the target."""
    if not hasattr(os, "sched_getaffinity"):
        return None, max(1, (os.cpu_count() or 2) - threads)
    usable = sorted(os.sched_getaffinity(0))
    if len(usable) <= threads:
        return None, max(1, len(usable) - threads)
    return usable[-threads:], len(usable) - threads


class ProcessChannel:
    """The target's side of a draft worker process."""

    def __init__(self, recipe: ModelRecipe, spec: SpeculativeConfig, pad_id: int, target_device: torch.device):
        placement = spec.placement
        self.spec = spec
        self.deadline_s = placement.deadline_s
        self.start_deadline_s = placement.start_deadline_s
        cuda = target_device.type == "cuda"
        draft_device = draft_device_for(target_device, placement.draft_device)
        nccl = uses_nccl(target_device, draft_device)
        # the worker's cores: only when both sides compute on the CPU (a GPU side needs no core of its own)
        on_cpu = not cuda and draft_device.type == "cpu"
        cores, self.target_threads = _cores(placement.draft_threads) if on_cpu else (None, None)
        store, address = host_store(placement.init_method, placement.start_deadline_s)
        ws = WorkerSpec(recipe, spec, pad_id, address, str(draft_device), placement.draft_threads, cores,
                        placement.start_deadline_s, placement.faults, parent_pid=os.getpid(),
                        death_signal=threading.current_thread() is threading.main_thread(), nccl=nccl)
        self.process = None
        self.store = store
        self.endpoint: Endpoint | None = None
        self.ready = False  # the worker has built its model
        self.in_step = True  # False while an exchange is under way: a stream broken off mid-way is out of step
        self.fault: DraftUnavailable | None = None  # a Prefill that could not be sent, for the next exchange to raise
        self.posting: threading.Thread | None = None  # the last Prefill's send, under way while the worker builds
        self.address = address
        self.started = time.monotonic()
        if placement.external:
            store.set(SPEC_KEY, pickle.dumps(ws))  # the hand-started worker reads its settings here
            log.warning("waiting for a draft worker: run `python -m engine.ssd.process %s` on the draft host", address)
        else:
            self.process = mp.get_context("spawn").Process(target=serve, args=(ws,), name="saguaro-draft", daemon=True)
        try:
            if self.process is not None:  # a Ctrl-C held while it starts is raised here, and reaps it below
                spawn_with_sigint_blocked(self.process.start)
                log.info("starting the draft worker (pid %d) on %s ...", self.process.pid, draft_device)
            self._await(JOINED_KEY, "connect")
            host, _ = parse_init_method(address)
            target_comm = torch.device("cuda", target_device.index or 0) if nccl else torch.device("cpu")
            self.endpoint = Endpoint(store, 0, host, target_comm, placement.start_deadline_s)
        except RuntimeError as err:  # DraftUnavailable included
            self.close()
            raise DraftUnavailable(f"the draft worker did not connect: {err}") from None
        except BaseException:  # Ctrl-C while it starts: reap it before leaving
            self.close()
            raise

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
            self.ready = True
            log.info("draft worker ready in %.1f s", time.monotonic() - self.started)

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
            self.ready = True
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
            raise DraftUnavailable("the draft worker is not running")
        self._posted()  # the worker takes a Prefill after its build, before it can take this Round
        if self.fault is not None:
            raise self.fault
        if not self.in_step:
            raise DraftUnavailable("an earlier exchange with the draft worker broke off mid-way")
        # The first answer also prefills the batch; a long prefill is fine until the start deadline.
        timeout_s = self.deadline_s if msg.round else max(self.deadline_s, self.start_deadline_s)
        self.in_step = False
        self.endpoint.send(msg, timeout_s)
        reply = self.endpoint.recv(timeout_s, expect_K=(msg.K, msg.K_miss), expect_V=msg.V)
        self.in_step = True
        if not isinstance(reply, Speculation):
            raise DraftUnavailable(f"the draft worker answered {type(reply).__name__}, not a speculation")
        return reply

    def close(self) -> None:
        """Stop the worker and reap it; safe to call twice and after a fault."""
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
                self.process.join(JOIN_S)
            if self.process.is_alive():
                self.process.kill()
                self.process.join()
        if not self._posted(2.0):  # a Prefill still waits on a worker now gone: its send fails, the link is closed
            log.info("a Prefill to the draft worker is still under way at close")
        if self.endpoint is not None:
            self.endpoint.close()
            self.endpoint = None


def main(argv: list[str]) -> int:
    """Start a draft worker by hand (e.g. on another host): `python -m engine.ssd.process tcp://host:port`."""
    if len(argv) != 1:
        print("usage: python -m engine.ssd.process tcp://TARGET_HOST:PORT", file=sys.stderr)
        return 2
    host, port = parse_init_method(argv[0])
    store = dist.TCPStore(host, port, 2, False, timeout=datetime.timedelta(seconds=300))
    ws: WorkerSpec = pickle.loads(store.get(SPEC_KEY))
    ws.address, ws.cores, ws.parent_pid = argv[0], None, None
    del store
    serve(ws)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""The draft worker in its own OS process, and the target's handle on it.

Start: torch.multiprocessing "spawn" (no state forked from the target). The child gets a picklable
recipe for its model (an alias/path to load, or a config + state dict for in-memory models), never a
live model; it sets its torch threads and, on CPU, pins itself to its own cores. It connects to the
rendezvous the target hosts (engine.ssd.transport) and serves until STOP or until the link breaks.
Closing always reaps the child: STOP, join, then terminate / kill if it does not leave.
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
import torch.multiprocessing as mp

from engine.config import SpeculativeConfig, WorkerFaults
from engine.ssd.messages import Round, Speculation, Stop
from engine.ssd.transport import DraftUnavailable, Endpoint, host_store, parse_init_method

log = logging.getLogger(__name__)
SPEC_KEY = "saguaro/worker_spec"
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


def serve(ws: WorkerSpec) -> None:
    """The worker process's main loop."""
    from engine.ssd.draft_worker import DraftWorker
    from engine.ssd.messages import MalformedMessage

    # Ctrl-C in a terminal reaches the whole process group: the target decides when the worker stops
    # (it sends STOP), so the worker neither dies mid-round nor prints its own traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(ws.threads)
    if ws.cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, ws.cores)
    device = torch.device(ws.device)
    endpoint = Endpoint.connect(ws.address, device, ws.connect_s)
    worker = DraftWorker(ws.recipe.build(device), ws.spec, ws.pad_id, device)
    faults = ws.faults or WorkerFaults()
    try:
        while True:
            msg = endpoint.recv(IDLE_S, expect_K=ws.spec.K)
            if isinstance(msg, Stop):
                return
            if isinstance(msg, Round):
                if msg.round == faults.exit_at_round:
                    os._exit(3)
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
        log.warning("draft worker stops: %s", err)
    finally:
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
        draft_device = placement.draft_device or ("cuda:1" if cuda else "cpu")
        comm_device = torch.device(draft_device) if cuda else torch.device("cpu")
        cores, self.target_threads = _cores(placement.draft_threads) if not cuda else (None, None)
        store, address = host_store(placement.init_method, placement.start_deadline_s)
        ws = WorkerSpec(recipe, spec, pad_id, address, draft_device, placement.draft_threads, cores,
                        placement.start_deadline_s, placement.faults)
        self.process = None
        if placement.external:
            store.set(SPEC_KEY, pickle.dumps(ws))  # the hand-started worker reads its settings here
            log.warning("waiting for a draft worker: run `python -m engine.ssd.process %s` on the draft host", address)
        else:
            self.process = mp.get_context("spawn").Process(target=serve, args=(ws,), name="saguaro-draft", daemon=True)
            self.process.start()
        self.endpoint: Endpoint | None = None
        self.exchanged = False
        self.address = address
        try:
            host, _ = parse_init_method(address)
            target_comm = torch.device("cuda", target_device.index or 0) if cuda else comm_device
            self.endpoint = Endpoint(store, 0, host, target_comm, placement.start_deadline_s)
        except RuntimeError as err:
            self.close()
            raise DraftUnavailable(f"the draft worker did not connect: {err}") from None

    def _exchange(self, msg, timeout_s: float) -> Speculation:
        if self.endpoint is None or (self.process is not None and not self.process.is_alive()):
            raise DraftUnavailable("the draft worker is not running")
        self.endpoint.send(msg, timeout_s)
        reply = self.endpoint.recv(timeout_s, expect_K=self.spec.K, expect_V=msg.V)
        if not isinstance(reply, Speculation):
            raise DraftUnavailable(f"the draft worker answered {type(reply).__name__}, not a speculation")
        return reply

    def exchange(self, msg: Round) -> Speculation:
        # The first answer waits for the worker to load its model; later ones only for a round.
        first, self.exchanged = not self.exchanged, True
        return self._exchange(msg, self.start_deadline_s if first else self.deadline_s)

    def close(self) -> None:
        """Stop the worker and reap it; safe to call twice and after a fault."""
        if self.endpoint is not None:
            if not self.endpoint.broken and (self.process is None or self.process.is_alive()):
                try:
                    self.endpoint.send(Stop(), 2.0)
                except DraftUnavailable:
                    pass
        if self.process is not None and self.process.pid is not None:
            self.process.join(JOIN_S if self.endpoint is not None and not self.endpoint.broken else 0.5)
            if self.process.is_alive():
                self.process.terminate()
                self.process.join(JOIN_S)
            if self.process.is_alive():
                self.process.kill()
                self.process.join()
        if self.endpoint is not None:
            self.endpoint.close()
            self.endpoint = None


def main(argv: list[str]) -> int:
    """Start a draft worker by hand (e.g. on another host): `python -m engine.ssd.process tcp://host:port`."""
    if len(argv) != 1:
        print("usage: python -m engine.ssd.process tcp://TARGET_HOST:PORT", file=sys.stderr)
        return 2
    import datetime

    import torch.distributed as dist

    host, port = parse_init_method(argv[0])
    store = dist.TCPStore(host, port, 2, False, timeout=datetime.timedelta(seconds=300))
    ws: WorkerSpec = pickle.loads(store.get(SPEC_KEY))
    ws.address, ws.cores = argv[0], None
    del store
    serve(ws)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

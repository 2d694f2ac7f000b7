"""The tensor-parallel target, rank 0's side: `start_target` starts the other ranks (spawn, as vLLM's
tensor_parallel_size does: no torchrun), loads rank 0's shard, and returns a `TPTarget`, which the decode loop
feeds like a model (engine.kv_cache.new_state makes its states).

Rank 0 is the engine's own process: it samples and verifies; the other ranks only follow. Every operation on a
target state goes to every rank (engine.tp.ops): a forward is sent first and then run here, so all ranks run it
together (its all-reduces need them all); roll-backs, selections, forks and joins are applied here first (an
invalid one raises here, before anything is sent). The ranks' KV caches hold their own heads of the same rows.

A rank that dies breaks the next collective; rank 0 then raises `TPRankDied`, one line naming the rank and why
it left, and closing stops and reaps every rank (they also die with rank 0: engine.ssd.lifetime).
"""

from __future__ import annotations

import datetime
import itertools
import logging
import os
import pickle
import shutil
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import Tensor

from engine import host
from engine.config import EngineConfig
from engine.kv_cache import KVState
from engine.loading.devices import TORCH_DTYPES
from engine.ssd.lifetime import explain_exit, refuse_unguarded_main, spawn_with_sigint_blocked
from engine.tp.ops import Concat, Envelope, Extend, Fork, NewState, Op, Rollback, Select, Stop, apply, on_cpu
from engine.tp.rank import JOINED_KEY, RankSpec, join_group, serve

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)
SEND = datetime.timedelta(minutes=10)  # rank 0's longest wait for the other ranks to take a message
POLL_S = 0.05
JOIN_S = 10.0


class TPRankDied(RuntimeError):
    """A tensor-parallel rank left (died, or lost its link): the run cannot go on."""

    one_line = True  # the CLI prints it as one line, without a traceback


class TPTarget:
    """Rank 0's handle on the target's ranks: its shard (`model`), the other ranks' processes, and the states."""

    def __init__(
        self,
        model: PreTrainedModel,
        device: torch.device,
        processes: list,
        ctrl: dist.ProcessGroup,
        store: dist.Store,
        folder: Path | None,
    ):
        self.model = model
        self.device = device
        self.processes = processes
        self.ctrl = ctrl
        self.store = store  # kept alive as long as the group
        self.states: dict[int, KVState] = {}
        self.freed: list[int] = []  # states dropped since the last message (their finalizers add them)
        self._ids = itertools.count()
        self.fault: str | None = None
        self.in_step = True  # False while a message or a forward is under way (a break leaves the ranks apart)
        self._reaper = weakref.finalize(self, _reap, processes, folder)

    # -- what the engine feeds ----------------------------------------------------------------
    def new_kv_state(self, batch_size: int, device: torch.device) -> TPState:
        sid = next(self._ids)
        self.run(NewState(sid, batch_size))
        return TPState(self, sid)

    def run(self, op: Op) -> Tensor | None:
        """Apply `op` on every rank; an Extend returns rank 0's logits."""
        if self.fault is not None:
            raise TPRankDied(self.fault)
        freed = self.freed[:]  # the list itself stays: the states' finalizers append to it
        del self.freed[: len(freed)]
        envelope = Envelope(on_cpu(op), freed)
        if isinstance(op, Extend):  # a forward: the other ranks must run it with us
            self._send(envelope)
            return self._guarded(lambda: apply(Envelope(op, freed), self.states, self.model, self.device))
        result = apply(Envelope(op, freed), self.states, self.model, self.device)  # raises here, before sending
        self._send(envelope)
        return result

    def _send(self, envelope: Envelope) -> None:
        data = torch.frombuffer(bytearray(pickle.dumps(envelope)), dtype=torch.uint8)

        def send() -> None:
            dist.broadcast(torch.tensor([data.numel()], dtype=torch.long), src=0, group=self.ctrl, async_op=True).wait(
                SEND
            )
            dist.broadcast(data, src=0, group=self.ctrl, async_op=True).wait(SEND)

        self._guarded(send)

    def _guarded(self, step):
        """Run `step` (a message or a forward); a rank that died meanwhile becomes TPRankDied."""
        self.in_step = False
        try:
            result = step()
        except RuntimeError:
            dead = self._dead_rank(wait_s=2.0)
            if dead is None:
                raise
            self.fault = dead
            raise TPRankDied(dead) from None
        self.in_step = True
        return result

    def _dead_rank(self, wait_s: float) -> str | None:
        """Why a rank left, if one did (waiting up to wait_s for a rank whose link broke to exit)."""
        deadline = time.monotonic() + wait_s
        while True:
            for rank, process in enumerate(self.processes, start=1):
                if not process.is_alive():
                    return (
                        f"tensor-parallel rank {rank} of {len(self.processes) + 1} (pid {process.pid}) left: "
                        f"{explain_exit(process.exitcode)}; the run cannot go on"
                    )
            if time.monotonic() > deadline:
                return None
            time.sleep(POLL_S)

    # -- lifetime -----------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the other ranks (Stop when in step, else terminate) and leave the process group."""
        if self.fault is None and self.in_step and all(p.is_alive() for p in self.processes):
            try:
                self._send(Envelope(Stop(), []))
            except (RuntimeError, TPRankDied):
                pass  # the reaper below ends them
        self.states.clear()
        self._reaper()


def _reap(processes: list, folder: Path | None) -> None:
    """Join the ranks (terminate, then kill, those that do not leave), leave the default group, remove the
    model folder written for them. Also runs when the target is dropped without close, and at exit."""
    for process in processes:
        if process.pid is None:
            continue
        process.join(JOIN_S if process.is_alive() else 0)
        if process.is_alive():
            process.terminate()
            process.join(JOIN_S)
        if process.is_alive():
            process.kill()
            process.join()
    if dist.is_initialized():
        dist.destroy_process_group()
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


class TPState:
    """A state of the tensor-parallel target: its id on every rank, and rank 0's own KVState under it."""

    def __init__(self, target: TPTarget, sid: int):
        self.target = target
        self.sid = sid
        self.model = target  # as KVState.model: what the state feeds
        weakref.finalize(self, target.freed.append, sid)

    @property
    def local(self) -> KVState:
        return self.target.states[self.sid]

    @property
    def lengths(self) -> Tensor:
        return self.local.lengths

    @property
    def batch_size(self) -> int:
        return self.local.batch_size

    def extend(
        self, tokens: Tensor, valid: Tensor | None = None, logits_to_keep: int = 0, fed: list[int] | None = None
    ) -> Tensor:
        return self.target.run(Extend(self.sid, tokens, valid, logits_to_keep))

    def rollback(self, drop: Tensor | list[int]) -> None:
        self.target.run(Rollback(self.sid, host.index(drop, self.lengths.device)))

    def select(self, rows: Tensor | list[int]) -> None:
        self.target.run(Select(self.sid, host.index(rows, self.lengths.device)))

    def fork(self, rows: Tensor | list[int]) -> TPState:
        new = next(self.target._ids)
        self.target.run(Fork(self.sid, new, host.index(rows, self.lengths.device)))
        return TPState(self.target, new)

    @staticmethod
    def concat(states: list[TPState]) -> TPState:
        target = states[0].target
        new = next(target._ids)
        target.run(Concat([s.sid for s in states], new))
        return TPState(target, new)


# -- starting the ranks ---------------------------------------------------------------------------
def _model_folder(target, config: EngineConfig) -> tuple[Path, Path | None, object]:
    """The transformers folder every rank loads, the temporary folder to remove at close (a model object is
    written to one), and the tokenizer (None for a model object)."""
    from transformers import AutoTokenizer, PreTrainedModel

    from engine.loading import model_cache
    from engine.loading.models import TOKENIZER_FILES, quiet_progress, resolve_folder

    if isinstance(target, PreTrainedModel):
        folder = Path(tempfile.mkdtemp(prefix="saguaro-tp-"))
        with quiet_progress(log.isEnabledFor(logging.DEBUG)):
            target.save_pretrained(folder)
        return folder, folder, None
    root = model_cache.resolve_cache_root(config.cache_dir, os.environ)
    folder, _ = resolve_folder(target, root)
    tokenizer = None
    if any((folder / f).is_file() for f in TOKENIZER_FILES):
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    return folder, None, tokenizer


def _rank_device(device: torch.device, rank: int) -> torch.device:
    return torch.device("cuda", rank) if device.type == "cuda" else device


def start_target(target, config: EngineConfig, device: torch.device) -> tuple[TPTarget, object]:
    """Start the target's `config.tp` ranks; returns rank 0's TPTarget and the tokenizer (None for a model
    object). ValueError for a device or a setting tensor parallelism cannot run on."""
    ranks = config.tp
    if dist.is_initialized():
        raise ValueError(
            "this process already runs a tensor-parallel target (torch.distributed's default group "
            "is taken): close that LLM first"
        )
    if device.type == "cuda":
        if device.index not in (None, 0) or torch.cuda.device_count() < ranks:
            raise ValueError(
                f"tp={ranks} puts rank r on cuda:r: use device 'cuda' on a machine with {ranks} "
                f"GPUs (it has {torch.cuda.device_count()})"
            )
    elif device.type != "cpu" or torch.cuda.is_available():
        raise ValueError(
            f"tensor parallelism runs on the CPU (gloo) or on CUDA GPUs (NCCL), on the machine's "
            f"accelerator: use device 'cuda' here, not {str(device)!r}"
        )
    refuse_unguarded_main()  # spawn re-runs an unguarded main script in every rank
    folder, temporary, tokenizer = _model_folder(target, config)
    from transformers import PreTrainedModel

    dtype = target.dtype if isinstance(target, PreTrainedModel) else TORCH_DTYPES[config.dtype]
    threads = config.threads or max(1, (os.cpu_count() or ranks) // ranks)
    store = dist.TCPStore(
        "127.0.0.1",
        0,
        ranks,
        True,
        timeout=datetime.timedelta(seconds=config.speculative.placement.start_deadline_s),
        wait_for_workers=False,
    )
    specs = [
        RankSpec(
            r,
            ranks,
            "127.0.0.1",
            store.port,
            str(_rank_device(device, r)),
            threads,
            str(folder),
            dtype,
            os.getpid(),
            threading.current_thread() is threading.main_thread(),
            config.speculative.placement.start_deadline_s,
        )
        for r in range(1, ranks)
    ]
    processes = [
        mp.get_context("spawn").Process(target=serve, args=(s,), name=f"saguaro-tp{s.rank}", daemon=True) for s in specs
    ]
    try:
        for process in processes:
            spawn_with_sigint_blocked(process.start)
        log.info(
            "starting %d tensor-parallel ranks of the target (pids %s) ...",
            ranks - 1,
            ", ".join(str(p.pid) for p in processes),
        )
        _await_joined(store, processes, config.speculative.placement.start_deadline_s)
        if device.type == "cuda":
            torch.cuda.set_device(0)
        ctrl = join_group(
            0,
            ranks,
            "127.0.0.1",
            store.port,
            _rank_device(device, 0),
            config.speculative.placement.start_deadline_s,
            store,
        )
        from engine.loading.models import quiet_progress
        from engine.tp.shard import load_shard

        with quiet_progress(log.isEnabledFor(logging.DEBUG)):
            model = load_shard(folder, ranks, dtype, speak=True)
    except BaseException as err:
        _reap(processes, temporary)
        if isinstance(err, RuntimeError):
            dead = next((p for p in processes if p.exitcode not in (None, 0)), None)
            if dead is not None:
                raise TPRankDied(
                    f"a tensor-parallel rank (pid {dead.pid}) left while the target loaded: "
                    f"{explain_exit(dead.exitcode)}"
                ) from None
        raise
    return TPTarget(model, _rank_device(device, 0), processes, ctrl, store, temporary), tokenizer


def _await_joined(store: dist.TCPStore, processes: list, deadline_s: float) -> None:
    """Wait for every rank to reach the store, noticing a rank that dies before it does."""
    deadline = time.monotonic() + deadline_s
    keys = [f"{JOINED_KEY}/{r}" for r in range(1, len(processes) + 1)]
    while not store.check(keys):
        for process in processes:
            if not process.is_alive():
                raise TPRankDied(
                    f"a tensor-parallel rank (pid {process.pid}) left while it started: "
                    f"{explain_exit(process.exitcode)}"
                )
        if time.monotonic() > deadline:
            raise TPRankDied(f"the tensor-parallel ranks did not start within {deadline_s:g} s")
        time.sleep(POLL_S)

"""A tensor-parallel rank other than 0: its own OS process (started with torch.multiprocessing "spawn" by
engine.tp.target), which loads its shard of the target and then does what rank 0 sends (engine.tp.ops), until
Stop or until rank 0 is gone.

It joins the rendezvous rank 0 hosts (a TCPStore), says so under JOINED_KEY (so that rank 0 sees a rank that
dies while it starts), joins the default process group the shards' collectives run on and a gloo group for rank
0's messages, watches its parent and ignores Ctrl-C (engine.ssd.lifetime: the same ties as SSD's worker).
"""

from __future__ import annotations

import datetime
import logging
import os
import pickle
from dataclasses import dataclass

import torch
import torch.distributed as dist

from engine.ssd.lifetime import die_with_parent, ignore_sigint, silence_stderr
from engine.tp.ops import Envelope, Stop, apply

log = logging.getLogger(__name__)
JOINED_KEY = "saguaro/tp_joined"  # + "/<rank>", set by each rank once it reached the store
IDLE = datetime.timedelta(days=7)  # a rank waits for rank 0's next message as long as rank 0 lives
COLLECTIVE = datetime.timedelta(minutes=10)  # the longest wait inside one forward (a dead rank ends it sooner)


@dataclass
class RankSpec:
    rank: int
    ranks: int
    host: str
    port: int
    device: str  # "cpu", or "cuda:<rank>"
    threads: int
    folder: str  # the model's transformers folder
    dtype: torch.dtype
    parent_pid: int
    death_signal: bool  # Linux parent-death signal (only when rank 0's main thread started it)
    start_s: float


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def join_group(
    rank: int, ranks: int, host: str, port: int, device: torch.device, start_s: float, store: dist.Store | None = None
) -> dist.ProcessGroup:
    """Join the default process group (the shards' collectives) and return the gloo group of rank 0's messages."""
    if store is None:
        store = dist.TCPStore(host, port, ranks, False, timeout=datetime.timedelta(seconds=start_s))
        store.set(f"{JOINED_KEY}/{rank}", str(os.getpid()))
    dist.init_process_group(
        backend_for(device),
        store=store,
        rank=rank,
        world_size=ranks,
        timeout=COLLECTIVE,
        device_id=device if device.type == "cuda" else None,
    )
    return dist.new_group(backend="gloo", timeout=IDLE)


def receive(ctrl: dist.ProcessGroup) -> Envelope:
    """The next message of rank 0 (a length, then the pickled envelope), waiting as long as rank 0 lives."""
    size = torch.zeros(1, dtype=torch.long)
    dist.broadcast(size, src=0, group=ctrl, async_op=True).wait(IDLE)
    data = torch.empty(int(size), dtype=torch.uint8)
    dist.broadcast(data, src=0, group=ctrl, async_op=True).wait(IDLE)
    return pickle.loads(data.numpy().tobytes())


def serve(spec: RankSpec) -> None:
    """A rank's main loop."""
    from transformers.utils import logging as hf_logging

    from engine.tp.shard import load_shard

    hf_logging.disable_progress_bar()  # rank 0 reports the loading
    die_with_parent(spec.parent_pid, spec.death_signal)
    ignore_sigint()  # Ctrl-C is rank 0's to handle; it stops the ranks with Stop
    torch.set_num_threads(spec.threads)
    device = torch.device(spec.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    os.environ["LOCAL_RANK"] = str(spec.rank)  # transformers binds a rank's accelerator by it
    ctrl = join_group(spec.rank, spec.ranks, spec.host, spec.port, device, spec.start_s)
    model = load_shard(spec.folder, spec.ranks, spec.dtype, speak=False)
    states: dict = {}
    try:
        while True:
            envelope = receive(ctrl)
            if isinstance(envelope.op, Stop):
                return
            apply(envelope, states, model, device)
    except RuntimeError as err:  # rank 0 or another rank is gone: rank 0 reports it, this rank leaves quietly
        log.info("tensor-parallel rank %d stops: %s", spec.rank, err)
    finally:
        silence_stderr()
        dist.destroy_process_group()

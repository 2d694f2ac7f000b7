"""Point-to-point messages between the target (rank 0) and the draft worker (rank 1).

A torch.distributed process group of two made directly from a TCPStore (no global default group,
so several engines can live in one process): gloo on CPU, NCCL when the messages live on a CUDA device.
The address is an init method `tcp://host:port`; the target hosts the store, port 0 picks a free port,
and the draft connects to the same address, so it can run on another host (see engine/ssd/README.md).
Every receive has a deadline; a timeout, a dead peer or a broken link raise DraftUnavailable.

A message (messages.encode's header and parts) crosses in at most two transfers, most in one: each gloo
transfer waits for the receiver to post it and the sender to answer, and a speculation used to take five
(issue 12). The first is a frame of FRAME_BYTES bytes: the header, then the leading parts that fit in it;
the second, only when some part did not fit, that part and every one after it, back to back. Each part
starts at a multiple of 8 bytes, so the receiver reads the parts as views of the bytes it got, with the layout
the header implies.
"""

from __future__ import annotations

import datetime
import errno
import math
import re
import socket
from urllib.parse import urlparse

import torch
import torch.distributed as dist
from torch import Tensor

from engine.ssd.messages import HEADER_LEN, MalformedMessage, Message, decode, encode, payload_shapes

TARGET_RANK, DRAFT_RANK = 0, 1
# The first transfer of every message. A round's outcomes, and a greedy or top-k 50 answer up to B * K = 40
# (S = 50: 600 bytes a position), fit whole: on loopback 32 KiB cost ~0.1 ms more than 64 bytes, a second
# transfer ~0.3 ms idle and several ms when the cores are busy (the receiver asks, the sender's gloo thread
# must wake to answer).
FRAME_BYTES = 32 * 1024
HEADER_BYTES = HEADER_LEN * 8  # int64
ALIGN = 8  # bytes: every part starts at a multiple of its element size

Layout = list[tuple[tuple[int, ...], torch.dtype]]


def _size(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    """Bytes a part takes on the wire, padded to ALIGN."""
    n = math.prod(shape) * dtype.itemsize
    return -(-n // ALIGN) * ALIGN


def _in_frame(layout: Layout) -> int:
    """How many leading parts fit in the frame after the header."""
    room, n = FRAME_BYTES - HEADER_BYTES, 0
    for shape, dtype in layout:
        room -= _size(shape, dtype)
        if room < 0:
            break
        n += 1
    return n


def _as_bytes(parts: list[Tensor]) -> list[Tensor]:
    """Each part as uint8 (a view where it is contiguous), then its zero padding to ALIGN."""
    out = []
    for part in parts:
        raw = part.contiguous().reshape(-1).view(torch.uint8)
        out.append(raw)
        if raw.numel() % ALIGN:
            out.append(torch.zeros(ALIGN - raw.numel() % ALIGN, dtype=torch.uint8))
    return out


def unpack(buf: Tensor, layout: Layout) -> list[Tensor]:
    """The parts of `layout` laid out back to back in buf (uint8), as views of it."""
    parts, at = [], 0
    for shape, dtype in layout:
        n = math.prod(shape) * dtype.itemsize
        parts.append(buf[at : at + n].view(dtype).reshape(shape))
        at += _size(shape, dtype)
    return parts


def to_wire(tensors: list[Tensor]) -> list[Tensor]:
    """encode's header and parts as the uint8 transfers to send: the frame, then the rest if any."""
    header, parts = tensors[0], tensors[1:]
    n = _in_frame([(tuple(p.shape), p.dtype) for p in parts])
    head = torch.cat(_as_bytes([header] + parts[:n]))
    frame = torch.zeros(FRAME_BYTES, dtype=torch.uint8)
    frame[: head.numel()] = head
    if n == len(parts):
        return [frame]
    rest = _as_bytes(parts[n:])
    return [frame, rest[0] if len(rest) == 1 else torch.cat(rest)]  # one part alone (a dense q) is not copied


def from_frame(frame: Tensor) -> tuple[list[Tensor], Layout]:
    """The header and the parts a frame holds, and the layout of the parts still to come (raises
    MalformedMessage where the header is not one)."""
    header = frame[:HEADER_BYTES].view(torch.long)
    layout = payload_shapes(header)
    n = _in_frame(layout)
    return [header] + unpack(frame[HEADER_BYTES:], layout[:n]), layout[n:]


def rest_bytes(layout: Layout) -> int:
    """The size of the second transfer, which carries the parts of `layout`."""
    return sum(_size(shape, dtype) for shape, dtype in layout)


class DraftUnavailable(RuntimeError):
    """The draft worker died, hung past its deadline, or the link to it broke."""


def _reason(err: Exception) -> str:
    """gloo's error in one short clause: no source path, no advice paragraph (the target's warning is one line)."""
    text = re.sub(r"^\[[^\]]*\]\s*", "", str(err).strip().splitlines()[0] if str(err).strip() else "")
    return re.split(r"(?<=[.!])\s", text, maxsplit=1)[0] or type(err).__name__


def parse_init_method(init_method: str) -> tuple[str, int]:
    url = urlparse(init_method)
    if url.scheme != "tcp" or not url.hostname or url.port is None:
        raise ValueError(f"init method must look like tcp://host:port (port 0 = pick a free one), got {init_method!r}")
    return url.hostname, url.port


def _port_taken(host: str, port: int) -> ValueError:
    return ValueError(f"port {port} of {init_address(host, port)} is taken (another engine or program listens "
                      f"there): choose another, e.g. --init-method {init_address(host, 0)} (port 0 = a free one)")


def init_address(host: str, port: int) -> str:
    return f"tcp://{host}:{port}"


def check_port_free(init_method: str) -> None:
    """ValueError if the target could not host the rendezvous at this fixed port (port 0 always can).
    The store listens on every interface, so the port is probed there, the way the store binds it."""
    host, port = parse_init_method(init_method)
    if port == 0:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the store: TIME_WAIT is no conflict
        try:
            probe.bind(("", port))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise _port_taken(host, port) from None
            if err.errno == errno.EACCES:
                raise ValueError(f"port {port} needs privileges this process lacks: choose a port above 1023, "
                                 f"or {init_address(host, 0)} for a free one") from None
            raise


def host_store(init_method: str, connect_s: float) -> tuple[dist.TCPStore, str]:
    """The target's side of the rendezvous: start the store; returns it and the address the draft joins."""
    host, port = parse_init_method(init_method)
    try:
        store = dist.TCPStore(host, port, 2, True, timeout=datetime.timedelta(seconds=connect_s),
                              wait_for_workers=False)
    except dist.DistNetworkError as err:
        if "EADDRINUSE" in str(err):  # taken since check_port_free, or by a socket it could not see
            raise _port_taken(host, port) from None
        raise
    return store, init_address(host, store.port)


class Endpoint:
    """One side of the link: send a message, receive one before a deadline."""

    def __init__(self, store: dist.Store, rank: int, host: str, device: torch.device, connect_s: float):
        self.rank = rank
        self.peer = DRAFT_RANK if rank == TARGET_RANK else TARGET_RANK
        self.device = device
        self.store = store  # keep the store alive as long as the group
        timeout = datetime.timedelta(seconds=connect_s)
        if device.type == "cuda":
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout  # a hung peer fails the wait, as on gloo, instead of NCCL's own default
            self.group = dist.ProcessGroupNCCL(store, rank, 2, opts)
        else:
            # The public constructor torch's own init_process_group/new_group use: `timeout` bounds joining the
            # group (the connect); each send and receive has its own deadline (Work.wait below). Gloo binds the
            # interface the host name resolves to (loopback when it resolves to none); GLOO_SOCKET_IFNAME picks
            # another, as for any torch.distributed job.
            self.group = dist.ProcessGroupGloo(store, rank, 2, timeout=timeout)
        self.broken = False

    @classmethod
    def connect(cls, init_method: str, device: torch.device, connect_s: float) -> "Endpoint":
        """The draft's side: connect to the target's store and join the group."""
        host, port = parse_init_method(init_method)
        store = dist.TCPStore(host, port, 2, False, timeout=datetime.timedelta(seconds=connect_s))
        return cls(store, DRAFT_RANK, host, device, connect_s)

    def send(self, msg: Message, timeout_s: float) -> None:
        try:
            for tensor in to_wire(encode(msg)):
                self.group.send([tensor.to(self.device)], self.peer, 0).wait(datetime.timedelta(seconds=timeout_s))
        except RuntimeError as err:
            self.broken = True
            raise DraftUnavailable(f"sending to the peer failed: {_reason(err)}") from None

    def _recv_one(self, shape: tuple[int, ...], dtype: torch.dtype, timeout_s: float) -> Tensor:
        buf = torch.empty(shape, dtype=dtype, device=self.device)
        try:
            self.group.recv([buf], self.peer, 0).wait(datetime.timedelta(seconds=timeout_s))
        except RuntimeError as err:
            self.broken = True
            raise DraftUnavailable(f"no message from the peer within {timeout_s:g} s or the link broke: "
                                   f"{_reason(err)}") from None
        return buf.cpu()

    def recv(self, timeout_s: float, expect_K: int | tuple[int, ...] | None = None, expect_V: int | None = None
             ) -> Message:
        frame = self._recv_one((FRAME_BYTES,), torch.uint8, timeout_s)
        try:
            tensors, rest = from_frame(frame)
        except MalformedMessage:
            self.broken = True  # the rest of the stream cannot be framed any more
            raise
        if rest:
            tensors += unpack(self._recv_one((rest_bytes(rest),), torch.uint8, timeout_s), rest)
        try:
            return decode(tensors, expect_K, expect_V)
        except MalformedMessage:
            self.broken = True
            raise

    def close(self) -> None:
        try:
            self.group.shutdown()
        except (RuntimeError, AttributeError):  # already torn down by a broken peer
            pass

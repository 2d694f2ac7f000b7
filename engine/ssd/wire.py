"""A message's bytes on the link: at most two transfers, most in one (engine.ssd.transport sends them).

Each gloo transfer waits for the receiver to post it and the sender to answer, so a message (messages.encode's
header and parts) crosses in as few as possible: sent as one transfer per part, a speculation took five. The
first transfer is a frame of FRAME_BYTES bytes: the header, then the leading parts that fit in it; the second,
only when some part did not fit, that part and every one after it, back to back. Each part starts at a multiple
of 8 bytes, so the receiver reads the parts as views of the bytes it got, with the layout the header implies.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from engine.ssd.messages import HEADER_LEN, payload_shapes

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

"""GGUF blocks as the int4 kernel's codes, and GGUF rows as bfloat16 (engine.loading.lowbit_cache builds from these).

Q4_0, Q4_1 and Q4_K map exactly onto the int4 kernel's grouped asymmetric form with group size 32 (the kernel
computes (q - 8) * scale + zero for q in 0..15): Q4_0 (d*(q-8)): scale = d, zero = 0; Q4_1 (d*q + m): scale = d,
zero = m + 8d; Q4_K (each super-block of 256 holds 8 groups of 32 with 6-bit sc and m: d*sc*q - dmin*m):
scale = d*sc, zero = 8*scale - dmin*m. Any other tensor is dequantised, a slab of rows at a time.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from engine.loading.weight_only import INT4_OFFSET

SLAB_BYTES = 1 << 23  # a large float tensor is dequantised this many bytes of GGUF rows at a time


def q4_layout(qtype: object) -> tuple[int, int, int]:
    """(bytes per block, runs of code bytes per block, bytes per run) of Q4_0 / Q4_1 / Q4_K.

    A run of r code bytes holds 2r codes: the low nibbles are one group's (values 0..r-1 of it), the
    high nibbles the next group's (Q4_K: 4 runs of 32, groups 2j and 2j+1) or the same group's second
    half (Q4_0/Q4_1: one run of 16 for a block of 32 values).
    """
    from gguf import GGMLQuantizationType as T

    if qtype is T.Q4_K:
        return 144, 4, 32  # 2 (d) + 2 (dmin) + 12 (scales) + 128 (codes) bytes per 256 values
    if qtype in (T.Q4_0, T.Q4_1):
        return (18 if qtype is T.Q4_0 else 20), 1, 16  # 2 (d) [+ 2 (m)] + 16 bytes of codes per 32 values
    raise ValueError(f"{qtype} has no exact int4 form")


def q4_scales(blocks: np.ndarray, qtype: object) -> tuple[np.ndarray, np.ndarray]:
    """(scale, zero) float32 [B, groups of 32 per block] of raw blocks uint8 [B, bytes per block]."""
    from gguf import GGMLQuantizationType as T
    from gguf.quants import Q4_K

    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)  # [B, 1]
    if qtype is T.Q4_K:  # d*sc*q - dmin*m per group of 32
        dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
        sc, m = Q4_K.get_scale_min(blocks[:, 4:16].copy())  # [B, 8] each, 6-bit
        scale = d * sc.astype(np.float32)  # [B, 8]
        return scale, INT4_OFFSET * scale - dmin * m.astype(np.float32)
    if qtype is T.Q4_0:  # d * (q - 8)
        return d, np.zeros_like(d)
    return d, blocks[:, 2:4].copy().view(np.float16).astype(np.float32) + INT4_OFFSET * d  # Q4_1: d * q + m


def q4_codes(data: np.ndarray, qtype: object) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact int4 group-32 form of Q4_0 / Q4_1 / Q4_K rows: (q uint8 [N, K] in 0..15, scale, zero [N, K/32] f32).

    `data` is the GGUF's raw rows, uint8 [N, bytes per row]; value = (q - 8) * scale + zero exactly
    (in float32 arithmetic on the stored float16 fields). The build uses q4_packed; this unpacked
    form is the reference the tests check it against.
    """
    size, runs, run = q4_layout(qtype)
    n = data.shape[0]
    blocks = data.reshape(-1, size)
    qs = blocks[:, size - runs * run :].reshape(-1, runs, 1, run)
    q = (qs >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)) & 0x0F  # [B, runs, low/high, run]
    scale, zero = q4_scales(blocks, qtype)
    return q.reshape(n, -1), scale.reshape(n, -1), zero.reshape(n, -1)


@functools.lru_cache(maxsize=1)
def repack_table() -> np.ndarray:
    """uint16 [65536]: for the GGUF byte pair (e, o) read as the little-endian e | o << 8, our byte pair
    (e & 15) | (o << 4) (the pair's low-nibble codes) | ((e >> 4) | (o & 0xF0)) << 8 (its high-nibble codes)."""
    pair = np.arange(1 << 16, dtype=np.uint32)
    even, odd = pair & 0xFF, pair >> 8
    low = (even & 0x0F) | ((odd << 4) & 0xF0)
    high = (even >> 4) | (odd & 0xF0)
    return (low | (high << 8)).astype(np.uint16)


def q4_packed(data: np.ndarray, qtype: object) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q4_codes with the codes packed as pack_nibbles packs them: (uint8 [N, K/2], scale, zero).

    Straight from the GGUF's bytes, with no [N, K] array of codes: a GGUF byte holds two codes a run
    apart, ours two neighbours. A run's byte pairs (e, o) go through repack_table to our pair for its
    low-nibble values and our pair for its high-nibble values, which are then put in value order.
    """
    size, runs, run = q4_layout(qtype)
    n = data.shape[0]
    blocks = data.reshape(-1, size)
    codes = np.ascontiguousarray(blocks[:, size - runs * run :]).view("<u2")  # [B, runs * run / 2] pairs
    ours = repack_table()[codes].view(np.uint8).reshape(-1, runs, run // 2, 2)  # [..., pair, low/high]
    packed = np.ascontiguousarray(ours.transpose(0, 1, 3, 2))  # [B, runs, low/high, pair]
    scale, zero = q4_scales(blocks, qtype)
    return packed.reshape(n, -1), scale.reshape(n, -1), zero.reshape(n, -1)


def pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """uint8 codes [N, K] (K even, values 0..15) -> [N, K/2], column 2i in the low nibble of byte i."""
    return (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous()


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of pack_nibbles: [N, K/2] uint8 -> [N, K] uint8 (numpy: ~2x faster than torch.stack here)."""
    a = packed.numpy()
    q = np.empty((a.shape[0], a.shape[1] * 2), dtype=np.uint8)
    np.bitwise_and(a, 0x0F, out=q[:, 0::2])
    np.right_shift(a, 4, out=q[:, 1::2])
    return torch.from_numpy(q)


def bfloat16_rows(data: np.ndarray, qtype: object) -> torch.Tensor:
    """GGUF rows ([N, row] as the reader maps them) dequantised into a bfloat16 [N, K], a slab at a time.

    The same values as dequantising the whole tensor to float32 and rounding that to bfloat16 (blocks
    never straddle rows), without the whole float32 tensor: Qwen2.5-1.5B's embedding table and head
    are 233M values each, 0.9 GB in float32. A slab is SLAB_BYTES of the GGUF's rows.
    """
    from gguf.quants import dequantize

    rows = data.shape[0]
    if rows == 0:
        return torch.from_numpy(np.asarray(dequantize(data, qtype), dtype=np.float32)).to(torch.bfloat16)
    step = max(1, SLAB_BYTES // max(1, data.nbytes // rows))
    out = None
    for start in range(0, rows, step):
        part = np.asarray(dequantize(data[start : start + step], qtype), dtype=np.float32)
        if out is None:
            out = torch.empty((rows, part.shape[1]), dtype=torch.bfloat16)
        out[start : start + step] = torch.from_numpy(part)
    return out

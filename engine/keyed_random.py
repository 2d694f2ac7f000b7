"""Keyed random numbers: each draw a pure function of (request seed, position, purpose, index).

A request's random numbers do not come from a stream that advances as the engine draws: the number the engine uses
for, say, the acceptance test at position 17 of the request seeded 42 is `f(42, 17, ACCEPT, 0)`, whatever was drawn
before it, whichever rows share the batch, and whether the round ran as AR, SD or SSD. A whole batch is one
vectorised call: `host_uniforms` on the host in numpy (what the engine uses: the seeds and positions are host
integers there, so nothing is read back from the device), `keyed_uniforms` and `keyed_gumbel` as torch calls on
the device their tensors live on, with the same values bit for bit.

Construction (SplitMix64, Steele, Lea and Flood, OOPSLA 2014, used as a counter-based hash). All arithmetic is on
unsigned 64-bit words modulo 2^64:

    GAMMA  = 0x9E3779B97F4A7C15                       # SplitMix64's increment (the golden ratio times 2^64)
    mix(z) = Stafford's "Mix13", SplitMix64's finaliser:
             z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
             z = (z ^ (z >> 27)) * 0x94D049BB133111EB
             z =  z ^ (z >> 31)                        # >> is a logical shift
    absorb(h, x) = mix(h + (x + 1) * GAMMA)           # output x of SplitMix64 started from state h (x = 0: first)

    bits(seed, position, purpose, index) =
        absorb(absorb(absorb(seed, 0), 16 * position + purpose), index)

So `absorb(seed, 0)` is the first output of SplitMix64 seeded with `seed`; the next stage takes word number
`16 * position + purpose` of the SplitMix64 stream that this word seeds (the purpose in the low 4 bits), and the
last stage word number `index` of the stream that one seeds. For fixed earlier fields each stage is a bijection of
its field (mix is invertible, GAMMA is odd), so two (position, purpose) pairs of one seed, or two indices of one
(seed, position, purpose), never give the same word. The first stage mixes the seed on its own, so no simple
relation between two seeds (seed + 1, say) carries over to the later stages.

From the 64-bit word `w = bits(...)`:
- `keyed_uniforms`, float32: `(w >> 40) * 2**-24`, one of 2^24 values in [0, 1 - 2^-24]; float64:
  `(w >> 11) * 2**-53`, in [0, 1 - 2^-53]. Exactly 0 occurs (probability 2^-24 or 2^-53 per draw): fine for an
  inverse-CDF draw and for the acceptance test `u * q < p`, not for a logarithm.
- `keyed_gumbel`, index = token id, purpose GUMBEL: `u = ((w >> 12) * 2 + 1) * 2**-53`, the midpoint of one of 2^52
  equal cells, so 2^-53 <= u <= 1 - 2^-53, then `G = -log(-log(u))` in float64 (so -3.61 <= G <= 36.74: always
  finite), rounded to the requested dtype. Computing in float64 keeps the upper tail, which decides an argmax over
  a vocabulary, resolved to 2^-52 in u; a 24-bit uniform would step G by about 0.01 near the maximum of 150k draws.

Device independence: the words and the uniforms are bit-identical on every device (integer arithmetic, exact
int-to-float conversions and power-of-two scalings). The Gumbel values go through float64 `log`, whose last bit may
differ between CPU and CUDA libraries (the CUDA test allows a relative 1e-14 in float64).

torch has no unsigned 64-bit arithmetic on every device (its CPU build has no uint64 shift), so the words live in
int64 tensors as two's complement: this relies on torch's int64 add and multiply wrapping modulo 2^64 on CPU and
CUDA, as they do in practice (the tests check it against Python integers on each device they run on); a logical
right shift is an arithmetic shift plus a mask; constants above 2^63 are passed as their negative int64 equivalents.

Cost: about 45 small tensor operations a call, so a small batch costs the operations' launch overhead, not their
size. The unchecked calls trace into one graph (torch.compile(fullgraph=True)), so a compiled caller can fuse them.

Key ranges (the engine's): 0 <= seed < 2^63, 0 <= position < 2^40, 0 <= index < 2^40. The hot functions check
dtypes, devices and shapes (no device work); `check=True` also checks the ranges, which reads one small tensor back
to the host, so a caller that guarantees them (an engine that validates a seed when a request arrives) passes
`check=False` and the call never waits for the device.
"""

from __future__ import annotations

import functools
import math
from enum import IntEnum

import numpy as np
import torch
from torch import Tensor

MASK64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15
MIX_MULTIPLIERS = (0xBF58476D1CE4E5B9, 0x94D049BB133111EB)
MIX_SHIFTS = (30, 27, 31)
SEED_LIMIT = 1 << 63  # seeds are 0 <= seed < SEED_LIMIT
POSITION_LIMIT = 1 << 40  # positions and indices are 0 <= x < POSITION_LIMIT
PURPOSE_SLOTS = 16  # the (position, purpose) counter is PURPOSE_SLOTS * position + purpose


class Purpose(IntEnum):
    """What a draw is for (1 to 15). The numbers are part of the reproducibility contract: never renumber."""

    DRAFT = 1  # the draft's proposal draw at a position
    ACCEPT = 2  # the acceptance test's uniform at a position
    TARGET = 3  # the target's own draw at a position: AR's token, the bonus or residual draw, the first token
    GUMBEL = 4  # per-token noise over the vocabulary at a position (index = token id), shared by draft and target


def _signed(word: int) -> int:
    """An unsigned 64-bit constant as the int64 with the same bits."""
    return word - (1 << 64) if word >= 1 << 63 else word


_GAMMA_I64 = _signed(GAMMA)
_MULTIPLIERS_I64 = tuple(_signed(m) for m in MIX_MULTIPLIERS)


def _mix_(z: Tensor) -> Tensor:
    """SplitMix64's finaliser, in place on an int64 tensor the caller owns."""
    shifted = torch.empty_like(z)
    for shift, multiplier in zip(MIX_SHIFTS, _MULTIPLIERS_I64 + (None,), strict=False):
        torch.bitwise_right_shift(z, shift, out=shifted)
        shifted.bitwise_and_((1 << (64 - shift)) - 1)  # arithmetic shift + mask = logical shift
        z.bitwise_xor_(shifted)
        if multiplier is not None:
            z.mul_(multiplier)  # wraps modulo 2^64
    return z


def _absorb(h: Tensor, x: Tensor | int) -> Tensor:
    """mix(h + (x + 1) * GAMMA): a new tensor of the broadcast shape."""
    if isinstance(x, int):
        step = _signed(((x + 1) * GAMMA) & MASK64)
    else:
        step = (x + 1).mul_(_GAMMA_I64)
    return _mix_(h + step)


def _check_int64(name: str, t: Tensor) -> None:
    if not isinstance(t, Tensor) or t.dtype != torch.int64:
        got = t.dtype if isinstance(t, Tensor) else type(t).__name__
        raise ValueError(
            f"{name} must be a torch.int64 tensor, got {got}: pass torch.as_tensor({name}, dtype=torch.int64)"
        )


def _check_keys_meta(seeds: Tensor, positions: Tensor, index: Tensor | int) -> None:
    """Checks dtypes, devices and shapes: metadata only, no device work."""
    _check_int64("seeds", seeds)
    _check_int64("positions", positions)
    if seeds.dim() != 1:
        raise ValueError(f"seeds must have shape [B], got {tuple(seeds.shape)}")
    if positions.dim() != 2 or positions.shape[0] not in (1, seeds.shape[0]):
        raise ValueError(
            f"positions must have shape [B, n] (or [1, n] / [B, 1]) with B = {seeds.shape[0]}, got "
            f"{tuple(positions.shape)}: pass positions[None, :] for positions shared by every row, "
            "positions[:, None] for one position per row"
        )
    if seeds.device != positions.device:
        raise ValueError(
            f"seeds and positions must be on one device, got {seeds.device} and {positions.device}: "
            "move them with .to(device)"
        )
    if isinstance(index, Tensor):
        _check_int64("index", index)
        rows = seeds.shape[0]
        cols = positions.shape[1]
        shapes = zip(index.shape[::-1], (cols, rows), strict=False)  # a 1-D index broadcasts
        if index.dim() > 2 or any(got not in (1, want) for got, want in shapes):
            raise ValueError(f"index must broadcast to [B, n] = [{rows}, {cols}], got {tuple(index.shape)}")
        if index.device != seeds.device:
            raise ValueError(f"index must be on the device of seeds ({seeds.device}), got {index.device}")
    elif not isinstance(index, int) or isinstance(index, bool):
        raise ValueError(f"index must be an int or a torch.int64 tensor, got {type(index).__name__}")


def check_keys(seeds: Tensor, positions: Tensor, index: Tensor | int = 0) -> None:
    """Raises ValueError unless 0 <= seeds < 2^63 and 0 <= positions, index < 2^40. One read back to the host."""
    _check_keys_meta(seeds, positions, index)
    if isinstance(index, int) and not 0 <= index < POSITION_LIMIT:
        raise ValueError(f"index must be in [0, 2^40), got {index}")
    parts = [seeds, positions] + ([index] if isinstance(index, Tensor) else [])
    negative = torch.stack([(t < 0).any() for t in parts]).any()
    too_large = torch.stack([(t >= POSITION_LIMIT).any() for t in parts[1:]]).any()
    bad_low, bad_high = torch.stack([negative, too_large]).tolist()  # the one read
    if bad_low:
        raise ValueError(
            "seeds, positions and index must be >= 0: seeds are in [0, 2^63) (take a negative or "
            "larger seed modulo 2^63), positions and indices count from 0"
        )
    if bad_high:
        raise ValueError(
            "positions and index must be < 2^40: a token position or token id never reaches that; "
            "check that no seed was passed as a position"
        )


def _purpose(purpose: Purpose | int) -> Purpose:
    try:
        return Purpose(purpose)
    except ValueError:
        raise ValueError(f"purpose must be a Purpose ({', '.join(p.name for p in Purpose)}), got {purpose!r}") from None


def _position_words(seeds: Tensor, positions: Tensor, purpose: Purpose) -> Tensor:
    """absorb(absorb(seed, 0), 16 * position + purpose): [B, n] (positions broadcast against seeds[:, None])."""
    counter = positions * PURPOSE_SLOTS + int(purpose)  # [B, n] or [1, n]
    return _absorb(_absorb(seeds, 0)[:, None], counter)  # [B, n]


def keyed_bits(
    seeds: Tensor, positions: Tensor, purpose: Purpose, index: Tensor | int = 0, *, check: bool = True
) -> Tensor:
    """The 64-bit words `bits(seed, position, purpose, index)` as int64 (two's complement), `[B] x [B, n] -> [B, n]`.

    `positions` is [B, n], or [1, n] / [B, 1] to broadcast; `index` an int or an int64 tensor broadcastable to
    [B, n]. Everything stays on the inputs' device; `check=True` checks the key ranges (one host read).
    """
    _check_keys_meta(seeds, positions, index)
    if check:
        check_keys(seeds, positions, index)
    return _absorb(_position_words(seeds, positions, _purpose(purpose)), index)  # [B, n]


def _check_dtype(dtype: torch.dtype) -> None:
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}")


def uniforms_from_bits(words: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Uniforms in [0, 1) from int64 words: the top 24 bits (float32) or 53 bits (float64). 0 can occur."""
    _check_dtype(dtype)
    bits = 24 if dtype == torch.float32 else 53
    top = torch.bitwise_right_shift(words, 64 - bits).bitwise_and_((1 << bits) - 1)
    return top.to(dtype).mul_(2.0**-bits)


def keyed_uniforms(
    seeds: Tensor,
    positions: Tensor,
    purpose: Purpose,
    dtype: torch.dtype = torch.float32,
    index: Tensor | int = 0,
    *,
    check: bool = True,
) -> Tensor:
    """Uniforms in [0, 1) keyed by (seed, position, purpose, index): `[B] x [B, n] -> [B, n]` of `dtype`.

    float32 carries 24 random bits, float64 53; exactly 0 can occur (probability 2^-24 or 2^-53), 1 never does.
    The value at a key does not depend on the batch, its shape or its order. `check=False` skips the range check
    (the call then never reads from the device).
    """
    _check_dtype(dtype)
    return uniforms_from_bits(keyed_bits(seeds, positions, purpose, index, check=check), dtype)


def gumbel_from_bits(words: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Standard Gumbel noise -log(-log u) from int64 words, u = the midpoint of one of 2^52 cells (never 0 or 1).

    Computed in float64, then rounded to `dtype`; always finite (-3.61 <= G <= 36.74).
    """
    return _gumbel_from_bits_(words.clone(), dtype)


def _gumbel_from_bits_(words: Tensor, dtype: torch.dtype) -> Tensor:
    """gumbel_from_bits, overwriting `words` (which the caller owns) to save its memory."""
    _check_dtype(dtype)
    k = words.bitwise_right_shift_(12).bitwise_and_((1 << 52) - 1)
    u = k.mul_(2).add_(1).to(torch.float64).mul_(2.0**-53)  # (2k + 1) / 2^53, exact
    del words, k
    return u.log_().neg_().log_().neg_().to(dtype)


def keyed_gumbel(
    seeds: Tensor, positions: Tensor, vocab: int, dtype: torch.dtype = torch.float32, *, check: bool = True
) -> Tensor:
    """Gumbel noise per (seed, position, token id), purpose GUMBEL: `[B] x [B, n] -> [B, n, V]` of `dtype`.

    A position's noise depends only on its seed, the position and the token id, never on n, B or the other rows,
    so a draft and a target that add it to their log-probabilities at the same position share it. Peak memory is
    about 16 bytes per element of [B, n, V] (the int64 words and one int64 or float64 buffer beside them).
    """
    if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab < 1:
        raise ValueError(f"vocab must be an int >= 1 (the vocabulary size), got {vocab!r}")
    if vocab > POSITION_LIMIT:
        raise ValueError(f"vocab must be <= 2^40 (token ids are indices < 2^40), got {vocab}")
    _check_dtype(dtype)
    _check_keys_meta(seeds, positions, 0)
    if check:
        check_keys(seeds, positions)
    at = _position_words(seeds, positions, Purpose.GUMBEL)  # [B, n]
    tokens = torch.arange(vocab, dtype=torch.int64, device=seeds.device)  # [V]
    return _gumbel_from_bits_(_absorb(at[..., None], tokens), dtype)  # [B, n, V]


@functools.lru_cache(maxsize=8)
def _token_steps(V: int, device: torch.device) -> Tensor:
    """(i + 1)·GAMMA mod 2^64 for every token i, as int64 [V]: the per-token half of the last absorb, kept."""
    return (torch.arange(V, dtype=torch.int64, device=device) + 1).mul_(_signed(GAMMA & MASK64))


def token_uniforms(seeds: Tensor, positions: Tensor, V: int, ids: Tensor | None = None) -> Tensor:
    """U(seed, position, i) in (0, 1), float64, from the words of purpose GUMBEL with index = the token id (the
    uniform behind `keyed_gumbel`'s noise): for every token [B, n, V] (ids None), or for the token ids `ids`
    [B, n, M]. seeds [B], positions [B, n], int64 on one device; no range check (the caller keeps them in range)."""
    at = _position_words(seeds, positions, Purpose.GUMBEL)[..., None]  # [B, n, 1]
    if ids is None:
        words = _mix_(at + _token_steps(V, seeds.device))  # [B, n, V]
    else:
        words = _absorb(at, ids)  # [B, n, M]
    k = words.bitwise_right_shift_(12).bitwise_and_((1 << 52) - 1)
    return k.mul_(2).add_(1).to(torch.float64).mul_(2.0**-53)  # (2k + 1) / 2^53: never 0 or 1


# The pure-Python reference: the same construction on Python integers modulo 2^64, for the tests and for anyone
# reimplementing it.


def reference_mix(z: int) -> int:
    """SplitMix64's finaliser on an unsigned 64-bit integer."""
    z &= MASK64
    for shift, multiplier in zip(MIX_SHIFTS, MIX_MULTIPLIERS + (1,), strict=False):
        z = ((z ^ (z >> shift)) * multiplier) & MASK64
    return z


def reference_absorb(h: int, x: int) -> int:
    return reference_mix(h + (x + 1) * GAMMA)


def reference_bits(seed: int, position: int, purpose: int, index: int = 0) -> int:
    """bits(seed, position, purpose, index) as an unsigned integer in [0, 2^64)."""
    return reference_absorb(reference_absorb(reference_absorb(seed, 0), PURPOSE_SLOTS * position + int(purpose)), index)


def reference_uniform(seed: int, position: int, purpose: int, index: int = 0, bits: int = 53) -> float:
    """The uniform keyed_uniforms returns: bits = 24 for float32 (exactly representable), 53 for float64."""
    if bits not in (24, 53):
        raise ValueError(f"bits must be 24 (float32) or 53 (float64), got {bits}")
    return (reference_bits(seed, position, purpose, index) >> (64 - bits)) * 2.0**-bits


def reference_gumbel(seed: int, position: int, token: int) -> float:
    """The float64 Gumbel value keyed_gumbel computes before rounding to its dtype (up to the last bit of log)."""
    u = ((reference_bits(seed, position, Purpose.GUMBEL, token) >> 12) * 2 + 1) * 2.0**-53
    return -math.log(-math.log(u))


# -- on the host ------------------------------------------------------------------------------------------------
# A round needs a few draws per row (the acceptance tests and the target's draws at the block's positions, the
# draft's draws at its positions): the same words computed with numpy's unsigned 64-bit arithmetic (which wraps
# modulo 2^64 by definition) cost microseconds, and reach the device with the round's other inputs in one copy.
_U64 = np.uint64


def _mix_host(z: np.ndarray) -> np.ndarray:
    z = z ^ (z >> _U64(MIX_SHIFTS[0]))
    z = z * _U64(MIX_MULTIPLIERS[0])
    z = z ^ (z >> _U64(MIX_SHIFTS[1]))
    z = z * _U64(MIX_MULTIPLIERS[1])
    return z ^ (z >> _U64(MIX_SHIFTS[2]))


def _absorb_host(h: np.ndarray, x: np.ndarray | int) -> np.ndarray:
    return _mix_host(h + (np.asarray(x, dtype=_U64) + _U64(1)) * _U64(GAMMA))


def host_bits(seeds: np.ndarray, positions: np.ndarray, purpose: Purpose, index: int = 0) -> np.ndarray:
    """`keyed_bits` on the host: seeds [B] and positions [B, n] (non-negative integers) -> uint64 words [B, n]."""
    purpose = _purpose(purpose)
    with np.errstate(over="ignore"):
        seed_words = _absorb_host(np.asarray(seeds, dtype=np.int64).astype(_U64), 0)[:, None]  # [B, 1]
        counter = np.asarray(positions, dtype=np.int64).astype(_U64) * _U64(PURPOSE_SLOTS) + _U64(int(purpose))
        return _absorb_host(_absorb_host(seed_words, counter), index)


def host_uniforms(seeds: np.ndarray, positions: np.ndarray, purpose: Purpose) -> np.ndarray:
    """`keyed_uniforms` in float64 on the host (53 bits, in [0, 1 - 2^-53]): [B] x [B, n] -> [B, n], the same
    values bit for bit."""
    return (host_bits(seeds, positions, purpose) >> _U64(11)).astype(np.float64) * 2.0**-53

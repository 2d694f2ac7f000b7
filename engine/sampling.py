"""The sampling core: warping logits into the distribution actually sampled, Saguaro sampling, one draw.

Pure functions of tensors plus an explicit `torch.Generator`: no engine state, no global RNG, so the
exactness tests can drive them directly. Notation follows docs/ssd.md: `p` target, `q` draft, `F` fan-out,
`C` the Saguaro down-weighting constant.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from engine import host
from engine.checks import Checks, check
from engine.keyed_random import Purpose, host_uniforms
from engine.ranking import descending_order, top_mask
from engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class Keys:
    """Where a batch's random numbers come from when they are keyed (engine.keyed_random): each row's request seed
    [B] and the position of the first token of the block being drafted or verified [B], on the host. The number
    behind a decision is U(seed, position, purpose): it does not depend on round boundaries, on which rows share the
    batch, or on what was drawn before, so a seed gives one text whatever the run's timing."""

    seeds: np.ndarray  # [B] int64
    positions: np.ndarray  # [B] int64

    @classmethod
    def of(cls, seeds: Sequence[int], positions: Sequence[int]) -> Keys:
        return cls(np.asarray(seeds, dtype=np.int64).reshape(-1), np.asarray(positions, dtype=np.int64).reshape(-1))

    def __len__(self) -> int:
        return len(self.seeds)

    def uniforms(self, purpose: Purpose, n: int, offset: int | np.ndarray = 0) -> np.ndarray:
        """U[0, 1) float64 [B, n] at positions positions[b] + offset + 0..n-1 (offset: an int or [B] per row)."""
        at = (self.positions + offset)[:, None] + np.arange(n)[None, :]  # [B, n]
        return host_uniforms(self.seeds, at, purpose)

    def rows(self, index: Sequence[int]) -> Keys:
        index = np.asarray(index, dtype=np.int64)
        return Keys(self.seeds[index], self.positions[index])

    def shifted(self, by: int | np.ndarray) -> Keys:
        """The same rows' keys `by` positions later (an int, or [B] per row)."""
        return Keys(self.seeds, self.positions + by)


# One generator for the whole tensor, or one per row (each request keeps its own random stream, so its
# draws do not depend on which other requests share the batch), or keyed random numbers (Keys).
Generators = torch.Generator | Sequence[torch.Generator] | Keys


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # Half-precision probabilities lose the small differences p − q that rejection sampling relies on.
    return torch.float64 if dtype == torch.float64 else torch.float32


def _check_last_dim(x: Tensor, name: str) -> None:
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(f"{name} must have shape [..., V] with V >= 1, got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got {x.dtype}")


def warp(logits: Tensor, params: SamplingParams, checks: Checks | None = None) -> Tensor:
    """The probability distribution actually sampled from, `[..., V] -> [..., V]`.

    Order (the same as transformers' default warper order in `GenerationMixin._get_logits_processor`,
    which appends TemperatureLogitsWarper, then TopKLogitsWarper, then TopPLogitsWarper):
      1. temperature: z = (logits − max) / T (the shift leaves softmax as it is and keeps a tiny T finite);
      2. top-k: keep the k largest z (ties at the boundary go to the lowest token id, so exactly k survive;
         transformers keeps every token tied with the k-th, which can be more than k);
      3. top-p on softmax of the survivors: keep the smallest prefix of the most probable tokens whose mass
         is >= top_p (a token is kept iff the mass strictly before it is < top_p; always >= 1 token;
         ties ordered by lowest id);
      4. renormalise.
    Temperature 0 is greedy: a one-hot on the argmax (ties -> lowest id); top-k / top-p never remove the
    argmax, so they do not change it. A tiny T > 0 (down to the smallest subnormal) gives the limit T -> 0+:
    uniform over the tied maxima, zero elsewhere. Computed in float32, or float64 when the logits are float64.

    The same function warps the target's p and the draft's q, so the verifier checks exactly the
    distributions that would have been sampled. `checks`: where the finite-maximum check goes (default: now).
    """
    _check_last_dim(logits, "logits")
    dtype = _compute_dtype(logits.dtype)
    z = logits.to(dtype)  # [..., V]
    _check_finite_max(z, "logits", checks)
    vocab_size = z.shape[-1]
    if params.greedy:
        return torch.zeros_like(z).scatter_(-1, z.argmax(dim=-1, keepdim=True), 1.0)  # [..., V] one-hot

    z = _over_temperature(z, params.temperature)
    top_k = params.top_k if params.top_k is not None and params.top_k < vocab_size else None
    top_p = params.top_p if params.top_p is not None and params.top_p < 1 else None
    if top_p is None:
        # No nucleus: no sort needed (on a CPU a sort of the whole vocabulary costs many times the rest of the warp).
        if top_k is not None:
            z = z.masked_fill(~top_mask(z, top_k), -torch.inf)
        return torch.softmax(z, dim=-1)  # [..., V]

    order = descending_order(z)  # [..., V]
    z_sorted = z.gather(-1, order)  # [..., V], most probable first
    if top_k is not None:
        # Mask by rank, not by value, so ties at the k-th value cannot let more than k through.
        z_sorted[..., top_k:] = -torch.inf
    probs_sorted = torch.softmax(z_sorted, dim=-1)  # [..., V]
    # Exclusive cumulative mass: the first token always has 0 < top_p before it, so it is always kept.
    mass_before = torch.cumsum(probs_sorted, dim=-1) - probs_sorted
    mass_before[..., 0] = 0
    probs_sorted = probs_sorted.masked_fill(mass_before >= top_p, 0)
    probs_sorted = probs_sorted / probs_sorted.sum(dim=-1, keepdim=True)
    return torch.zeros_like(probs_sorted).scatter(-1, order, probs_sorted)  # [..., V], back to token ids


def _check_finite_max(x: Tensor, name: str, checks: Checks | None = None) -> None:
    """Refuse rows with no finite maximum (all −inf, NaN, or +inf): they have no distribution to sample,
    and softmax would give NaN, which sampling would turn into the last token id without a word.
    A model or processor bug, not a user's mistake, hence RuntimeError."""
    if x.numel() == 0:
        return
    top = x.amax(dim=-1)  # [...]
    bad = ~torch.isfinite(top) | torch.isnan(x).any(dim=-1)  # [...]

    def error(bad: Tensor) -> RuntimeError:
        row = tuple(int(i) for i in bad.nonzero()[0].tolist())
        return RuntimeError(
            f"{name} row {row} has no finite maximum (all -inf, NaN or +inf): "
            f"nothing can be sampled from it; a model or logits-processor bug"
        )

    check(bad, error, checks)


def _over_temperature(z: Tensor, temperature: float) -> Tensor:
    """z / T with each row's maximum moved to 0 first, `[..., V] -> [..., V]`.

    softmax is unchanged by the shift, and it keeps a tiny T from overflowing: z / 1e-40 is ±inf in
    float32 and softmax of inf is NaN. After the shift the maxima are exactly 0 and stay 0 (0 / T is NaN
    in floating point once 1 / T overflows, or T rounds to 0 in the compute dtype, hence the fill), the
    other entries are < 0 and may go to -inf, so as T -> 0 the distribution goes to its limit: uniform over
    the tied maxima.
    """
    shifted = z - z.amax(dim=-1, keepdim=True)  # [..., V] <= 0, the maxima exactly 0
    return (shifted / temperature).masked_fill_(shifted == 0, 0.0)  # [..., V]


def saguaro(q: Tensor, n_top: int | Tensor, C: float) -> Tensor:
    """Saguaro sampling σ_{F,C} (Def. 14) applied to an already-warped draft distribution q, `[..., V]`.

    The weights of the `n_top` most probable tokens of q (ties -> lowest id) are multiplied by C and the
    whole row is renormalised, so for a in the top set and b outside it σ(a)/σ(b) = C·q(a)/q(b) exactly.
    (Not the same as keeping C·q on the top set and handing the freed mass (1 − C)·q(top) to the other
    tokens: that leaves the top tokens at exactly C·q, so their ratio to the others shrinks by more than C.)

    Project convention: n_top = F + 1, the F cached guesses plus the token usually drafted (the draft's
    own top token), as in the reference code. n_top may be an int or an integer tensor broadcast over the
    leading dims (fan-out varies by position). Zero-probability tokens stay zero; C = 1 returns q itself.
    The verifier must be given the returned σ as q: the tokens were drawn from it.
    """
    _check_last_dim(q, "q")
    if not 0 < C <= 1:
        raise ValueError(f"Saguaro constant C must be in (0, 1] (1 = plain sampling), got {C}")
    if isinstance(n_top, Tensor):
        if n_top.is_floating_point() or n_top.dtype == torch.bool:
            raise ValueError(f"n_top must be an int or an integer tensor, got {n_top.dtype}")
        if bool((n_top < 0).any()):
            raise ValueError("n_top must be >= 0 (n_top = F + 1)")
        n_top = n_top.to(q.device)[..., None]  # [..., 1], broadcast against [..., V]
    elif n_top < 0:
        raise ValueError(f"n_top must be >= 0 (n_top = F + 1), got {n_top}")
    if C == 1:
        return q

    dtype = _compute_dtype(q.dtype)
    q = q.to(dtype)
    in_top = top_mask(q, n_top)  # [..., V]
    weights = torch.where(in_top, q * C, q)  # [..., V]
    return weights / weights.sum(dim=-1, keepdim=True)


def row_generator(seed: int) -> torch.Generator:
    """A sequence's own random stream, on the host whatever device the models run on: a round's draws for
    every row are made there in a fixed order, row by row, and reach the device in one non-blocking copy
    (`uniforms`) instead of one tiny kernel launch per row; a run on a GPU draws the same numbers as on the CPU."""
    return torch.Generator(device="cpu").manual_seed(seed)


def uniforms(generator: Generators, rows: int, n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """U[0, 1) draws `[rows, n]` on `device`: from one generator in row-major order, or n from each row's own.
    Drawn on the generators' device (they must share one): a host stream's draws fill a (pinned) host buffer
    and cross to `device` in one copy (engine.host.upload)."""
    if isinstance(generator, Keys):
        raise TypeError("keyed random numbers are drawn by position and purpose: use Keys.uniforms")
    single = isinstance(generator, torch.Generator)
    gens = [generator] if single else list(generator)
    if not single and len(gens) != rows:
        raise ValueError(f"got {len(gens)} generators for {rows} rows: give one, or one per row")
    device = torch.device(device)
    if rows == 0 or n == 0:
        return torch.empty((rows, n), dtype=dtype, device=device)
    home = gens[0].device
    if any(g.device != home for g in gens):
        raise ValueError("the generators of one batch must live on one device (engine.sampling.row_generator)")
    if home.type != "cpu":  # streams on the device itself: one launch per row
        out = (
            torch.stack([torch.rand(n, generator=g, dtype=dtype, device=home) for g in gens])
            if not single
            else torch.rand((rows, n), generator=generator, dtype=dtype, device=home)
        )
        return out.to(device)
    buf = host.pinned_empty((rows, n), dtype, device)  # [rows, n]
    if single:
        torch.rand((rows, n), generator=generator, dtype=dtype, out=buf)
    else:
        for row, g in zip(buf, gens, strict=False):
            torch.rand(n, generator=g, dtype=dtype, out=row)
    return host.upload(buf, device)


class RowSampling:
    """Per-row warp settings of a batch: rows with equal (temperature, top-k, top-p) are warped together.

    Warping each group with `warp` itself keeps every row's distribution exactly what it would be alone;
    a batch usually holds few distinct settings, so this costs a few vectorised calls, not one per row.
    """

    def __init__(self, params: Sequence[SamplingParams]):
        self.params = list(params)
        groups: dict[tuple, list[int]] = {}
        for i, p in enumerate(self.params):
            groups.setdefault(p.warp_key, []).append(i)
        self.groups = [(self.params[rows[0]], torch.tensor(rows, dtype=torch.long)) for rows in groups.values()]

    def __len__(self) -> int:
        return len(self.params)

    def index(self, rows: Sequence[int] | Tensor) -> RowSampling:
        rows = rows.tolist() if isinstance(rows, Tensor) else rows
        return RowSampling([self.params[i] for i in rows])


def warp_rows(logits: Tensor, rows: RowSampling | SamplingParams, checks: Checks | None = None) -> Tensor:
    """`warp` with settings per row: logits `[B, ..., V]`, one setting per leading row."""
    if isinstance(rows, SamplingParams):
        return warp(logits, rows, checks)
    if logits.shape[0] != len(rows):
        raise ValueError(f"logits have {logits.shape[0]} rows but {len(rows)} sampling settings were given")
    if len(rows.groups) == 1:
        return warp(logits, rows.groups[0][0], checks)
    out = torch.empty(logits.shape, dtype=_compute_dtype(logits.dtype), device=logits.device)
    for params, index in rows.groups:
        index = host.upload(index, logits.device)
        out[index] = warp(logits.index_select(0, index), params, checks)
    return out


def sample(
    probs: Tensor, generator: Generators | None, checks: Checks | None = None, u: Tensor | None = None
) -> Tensor:
    """One draw per row of `probs` `[..., V]` -> LongTensor `[...]`, using only `generator`.

    Inverse-CDF sampling: one uniform u per row, and the token whose cumulative-mass interval holds
    u·total. The cumulative sum is taken in float64, so the interval of every token has its width
    to about 1e-16 (and over a large vocabulary on a CPU it is several times faster than torch.multinomial).
    `generator` is one generator, or one per row of the flattened leading dims. Rows need not be normalised,
    but a row with no positive finite mass raises RuntimeError instead of yielding the last id. A zero-probability token
    has an empty interval and is never drawn, so a one-hot row always yields its token (the draw still advances the
    generator, which keeps the random stream position independent of the values). `checks`: where the mass check goes
    (default: now).
    `u`: the uniforms to use instead of drawing from `generator`, float64 [N] (keyed random numbers).
    """
    _check_last_dim(probs, "probs")
    leading = probs.shape[:-1]
    flat = probs.reshape(-1, probs.shape[-1])  # [N, V]
    if flat.shape[0] == 0:
        return torch.empty(leading, dtype=torch.long, device=probs.device)
    cdf = torch.cumsum(flat.to(torch.float64), dim=-1)  # [N, V]
    total = cdf[:, -1]  # [N]
    bad = ~(torch.isfinite(total) & (total > 0)) | (flat < 0).any(dim=-1) | torch.isnan(flat).any(dim=-1)

    def error(bad: Tensor) -> RuntimeError:
        row = int(bad.nonzero()[0, 0])
        return RuntimeError(
            f"probs row {row} (flattened) has no positive finite mass (all zero, negative or "
            f"NaN): nothing can be sampled from it; a model or warp bug"
        )

    check(bad, error, checks)
    if u is None:
        u = uniforms(generator, flat.shape[0], 1, torch.float64, probs.device)  # [N, 1]
    else:
        u = u.to(probs.device, torch.float64).reshape(-1, 1)  # [N, 1]
    # right=True: the first index whose cumulative mass exceeds the target, skipping empty intervals.
    draws = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)  # [N, 1]
    return draws.clamp_(max=flat.shape[-1] - 1).reshape(leading)

"""Verification of one linear speculation by rejection sampling (docs/ssd.md §1).

`verify` is a pure function of tensors plus an explicit generator. It is exact for ANY proposal q (the
draft's own, Saguaro σ_{F,C}, uniform random tokens, a lookup's point mass) provided q is the distribution
the draft tokens were really drawn from. It never accepts by "equals the target argmax": at temperature 0
that rule falls out of the general one because p and q are one-hot.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from engine import host
from engine.checks import Checks, check
from engine.invariant import target_winners
from engine.keyed_random import Purpose
from engine.ranking import best
from engine.sampling import Generators, Keys, sample, uniforms
from engine.sparse import SparseQ


@dataclass(frozen=True)
class Verification:
    """Outcome v = (k, t*) of one round for each of B rows.

    accepted: LongTensor [B], k in 0..K, the number of leading draft tokens accepted.
    bonus:    LongTensor [B], t*, drawn from the residual at position k+1 (or from p_{K+1} if k = K).
    draft_tokens: LongTensor [B, K], the x verified (None when not given), so that `host` can bring the
              whole outcome to the host at once.
    """

    accepted: Tensor
    bonus: Tensor
    draft_tokens: Tensor | None = None

    def host(self, checks: Checks | None = None) -> tuple[list[int], list[int], list[list[int]]]:
        """k, t* and x of every row as lists, read from the device in one transfer (and kept: every reader of
        the outcome, the loop and the proposer, shares that one host synchronisation). `checks`: input checks
        read in the same transfer, whose first failure then raises."""
        kept = self.__dict__.get("_host")
        if kept is None:
            parts = [self.accepted[:, None], self.bonus[:, None]]  # [B, 1] each
            if self.draft_tokens is not None:
                parts.append(self.draft_tokens.to(self.accepted.device, torch.long))  # [B, K]
            flat = torch.cat(parts, 1).reshape(-1)  # [B·(2 + K)]
            flags = checks.flags() if checks is not None else None
            if flags is not None and flags.numel():
                flat = torch.cat([flat, flags.to(flat.device)])
            values = flat.tolist()  # the one read
            width = 2 + (0 if self.draft_tokens is None else self.draft_tokens.shape[1])
            B = self.accepted.shape[0]
            if checks is not None:
                checks.raise_from(values[B * width :])
            rows = [values[b * width : (b + 1) * width] for b in range(B)]
            kept = ([r[0] for r in rows], [r[1] for r in rows], [r[2:] for r in rows])
            object.__setattr__(self, "_host", kept)  # a cache, not a field: the dataclass stays frozen
        elif checks is not None:
            checks.raise_first()
        return kept

    def emitted(self, draft_tokens: Tensor | None = None) -> list[list[int]]:
        """The tokens each row emits this round: x_1..x_k, t* (x: `draft_tokens`, by default the ones verified)."""
        if draft_tokens is not None and (draft_tokens.dim() != 2 or draft_tokens.shape[0] != self.accepted.shape[0]):
            raise ValueError(
                f"draft_tokens must be [B, K] with B = {self.accepted.shape[0]}, got {tuple(draft_tokens.shape)}"
            )
        accepted, bonus, rows = self.host()
        if draft_tokens is not None and draft_tokens is not self.draft_tokens:
            rows = draft_tokens.tolist()
        return [row[:k] + [t] for row, k, t in zip(rows, accepted, bonus, strict=False)]


def _validate(draft_tokens: Tensor, q: Tensor, p: Tensor, checks: Checks | None) -> None:
    if draft_tokens.dim() != 2:
        raise ValueError(f"draft_tokens must be [B, K], got shape {tuple(draft_tokens.shape)}")
    if draft_tokens.is_floating_point() or draft_tokens.dtype == torch.bool:
        raise ValueError(f"draft_tokens must be an integer tensor, got {draft_tokens.dtype}")
    B, K = draft_tokens.shape
    if q.dim() != 3 or tuple(q.shape[:2]) != (B, K):
        raise ValueError(f"q must be [B, K, V] = [{B}, {K}, V], got {tuple(q.shape)}")
    if p.dim() != 3 or tuple(p.shape[:2]) != (B, K + 1):
        raise ValueError(f"p must be [B, K+1, V] = [{B}, {K + 1}, V], got {tuple(p.shape)}")
    V = p.shape[2]
    if V < 1 or q.shape[2] != V:
        raise ValueError(f"p and q must share a vocabulary size V >= 1, got {p.shape[2]} and {q.shape[2]}")
    if not (p.is_floating_point() and q.is_floating_point()):
        raise ValueError(f"p and q must be floating-point distributions, got {p.dtype} and {q.dtype}")
    if draft_tokens.numel():
        check(
            (draft_tokens < 0) | (draft_tokens >= V),
            lambda bad: ValueError(f"draft_tokens must lie in [0, {V})"),
            checks,
        )


def verify_greedy(draft_tokens: Tensor, logits: Tensor, checks: Checks | None = None) -> Verification:
    """`verify` for rows that all sample greedily, from the target's logits [B, K+1, V] (min_tokens applied).

    At temperature 0 p is one-hot at the argmax (ties to the lowest id), so whatever q the draft tokens came
    from (under which each has mass), u·q(x) < p(x) holds exactly when x is that argmax, and the residual
    max(0, p − q) and p itself put all their mass on it: x_i is accepted iff it is the argmax at position i, and
    t* is the argmax at position k+1. The same outcome as `verify`, without warping p or drawing anything.
    """
    B, K = draft_tokens.shape
    if logits.dim() != 3 or tuple(logits.shape[:2]) != (B, K + 1):
        raise ValueError(f"logits must be [B, K+1, V] = [{B}, {K + 1}, V], got {tuple(logits.shape)}")
    V = logits.shape[2]
    top, target = best(logits)  # [B, K+1]: NaN propagates, so a row with one fails the check below
    check(
        ~torch.isfinite(top),
        lambda bad: RuntimeError(
            f"logits row {tuple(int(i) for i in bad.nonzero()[0].tolist())} has no finite maximum (all -inf, NaN or "
            f"+inf): nothing can be sampled from it; a model or logits-processor bug"
        ),
        checks,
    )
    if K:
        check(
            (draft_tokens < 0) | (draft_tokens >= V),
            lambda bad: ValueError(f"draft_tokens must lie in [0, {V})"),
            checks,
        )
    if not K:  # nothing drafted (AR): t* is the argmax at position 1
        return Verification(accepted=torch.zeros_like(target[:, 0]), bonus=target[:, 0], draft_tokens=draft_tokens)
    accepted = (draft_tokens.to(target.device) == target[:, :K]).long().cumprod(dim=-1).sum(dim=-1)  # [B]
    bonus = target.gather(1, accepted[:, None])[:, 0]  # [B]
    return Verification(accepted=accepted, bonus=bonus, draft_tokens=draft_tokens)


def verify_invariant(draft_tokens: Tensor, p: Tensor, keys: Keys, checks: Checks | None = None) -> Verification:
    """Drafter-invariant verification (engine.invariant) of draft_tokens [B, K] against p [B, K+1, V], the rows'
    keys giving x_1's positions: the target's token at each position is its race's winner under p; x_i is accepted
    iff it is the winner at its position, and t* is the winner at position k+1. q plays no part: whatever the
    draft proposed, the emitted tokens are the target's winners."""
    B, K = draft_tokens.shape
    if p.dim() != 3 or tuple(p.shape[:2]) != (B, K + 1):
        raise ValueError(f"p must be [B, K+1, V] = [{B}, {K + 1}, V], got {tuple(p.shape)}")
    check(~(p.sum(-1) > 0), lambda bad: RuntimeError("p has a row without mass: nothing can be drawn from it"), checks)
    at = host.upload(torch.from_numpy(np.concatenate([keys.seeds[:, None], keys.positions[:, None]], 1)), p.device)
    positions = at[:, 1:] + torch.arange(K + 1, device=p.device)  # [B, K+1]
    winners = target_winners(p, at[:, 0], positions)  # [B, K+1]
    accepted = (draft_tokens.to(p.device) == winners[:, :K]).long().cumprod(dim=-1).sum(dim=-1)  # [B]
    bonus = winners.gather(1, accepted[:, None])[:, 0]
    return Verification(accepted=accepted, bonus=bonus, draft_tokens=draft_tokens)


def verify_rows(
    draft_tokens: Tensor,
    q: Tensor | SparseQ,
    p: Tensor,
    keys: Keys,
    invariant: list[bool],
    checks: Checks | None = None,
) -> Verification:
    """Each row verified in its own sampling mode: rejection sampling (`verify`), or drafter-invariant
    (`verify_invariant`) where invariant[b]. Rows never mix: each subset's outcome is its rows' own."""
    if not any(invariant):
        return verify(draft_tokens, q, p, keys, checks)
    if all(invariant):
        return verify_invariant(draft_tokens, p, keys, checks)
    parts = {}
    for mode in (False, True):
        rows = [b for b, inv in enumerate(invariant) if inv is mode]
        index = host.tensor(rows, torch.long, p.device)
        x, p_rows = draft_tokens[index.to(draft_tokens.device)], p[index]
        if mode:
            parts[mode] = (index, verify_invariant(x, p_rows, keys.rows(rows), checks))
        else:
            q_rows = q.rows(index.to(q.device)) if isinstance(q, SparseQ) else q[index.to(q.device)]
            parts[mode] = (index, verify(x, q_rows, p_rows, keys.rows(rows), checks))
    B = draft_tokens.shape[0]
    accepted = torch.empty(B, dtype=torch.long, device=p.device)
    bonus = torch.empty(B, dtype=torch.long, device=p.device)
    for index, result in parts.values():
        accepted[index] = result.accepted.to(p.device)
        bonus[index] = result.bonus.to(p.device)
    return Verification(accepted=accepted, bonus=bonus, draft_tokens=draft_tokens)


def verify(
    draft_tokens: Tensor, q: Tensor | SparseQ, p: Tensor, generator: Generators, checks: Checks | None = None
) -> Verification:
    """Standard rejection sampling of `draft_tokens` [B, K] drawn from `q` [B, K, V] against `p` [B, K+1, V].

    Accept x_i with probability min(1, p_i(x_i)/q_i(x_i)), tested as u_i·q_i(x_i) < p_i(x_i) with
    u_i ~ U[0, 1) (no division, and a token with p_i(x_i) = 0 is never accepted). k = number of leading
    accepted tokens. The bonus t* is drawn from the residual max(0, p_{k+1} − q_{k+1}) renormalised, or from
    p_{K+1} when k = K. If the residual is all zero (p_{k+1} ≤ q_{k+1} everywhere, i.e. p = q up to
    rounding), rejection had probability Σ max(0, q − p) = Σ max(0, p − q) = 0 in exact arithmetic, so
    any bonus rule is exact there; we draw from p_{k+1}.

    Random numbers are drawn in a fixed order, independent of the values: first u [B, K] (all of them,
    even past the first rejection), then one bonus draw per row; the same generator state therefore
    reproduces the same outcome. With one generator per row, each row draws its own K uniforms and then
    its bonus from its own stream, so a row's outcome does not depend on its batch-mates. With `Keys`
    (engine.sampling) each number is keyed by its row's seed and its token's position: the test of x_i uses
    U(seed, position of x_i, ACCEPT) and the bonus U(seed, position of t*, TARGET), whatever came before. p and q
    are used as given (they should be normalised distributions).

    `checks` (engine.checks.Checks): where the input checks go, to be read later together with others; the
    tokens are then clamped into the vocabulary for the gathers, so a bad one cannot index out of range on a
    device before its check is read. Default: every check at once.
    """
    if isinstance(q, SparseQ):
        q = q.dense()  # [B, K, V] (bit-exact: engine.sparse)
    _validate(draft_tokens, q, p, checks)
    dtype = torch.promote_types(torch.promote_types(p.dtype, q.dtype), torch.float32)
    p, q = p.to(dtype), q.to(dtype)
    B, K = draft_tokens.shape
    if not K and isinstance(generator, Keys):  # nothing drafted (AR): t* is drawn from p_1 with its keyed number
        u_target = host.upload(torch.from_numpy(generator.uniforms(Purpose.TARGET, 1)[:, 0]), p.device)  # [B]
        bonus = sample(p[:, 0], None, checks, u=u_target)
        return Verification(accepted=torch.zeros_like(bonus), bonus=bonus, draft_tokens=draft_tokens)
    x = draft_tokens.long().unsqueeze(-1)  # [B, K, 1]
    if checks is not None:
        x = x.clamp(0, p.shape[2] - 1)  # checked later (checks); meanwhile no index leaves the vocabulary

    p_x = p[:, :K].gather(-1, x).squeeze(-1)  # [B, K]
    q_x = q.gather(-1, x).squeeze(-1)  # [B, K]
    if isinstance(generator, Keys):  # keyed: the test at x_i's position, the target's draw at t*'s (one copy up)
        drawn = np.concatenate([generator.uniforms(Purpose.ACCEPT, K), generator.uniforms(Purpose.TARGET, K + 1)], 1)
        drawn = host.upload(torch.from_numpy(drawn), p.device)  # [B, 2K + 1] float64
        u, u_target = drawn[:, :K], drawn[:, K:]
        accept = u * q_x.double() < p_x.double()  # [B, K], in float64: u has 53 bits
    else:
        u = uniforms(generator, B, K, dtype, p.device)  # [B, K]
        accept = u * q_x < p_x  # [B, K]
    # Leading run of acceptances: the cumulative product turns to 0 at the first rejection.
    accepted = accept.long().cumprod(dim=-1).sum(dim=-1)  # [B]

    index = accepted.view(B, 1, 1).expand(B, 1, p.shape[2])  # [B, 1, V]
    p_next = p.gather(1, index).squeeze(1)  # [B, V], p_{k+1}
    if K > 0:
        q_next = q.gather(1, index.clamp(max=K - 1)).squeeze(1)  # [B, V], q_{k+1} (unused row when k = K)
        residual = (p_next - q_next).clamp(min=0)  # [B, V]
        rejected = (accepted < K).unsqueeze(-1)  # [B, 1]
        degenerate = residual.sum(dim=-1, keepdim=True) <= 0  # [B, 1]
        bonus_dist = torch.where(rejected & ~degenerate, residual, p_next)  # [B, V]
    else:
        bonus_dist = p_next
    # sample() normalises each row by its own total, so the residual needs no explicit division.
    if isinstance(generator, Keys):
        bonus = sample(bonus_dist, None, checks, u=u_target.gather(1, accepted[:, None])[:, 0])  # [B]
    else:
        bonus = sample(bonus_dist, generator, checks)  # [B]
    return Verification(accepted=accepted, bonus=bonus, draft_tokens=draft_tokens)

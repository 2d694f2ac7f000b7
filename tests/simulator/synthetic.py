"""Synthetic engine records with known timings, written from closed-form round times (not via SimPy).

An independent re-statement of the engine's round structure, so the fit and the validation can be
tested before the engine exists: the fit must recover TRUE's coefficients, and the simulator with the
fitted timings must predict these runs' tokens/s.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

TRUE = {
    "verify": (20.0, 0.5, 0.002),  # ms, ms per row (batch·tokens), ms per cached token read (batch·context)
    "draft": (4.0, 0.25, 0.0005),
    "prefill": (30.0, 0.1),
    "prefill_draft": (8.0, 0.04),
    "overhead": {"ar": 1.0, "sd": 1.5, "ssd": 2.0},
    "link_ms": 0.25,
    "random_ms": 0.3,
}


def _draft_step(rows: int, kv: int) -> float:
    d0, d_row, d_kv = TRUE["draft"]
    return d0 + d_row * rows + d_kv * kv


def _k(rng: np.random.Generator, alpha: float, K: int) -> int:
    k = 0
    while k < K and rng.random() < alpha:
        k += 1
    return k


def engine_run(
    strategy: str,
    K: int = 0,
    batch: int = 1,
    rounds: int = 200,
    *,
    alpha: float = 0.8,
    p_hit: float = 0.8,
    fanout: tuple[int, ...] | None = None,
    backup: str = "neural",
    prompt: int = 100,
    seed: int = 0,
    noise: float = 0.0,
    power_law: tuple[float, float] | None = None,
    engine_style: bool = False,
) -> list[dict]:
    """One generate() call: a prefill record, then `rounds` decode records of a full batch.

    SSD hits are Bernoulli(p_hit), or with `power_law = (r, scale)` Bernoulli(1 − scale·F_k^(−r)) for the
    fan-out F_k of the outcome k each sequence just had. `engine_style` writes SSD rounds as the engine
    does today: the wait in `draft_ms`, `backup` null when all hit, and the build that was looked up.
    """
    rng = np.random.default_rng(seed)
    jitter = (lambda: 1.0 + noise * rng.standard_normal()) if noise else (lambda: 1.0)
    v0, v_row, v_kv = TRUE["verify"]
    over, link = TRUE["overhead"][strategy], TRUE["link_ms"]
    p0, p_row = TRUE["prefill"]
    q0, q_row = TRUE["prefill_draft"]
    pre_draft = (q0 + q_row * batch * prompt) if strategy != "ar" else 0.0
    pre_verify = p0 + p_row * batch * prompt
    out = [
        dict(
            strategy=strategy,
            round=0,
            batch_size=batch,
            K=K,
            context_len=0,
            accepted=[0] * batch,
            emitted=[1] * batch,
            draft_ms=pre_draft,
            verify_ms=pre_verify,
            round_ms=pre_verify + pre_draft,
            draft_forwards=int(pre_draft > 0),
            phase="prefill",
            tokens=prompt,
        )
    ]
    contexts = [prompt + 1] * batch
    hit = [False] * batch
    accepted_before: list[int] = []  # a call's first round drafts from the prefill's one token a row
    build_prev, verify_prev = 0.0, 0.0
    branches = sum(fanout) * batch if fanout else 0
    for i in range(1, rounds + 1):
        context = max(contexts)
        verify = (v0 + v_row * batch * (K + 1) + v_kv * batch * context) * jitter()
        record = dict(
            strategy=strategy, round=i, batch_size=batch, K=K, context_len=context, draft_forwards=K, phase="decode"
        )
        if strategy == "ar":
            accepted, draft, wait = [0] * batch, 0.0, 0.0
        elif strategy == "sd":
            # The first step feeds x_K and the bonus (two wide) after a round where some row accepted all K.
            first = _draft_step(batch * (2 if K in accepted_before else 1), batch * context)
            draft = (first + (K - 1) * _draft_step(batch, batch * context)) * jitter()
            accepted = [_k(rng, alpha, K) for _ in range(batch)]
            wait = draft
        else:
            missed = hit.count(False)
            # The worker finishes the build it started with the last speculation (per-row miss policy), then
            # backs up the missed rows: the neural backup drafts the whole batch with the hit rows masked.
            wait = max(2 * link, build_prev - verify_prev)
            if missed:
                draft = K * _draft_step(batch, batch * context) if backup == "neural" else TRUE["random_ms"]
                draft *= jitter()
                wait += draft
            else:
                draft = 0.0
            accepted = [_k(rng, alpha if (h or backup == "neural") else 0.0, K) for h in hit]
            build = _draft_step(batch * (K + 1), batch * context) + K * _draft_step(branches, batch * context)
            build *= jitter()
            record.update(
                hit=list(hit), cache_build_ms=build, branches=branches, backup=backup, wait_ms=wait, fanout=list(fanout)
            )
            if engine_style:
                record.update(cache_build_ms=build_prev, backup=backup if missed else None)
                draft = wait
            build_prev, verify_prev = build, verify + over
            if power_law is None:
                hit = [bool(rng.random() < p_hit) for _ in range(batch)]
            else:
                r, scale = power_law
                hit = [
                    bool(rng.random() < 1 - min(1.0, scale * fanout[k] ** -r)) if fanout[k] else False for k in accepted
                ]
        record.update(
            accepted=accepted,
            emitted=[k + 1 for k in accepted],
            draft_ms=draft,
            verify_ms=verify,
            round_ms=wait + verify + over,
        )
        out.append(record)
        accepted_before = accepted
        contexts = [c + k + 1 for c, k in zip(contexts, accepted, strict=True)]
    return out


def write_jsonl(path: Path, *runs: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for run in runs for r in run), encoding="utf-8")
    return path

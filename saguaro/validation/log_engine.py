"""How the "reference-log" engine preset (simulator.presets.ENGINES) is derived from the reference's test log.

The log times its SSD draft's cycle ("avg draft step": serve the request, the glue forward, K tree-decode
steps, fill the cache) and its throughputs; from Llama-3.2-1B's batch-1 runs at K 6, F 3:

1. the draft's per-layer cost. SSD at batch 1 is bound by that cycle (23.30 ms against a verify of about
   19), so its 238 tok/s are 5.55 tokens a round, E(α) at K 6 for α = 0.921. SD's 172 tok/s at that α is
   a round of 32.24 ms: the AR step (the verify) and K + 1 draft forwards (the reference drafts one more to
   feed x_K), each the preset's roofline plus a per-layer cost: `draft_layer_overhead_us`;
2. the tree steps' host work and the per-branch cost: the simulated cycle (with α fitted to SD's 172 tok/s and
   the α-model's hits) against the published ones at batch 1 with the random backup (22.21 ms: no backup
   drafting) and at batch 16 (43.84 ms), least squares: `tree_step_overhead_ms`, `build_row_us`.

No other published figure enters; `saguaro validate paper` predicts the rest with these.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from scipy.optimize import brentq, least_squares

from saguaro.validation import paper
from saguaro.validation.published import Run
from simulator.presets import engine_preset
from theory import Backup, Strategy

K, F = 6, 3
SSD_TPS, SSD_CYCLE_MS, SD_TPS = 238.0, 23.30, 172.0  # the log's batch-1 SSD (with its cycle) and SD, Llama
CYCLES = {(1, Backup.RANDOM): 22.21, (16, Backup.NEURAL): 43.84}  # batch, backup -> published cycle (ms)


def tokens_per_round(alpha: float, K: int) -> float:
    return (1 - alpha ** (K + 1)) / (1 - alpha)


def draft_layer_overhead_us(pair: str = "llama") -> tuple[float, float]:
    """(per-layer cost of a draft forward in µs, the α the SSD run implies): step 1 of the module docstring."""
    alpha = brentq(lambda a: tokens_per_round(a, K) - SSD_TPS * SSD_CYCLE_MS / 1e3, 0.01, 0.999)
    timing = paper.timing(pair, "reference")
    context = paper.PROMPT_TOKENS + paper.OUTPUT_TOKENS // 2
    sd_round_ms = 1e3 * tokens_per_round(alpha, K) / SD_TPS
    step_ms = (sd_round_ms - timing.verify_ms(1, K + 1, context)) / (K + 1)
    draft = timing.draft
    bare_ms = replace(draft, hardware=replace(draft.hardware, single_device_layer_overhead_us=0.0)).forward_ms(
        1, context, context
    )
    return 1e3 * (step_ms - bare_ms) / draft.model.layers, alpha


def _cycles(layer_us: float, step_ms: float, row_us: float, rounds: int) -> list[float]:
    engine = replace(
        engine_preset("reference-log"),
        draft_layer_overhead_us=layer_us,
        tree_step_overhead_ms=step_ms,
        build_row_us=row_us,
    )
    setup = paper.Setup("llama", "reference-log", rounds, 0, costs=engine)
    alpha = paper.fit_alpha(setup, Run(Strategy.SD, K), SD_TPS)
    return [
        paper.draft_cycle_ms(paper.simulate_run(setup, Run(Strategy.SSD, K, F, batch, backup), alpha))
        for batch, backup in CYCLES
    ]


def calibrate(rounds: int = 3000) -> dict:
    """The "reference-log" preset's constants, derived as the module docstring says."""
    layer_us, alpha = draft_layer_overhead_us()
    published = np.array(list(CYCLES.values()))
    fit = least_squares(
        lambda p: np.array(_cycles(layer_us, p[0], p[1], rounds)) / published - 1,
        x0=[1.0, 5.0],
        bounds=([0.0, 0.0], [10.0, 50.0]),
        diff_step=0.05,
    )
    step_ms, row_us = (float(v) for v in fit.x)
    return {
        "draft_layer_overhead_us": layer_us,
        "alpha": alpha,
        "tree_step_overhead_ms": step_ms,
        "build_row_us": row_us,
        "cycles_ms": _cycles(layer_us, step_ms, row_us, rounds),
        "published_cycles_ms": published.tolist(),
    }

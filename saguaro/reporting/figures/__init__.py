"""Report figures: each is a function (Axes, ReportData) -> plotted rows, listed in FIGURES in report order."""

from saguaro.reporting.figures.acceptance import acceptance_histogram, hit_rate_by_k, miss_vs_fanout
from saguaro.reporting.figures.base import Figure, NoData, Rendered, ReportData, markdown_section, render
from saguaro.reporting.figures.sweeps import (
    speedup_vs_batch,
    speedup_vs_budget,
    speedup_vs_c,
    speedup_vs_k,
    speedup_vs_temperature,
)
from saguaro.reporting.figures.timing import (
    breakdown_size,
    compare_size,
    latency_throughput,
    measured_vs_predicted,
    phase_breakdown,
)

FIGURES: tuple[Figure, ...] = (
    Figure("speedup_vs_k", "Speedup over AR against the lookahead K.", speedup_vs_k),
    Figure(
        "speedup_vs_budget",
        "SSD speedup against the fan-out budget B, uniform vs geometric (Thm 12) schedule.",
        speedup_vs_budget,
    ),
    Figure(
        "speedup_vs_c",
        "Speedup against Saguaro's C at temperature > 0; hit rate and α on the right axis.",
        speedup_vs_c,
    ),
    Figure("speedup_vs_temperature", "Speedup against the sampling temperature.", speedup_vs_temperature),
    Figure(
        "speedup_vs_batch",
        "Speedup over AR at the same batch size; where a fast backup overtakes the neural one.",
        speedup_vs_batch,
    ),
    Figure(
        "measured_vs_predicted",
        "Decode speedup: measured, simulated (timing fitted on the run's rounds) and "
        "closed form (theory, with the run's α, hit rate and times).",
        measured_vs_predicted,
        compare_size,
    ),
    Figure("hit_rate_by_k", "SSD cache hit rate by verification outcome k.", hit_rate_by_k),
    Figure(
        "acceptance_histogram",
        "Accepted draft tokens per round, with the i.i.d. prediction at the measured α.",
        acceptance_histogram,
    ),
    Figure(
        "miss_vs_fanout",
        "Cache miss rate against fan-out on log-log axes, with the fitted power law (Def. 11).",
        miss_vs_fanout,
    ),
    Figure("phase_breakdown", "Critical-path time per generated token by phase.", phase_breakdown, breakdown_size),
    Figure(
        "latency_throughput", "Per-sequence latency against batch throughput across batch sizes.", latency_throughput
    ),
)

__all__ = ["FIGURES", "Figure", "NoData", "Rendered", "ReportData", "markdown_section", "render"]

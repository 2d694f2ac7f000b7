"""One definition of serving latency, used by the engine, the bench client, the simulator and the planner.

The quantities and their names are those of vLLM's serving benchmark, so figures compare across projects:

- TTFT  time to first token: from the request's arrival (sent / submitted) to its first streamed token.
- ITL   inter-token latency: the gap between successive streamed *chunks*. A speculative round emits
        several tokens in one chunk; that is one gap, not one gap per token (so ITL is never a run of
        zeros), and ITL samples are pooled over all requests.
- TPOT  time per output token after the first: (e2e − TTFT) / (output tokens − 1); undefined for a
        request of one token (left out of the statistics).
- E2EL  end-to-end latency: from arrival to the last token.

Summaries are in milliseconds: `mean_ttft_ms`, `median_ttft_ms`, `std_ttft_ms`, `p99_ttft_ms`, and the
same for `tpot`, `itl` and `e2el`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

METRICS = ("ttft", "tpot", "itl", "e2el")
DEFAULT_PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class RequestLatency:
    """Latency of one request, in seconds (TPOT None for a one-token output)."""

    ttft_s: float
    tpot_s: float | None
    itl_s: tuple[float, ...]
    e2el_s: float
    output_tokens: int


def request_latency(arrival_s: float, chunk_times_s: Sequence[float], chunk_tokens: Sequence[int]) -> RequestLatency:
    """Latency of one request from its arrival time and the time and size of each streamed chunk.

    chunk_times_s must be non-decreasing and not before arrival_s; chunk_tokens[i] >= 1 tokens arrived
    at chunk_times_s[i].
    """
    if len(chunk_times_s) != len(chunk_tokens):
        raise ValueError(f"got {len(chunk_times_s)} chunk times for {len(chunk_tokens)} chunk sizes")
    if not chunk_times_s:
        raise ValueError("a request with no streamed chunk has no latency: it produced no token")
    if any(n < 1 for n in chunk_tokens):
        raise ValueError("every streamed chunk carries at least one token")
    times = np.asarray(chunk_times_s, dtype=float)
    if times[0] < arrival_s or np.any(np.diff(times) < 0):
        raise ValueError("chunk times must be non-decreasing and not before the arrival")
    tokens = int(sum(chunk_tokens))
    ttft = float(times[0] - arrival_s)
    e2el = float(times[-1] - arrival_s)
    return RequestLatency(
        ttft, time_per_output_token(ttft, e2el, tokens), tuple(float(g) for g in np.diff(times)), e2el, tokens
    )


def time_per_output_token(ttft: float, e2el: float, output_tokens: int) -> float | None:
    """TPOT = (E2EL − TTFT) / (output tokens − 1), in the unit of its inputs; None for a one-token output."""
    if output_tokens < 1:
        raise ValueError(f"a finished request has at least one output token; got {output_tokens}")
    return (e2el - ttft) / (output_tokens - 1) if output_tokens > 1 else None


def statistics(samples: npt.ArrayLike, percentiles: Sequence[float] = DEFAULT_PERCENTILES) -> dict[str, float]:
    """`mean`, `median`, `std` and `p<N>` of one metric's samples (numpy's linear percentiles), in their unit;
    all NaN when there is no sample."""
    values = np.asarray(samples, dtype=float)
    names = ["mean", "median", "std", *(f"p{p:g}" for p in percentiles)]
    if values.size == 0:
        return dict.fromkeys(names, float("nan"))
    out = {"mean": float(values.mean()), "median": float(np.median(values)), "std": float(values.std())}
    out.update({f"p{p:g}": float(np.percentile(values, p)) for p in percentiles})
    return out


def summarize(
    latencies: Sequence[RequestLatency], percentiles: Sequence[float] = DEFAULT_PERCENTILES
) -> dict[str, float]:
    """mean / median / std / p-th percentiles of TTFT, TPOT, ITL and E2EL over requests, in ms.

    A metric with no sample (no request, or only one-token requests for TPOT, or no second chunk for ITL)
    is reported as NaN, never as 0: a zero latency would read as a real measurement.
    """
    samples = {
        "ttft": [r.ttft_s for r in latencies],
        "tpot": [r.tpot_s for r in latencies if r.tpot_s is not None],
        "itl": [g for r in latencies for g in r.itl_s],
        "e2el": [r.e2el_s for r in latencies],
    }
    out: dict[str, float] = {}
    for name in METRICS:
        ms = np.asarray(samples[name], dtype=float) * 1e3
        out.update({f"{stat}_{name}_ms": v for stat, v in statistics(ms, percentiles).items()})
    return out

"""Per-request latency read back from run folders, in theory.latency's terms, old run folders included.

Result lines written since the serving rewrite (the engine, the bench client) carry `ttft_s`, `tpot_s`
(None for a one-token output), `e2el_s` and `itl_s` (the gaps between streamed chunks). Older lines carry
`ttft_s`, `e2e_s` and `mean_itl_s`, which was TPOT ((e2e − ttft) / (tokens − 1)); their chunk gaps were not
kept, so they have no ITL sample. transformers' peers have no TTFT (their output is not streamed).
"""

from __future__ import annotations

import math

from theory.latency import METRICS, statistics

STATS = ("mean", "p50", "p90", "p99")


def e2el_s(result: dict) -> float | None:
    """Arrival (or the start of the call) to the last token."""
    return result["e2el_s"] if "e2el_s" in result else result.get("e2e_s")


def tpot_s(result: dict) -> float | None:
    """(E2EL − TTFT) / (tokens − 1); None for a one-token output (old lines wrote 0 there)."""
    if "tpot_s" in result:
        return result["tpot_s"]
    if result.get("new_tokens", 0) < 2:
        return None
    return result.get("mean_itl_s")


def itl_s(result: dict) -> list[float]:
    """Gaps between the request's streamed chunks (empty for old lines, which did not keep them)."""
    return list(result.get("itl_s") or [])


def samples_s(results: list[dict]) -> dict[str, list[float]]:
    """Every sample of each metric over these results, in seconds (ITL pooled over requests)."""
    ok = [r for r in results if not r.get("error")]
    return {
        "ttft": [r["ttft_s"] for r in ok if r.get("ttft_s") is not None],
        "tpot": [t for t in map(tpot_s, ok) if t is not None],
        "itl": [g for r in ok for g in itl_s(r)],
        "e2el": [t for t in map(e2el_s, ok) if t is not None],
    }


def latency_columns(results: list[dict], stats: tuple[str, ...] = STATS) -> dict[str, float | None]:
    """`mean_ttft_ms`, `p99_itl_ms`, ... over the requests (theory.latency's names and statistics); None
    where a metric has no sample (tables print it as '-', JSON as null)."""
    out: dict[str, float | None] = {}
    for name, values in samples_s(results).items():
        computed = statistics([v * 1e3 for v in values])
        for stat in stats:
            value = computed[stat]
            out[f"{stat}_{name}_ms"] = None if math.isnan(value) else value
    return {k: out[k] for k in (f"{s}_{m}_ms" for m in METRICS for s in stats)}

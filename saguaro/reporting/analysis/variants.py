"""One row per (run, variant): throughput, latency, acceptance, hits and speedups over AR and transformers.

Throughput is Σ new tokens / Σ wall time of the variant's generate calls (each batch call once);
latency is per request, in theory.latency's terms (saguaro.reporting.analysis.latency reads old run folders too).
Speedups compare with AR (and with transformers' `generate`) at the same temperature and batch size, from the same run
when it has one, else from another run on the same models, dtypes and machine. Per prompt, `prompt_speedups` pairs each
prompt's tokens/s (new tokens over its E2EL) with the reference's on the same prompt: the spread behind the ratio of
totals. `disturbed` counts the variant's requests a run marked as disturbed (saguaro.bench.runfolder),
`disturbed_reasons` says why.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from statistics import median

from saguaro.reporting.analysis import rounds as R
from saguaro.reporting.analysis.latency import e2el_s, latency_columns
from saguaro.reporting.analysis.load import Run

SETTINGS = ("temperature", "batch", "K", "C", "budget", "schedule", "fanout", "backup")


def _hist(results: list[dict]) -> Counter:
    hist: Counter = Counter()
    for r in results:
        hist.update({int(k): v for k, v in (r.get("accepted_hist") or {}).items()})
    return hist


def variant_row(run: Run, key: str, results: list[dict]) -> dict:
    ok = [r for r in results if not r.get("error")]
    first = results[0]
    settings = first["settings"]
    calls = run.rounds_of(key)
    walls = {r["batch_index"]: r["wall_s"] for r in ok}
    tokens, wall = sum(r["new_tokens"] for r in ok), sum(walls.values())
    hist = _hist(ok)
    K = settings.get("K")
    seq_rounds = sum(hist.values())
    reasons = [why for why in map(run.disturbed, results) if why]
    row = {
        "run": run.name,
        "system": first["system"],
        "key": key,
        **{s: settings.get(s) for s in SETTINGS},
        "prompts": len(ok),
        "errors": len(results) - len(ok),
        "new_tokens": tokens,
        "wall_s": wall,
        "faults": sum(1 for r in ok if r.get("engine_fault")),
        "threads": Counter(r.get("torch_threads") for r in ok).most_common(1)[0][0] if ok else None,
        "tokens_per_s": tokens / wall if wall > 0 else None,
        "request_tokens_per_s_median": median([r["new_tokens"] / e2el_s(r) for r in ok if e2el_s(r)])
        if any(e2el_s(r) for r in ok)
        else None,
        **latency_columns(ok),
        "ms_per_token": wall / tokens * 1e3 * settings["batch"] if tokens else None,
        "decode_tokens_per_s": R.decode_tokens_per_s(calls),
        "rounds": seq_rounds or None,
        "alpha": R.alpha_rounds(calls) if calls else R.alpha_mle(hist, K),
        "mean_accepted": sum(k * n for k, n in hist.items()) / seq_rounds if seq_rounds else None,
        "tokens_per_round": (sum(r["new_tokens"] for r in ok) - len(ok)) / seq_rounds if seq_rounds else None,
        "hit_rate": R.hit_rate(calls),
        "alpha_hit": R.alpha_rounds(calls, hit=True),
        "alpha_miss": R.alpha_rounds(calls, hit=False),
        "accepted_hist": {k: hist[k] for k in sorted(hist)},
        "disturbed": len(reasons),
        "disturbed_reasons": list(dict.fromkeys(reasons)),
        "prompt_tokens_per_s": {r["prompt_id"]: r["new_tokens"] / e2el_s(r) for r in ok if e2el_s(r)},
    }
    return row


def variant_rows(runs: list[Run]) -> list[dict]:
    """Rows in run order, then in the order variants first appear in each run's results."""
    rows = []
    for run in runs:
        groups: dict[str, list[dict]] = defaultdict(list)
        for r in run.results:
            groups[r["key"]].append(r)
        rows.extend(variant_row(run, key, rs) for key, rs in groups.items())
    _add_speedups(rows, runs)
    return rows


def _setup(run: Run) -> tuple:
    c, m = run.config, run.environment.get("machine", {})
    return (c.get("target"), c.get("dtype"), c.get("max_new_tokens"), m.get("cpu_model"), m.get("torch_threads"))


def _add_speedups(rows: list[dict], runs: list[Run]) -> None:
    setup = {run.name: _setup(run) for run in runs}
    for base, field in (("ar", "vs_ar"), ("hf", "vs_hf")):
        by_run: dict[tuple, dict] = {}
        by_setup: dict[tuple, dict] = {}
        for r in rows:
            if r["system"] == base and r["tokens_per_s"]:
                point = (r["temperature"], r["batch"])
                by_run.setdefault((r["run"], *point), r)
                by_setup.setdefault((setup[r["run"]], *point), r)
        for r in rows:
            point = (r["temperature"], r["batch"])
            ref = by_run.get((r["run"], *point)) or by_setup.get((setup[r["run"]], *point))
            ok = ref is not None and r["tokens_per_s"]
            r[f"speedup_{field}"] = r["tokens_per_s"] / ref["tokens_per_s"] if ok else None
            if base == "ar":
                mine, theirs = r["prompt_tokens_per_s"], (ref or {}).get("prompt_tokens_per_s", {})
                r["prompt_speedups"] = [mine[p] / theirs[p] for p in mine if theirs.get(p)] if ok else []
            if base == "ar":
                dec = r["decode_tokens_per_s"]
                ok = ref is not None and dec and ref["decode_tokens_per_s"]
                r["decode_speedup_vs_ar"] = dec / ref["decode_tokens_per_s"] if ok else None
                r["ar_key"] = ref["key"] if ref is not None else None
                r["ar_run"] = ref["run"] if ref is not None else None


def category_rows(runs: list[Run]) -> list[dict]:
    """α and tokens per round by prompt task for each speculative variant."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for run in runs:
        for r in run.results:
            if not r.get("error") and r.get("accepted_hist"):
                groups[(run.name, r["key"], r.get("task") or r.get("category"))].append(r)
    rows = []
    for (run, key, task), rs in groups.items():
        hist = _hist(rs)
        n = sum(hist.values())
        rows.append(
            {
                "run": run,
                "key": key,
                "task": task,
                "prompts": len(rs),
                "rounds": n,
                # per-prompt results keep k counts but not each round's K: no α for an adaptive-K variant here
                "alpha": R.alpha_mle(hist, K) if isinstance(K := rs[0]["settings"].get("K"), int) else None,
                "tokens_per_round": (sum(r["new_tokens"] for r in rs) - len(rs)) / n if n else None,
                "tokens_per_s": sum(r["new_tokens"] for r in rs) / sum(e2el_s(r) or 0.0 for r in rs)
                if sum(e2el_s(r) or 0.0 for r in rs) > 0
                else None,
            }
        )
    return rows


def error_rows(runs: list[Run]) -> list[dict]:
    """Failed prompts, and prompts an engine served in a degraded mode (SSD after its worker failed)."""
    return [
        {
            "run": run.name,
            "key": r["key"],
            "prompt_id": r["prompt_id"],
            "error": r.get("error") or f"engine fault, ran without its draft worker: {r['engine_fault']}",
        }
        for run in runs
        for r in run.results
        if r.get("error") or r.get("engine_fault")
    ]


def category_pivot(rows: list[dict]) -> tuple[list[dict], list[str]]:
    """category_rows as one row per variant and one column per task: 'α / tokens per round'."""
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    table: dict[tuple[str, str], dict] = {}
    for r in rows:
        cell = "-" if r["alpha"] is None else f"{r['alpha']:.2f} / {r['tokens_per_round']:.2f}"
        table.setdefault((r["run"], r["key"]), {"run": r["run"], "key": r["key"]})[r["task"]] = cell
    return list(table.values()), tasks

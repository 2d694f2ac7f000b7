"""guidellm (an external load generator, run from a side virtual environment) beside `saguaro bench --url`: the
same requests under the same load, and both clients' figures side by side.

    python -m saguaro.bench.guidellm data RUN_DIR --max-new-tokens N --out data.jsonl
        guidellm's dataset from the prompts a `saguaro bench --url` run sent (its prompts.jsonl, in order):
        {"prompt": text, "output_tokens_count": N} per line; guidellm then asks max_completion_tokens N with
        ignore_eos, as `saguaro bench --ignore-eos --max-new-tokens N` does.
    python -m saguaro.bench.guidellm compare --saguaro RUN_DIR... --guidellm REPORT.json... --out TABLE.md
        one row per (client, load point).

Both clients' figures are computed here from their per-request records with theory.latency's definitions, from
the time each request was sent: TTFT to the first token, E2EL to the last, TPOT = (E2EL - TTFT) / (tokens - 1),
throughput = output tokens / (last answer - first send). Where they differ, and why:
- ITL: `saguaro bench` records every streamed chunk, so its ITL is the gap between chunks (vLLM's). guidellm
  records only the first and the last token's times per request; what guidellm itself calls ITL is the mean gap
  per token after the first, which is TPOT, and is shown as `guidellm_itl_ms` (its own median) beside TPOT.
- Tokens: `saguaro bench` counts the server's token_ids per chunk; guidellm prefers the server's usage
  (prefer_response_metrics) and counts with its local tokenizer otherwise.
- Send time: guidellm's request_start is taken inside its worker processes, saguaro bench's just before the POST
  in one event loop; at high concurrency their scheduling differs by a few milliseconds.
No torch is imported.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from saguaro.bench.runfolder import RunDir
from saguaro.formatting import format_table
from theory.latency import statistics, time_per_output_token

COLUMNS = [
    "client",
    "point",
    "completed",
    "failed",
    "requests_per_s",
    "output_tokens_per_s",
    "p50_ttft_ms",
    "p99_ttft_ms",
    "p50_tpot_ms",
    "p99_tpot_ms",
    "p50_itl_ms",
    "p99_itl_ms",
    "guidellm_itl_ms",
]


def write_data(run_dir: str | Path, max_new_tokens: int, out: str | Path) -> int:
    """guidellm's JSONL of the prompts a saguaro bench run sent (text prompts only); returns the line count."""
    prompts = RunDir(Path(run_dir)).prompts()
    if not prompts:
        raise ValueError(f"{run_dir} has no prompts.jsonl: give a `saguaro bench --url` run folder")
    if any(p.text is None for p in prompts):
        raise ValueError("guidellm sends text prompts: use a prompt set of text (spec_bench, humaneval)")
    lines = [json.dumps({"prompt": p.text, "output_tokens_count": max_new_tokens}, ensure_ascii=False) for p in prompts]
    Path(out).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(lines)


def _row(
    client: str,
    point: str,
    ttft_s: list[float],
    tpot_s: list[float],
    itl_s: list[float],
    tokens: int,
    completed: int,
    failed: int,
    span_s: float,
) -> dict:
    ms = {
        name: statistics([1e3 * v for v in values])
        for name, values in (("ttft", ttft_s), ("tpot", tpot_s), ("itl", itl_s))
    }
    row = {
        "client": client,
        "point": point,
        "completed": completed,
        "failed": failed,
        "requests_per_s": completed / span_s if span_s > 0 else None,
        "output_tokens_per_s": tokens / span_s if span_s > 0 else None,
    }
    for name, stats in ms.items():
        for p in ("p50", "p99"):
            value = stats[p]
            row[f"{p}_{name}_ms"] = None if value != value else value  # NaN: no sample
    return row


def saguaro_rows(run_dir: str | Path) -> list[dict]:
    """One row per load point of a `saguaro bench --url` run, from its requests.jsonl."""
    lines = [json.loads(line) for line in (Path(run_dir) / "requests.jsonl").read_text().splitlines() if line]
    rows = []
    for point in dict.fromkeys(line["point"] for line in lines):
        mine = [r for r in lines if r["point"] == point]
        ok = [r for r in mine if r.get("error") is None]
        span = max((r["done_s"] for r in mine), default=0.0) - min((r["sent_s"] for r in mine), default=0.0)
        rows.append(
            _row(
                "saguaro bench",
                point,
                [r["ttft_s"] for r in ok],
                [r["tpot_s"] for r in ok if r["tpot_s"] is not None],
                [g for r in ok for g in r["itl_s"]],
                sum(r["new_tokens"] for r in ok),
                len(ok),
                len(mine) - len(ok),
                span,
            )
        )
    return rows


def _point_name(strategy: dict) -> str:
    kind = strategy.get("type_")
    if kind == "concurrent":
        return f"concurrency={strategy.get('streams')}"
    if kind in ("poisson", "constant"):
        return f"rate={strategy.get('rate'):g} ({kind})"
    return str(kind)


def guidellm_rows(report: str | Path) -> list[dict]:
    """One row per benchmark of a guidellm report (its --output kind=json file), from its per-request timings."""
    data = json.loads(Path(report).read_text())
    rows = []
    for bench in data["benchmarks"]:
        requests = bench["requests"]
        ok = requests.get("successful") or []
        failed = len(requests.get("errored") or []) + len(requests.get("incomplete") or [])
        ttft, tpot, tokens, starts, ends = [], [], 0, [], []
        for r in ok:
            t = r["info"]["timings"]
            n = (r.get("output_metrics") or {}).get("text_tokens") or 0
            first, last, start = t["first_token_iteration"], t["last_token_iteration"], t["request_start"]
            if first is None or last is None or n < 1:
                continue
            ttft.append(first - start)
            per_token = time_per_output_token(first - start, last - start, n)
            if per_token is not None:
                tpot.append(per_token)
            tokens += n
            starts.append(start)
            ends.append(t["request_end"])
        for r in (requests.get("errored") or []) + (requests.get("incomplete") or []):
            starts.append(r["info"]["timings"].get("request_start") or min(starts, default=0.0))
        span = max(ends, default=0.0) - min(starts, default=0.0)
        row = _row(
            "guidellm", _point_name(bench["config"]["strategy"]), ttft, tpot, [], tokens, len(ttft), failed, span
        )
        reported = bench["metrics"].get("inter_token_latency_ms", {}).get("successful", {})
        row["guidellm_itl_ms"] = reported.get("median")
        rows.append(row)
    return rows


def compare(saguaro_runs: list[str | Path], guidellm_reports: list[str | Path]) -> str:
    rows = [row for run in saguaro_runs for row in saguaro_rows(run)]
    rows += [row for report in guidellm_reports for row in guidellm_rows(report)]
    return format_table(rows, COLUMNS, markdown=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m saguaro.bench.guidellm",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="action", required=True)
    data = sub.add_parser("data", help="guidellm's dataset from a saguaro bench run's prompts")
    data.add_argument("run", type=Path)
    data.add_argument("--max-new-tokens", type=int, required=True)
    data.add_argument("--out", type=Path, required=True)
    both = sub.add_parser("compare", help="both clients' figures, one row per (client, load point)")
    both.add_argument("--saguaro", type=Path, nargs="+", required=True, help="saguaro bench --url run folders")
    both.add_argument("--guidellm", type=Path, nargs="+", required=True, help="guidellm JSON reports")
    both.add_argument("--out", type=Path, help="write the table here too")
    args = parser.parse_args(argv)
    try:
        if args.action == "data":
            print(f"{write_data(args.run, args.max_new_tokens, args.out)} prompts -> {args.out}")
            return 0
        table = compare(args.saguaro, args.guidellm)
    except (ValueError, FileNotFoundError, KeyError) as err:
        print(f"python -m saguaro.bench.guidellm: error: {err}", file=sys.stderr)
        return 2
    if args.out is not None:
        args.out.write_text(table)
    print(table, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

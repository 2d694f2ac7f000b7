"""`saguaro report`: a Markdown report with PNG figures (and the data behind each as CSV) from bench run folders.

Figures: speedup vs K, fan-out budget (uniform vs geometric), C (T > 0; hit rate and α on a second axis),
temperature and batch size (with the neural/fast backup crossover); measured vs simulated vs closed-form
speedup with relative errors; cache hit rate by position k; the accepted-length histogram; miss rate vs
fan-out (log-log) with the fitted power law; per-phase time breakdown; latency/throughput frontier.
A figure whose sweep is not in the runs is listed as not drawn, with the flags that would supply it.
Client runs (`saguaro bench --url`) get their own section: TTFT, TPOT and ITL (p50 and p99) and output
throughput against the request rate or concurrency, one line per run's --label (e.g. ar, sd, ssd).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path


def add_parser(sub) -> argparse.ArgumentParser:
    from saguaro.cli import HelpFormatter

    p = sub.add_parser(
        "report",
        help="Markdown report with figures from bench run folders",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    p.add_argument(
        "runs",
        nargs="+",
        metavar="RUN_DIR",
        help="run folders written by `saguaro bench` (engine or --url client runs)",
    )
    p.add_argument("--out", help="folder for report.md, the PNGs and CSVs (default: RUN_DIR/report of the first)")
    return p


def run(args) -> int:
    from saguaro.reporting.report import build_report

    out = Path(args.out) if args.out else Path(args.runs[0]) / "report"
    argv = [*args.runs, *(["--out", args.out] if args.out else [])]
    command = "saguaro report " + " ".join(shlex.quote(a) for a in argv)
    path = build_report(args.runs, out, command=command)
    print(path)
    print(f"wrote {path} with its figures and data in {path.parent}", file=sys.stderr)
    return 0

"""`saguaro bench`: this engine's AR, SD and SSD next to transformers' `generate` and assisted generation.

Every axis flag takes several values and the command runs the whole grid (axes a system does not have
are skipped for it): --K, --budget x --schedule (SSD fan-out), --C (temperature > 0 only), --backup,
--temperature, --batch-size. Results go to a new run folder, runs/<timestamp>-<name>/ (see --out);
`--resume RUN_DIR` continues an interrupted run with its saved configuration, skipping what is done.
Then `saguaro report RUN_DIR ...` turns run folders into a Markdown report with figures.
"""

from __future__ import annotations

import argparse
import sys

from reports.bench.config import BACKUPS, DTYPES, SCHEDULES, SYSTEMS
from reports.tables import format_table

COLUMNS = ["key", "prompts", "errors", "tokens_per_s", "speedup_vs_ar", "speedup_vs_hf", "p50_ttft_ms", "mean_tpot_ms",
           "p99_itl_ms", "alpha", "tokens_per_round", "hit_rate"]


def _fanout(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(f) for f in text.replace("-", ",").split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"a fan-out is F_0,...,F_K as integers (e.g. 4,3,2,2,1); got {text!r}") from None


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("bench", help="benchmark strategies and peers side by side on real prompts (sweeps)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("what to run")
    g.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS,
                   help="default: all of them (a system the engine cannot run is reported as unavailable)")
    g.add_argument("--prompts", default="spec_bench",
                   help="spec_bench (default), humaneval, or a JSONL file: one {'prompt': text} or "
                        "{'ids': [token ids]} a line")
    g.add_argument("-n", "--num-prompts", type=int, default=20,
                   help="prompts, round-robin across tasks unless --first (default 20)")
    g.add_argument("--first", action="store_true",
                   help="take the first n prompts in the set's file order instead (Spec-Bench's first 20 are MT-Bench)")
    g.add_argument("--categories", nargs="+", default=[], help="keep these categories or tasks (e.g. mt_bench qa)")
    g.add_argument("--max-new-tokens", type=int, default=128, help="tokens per request (default 128)")
    g.add_argument("--ignore-eos", action="store_true", help="always generate --max-new-tokens tokens")
    g = p.add_argument_group("sweep axes (several values each: the grid is run)")
    g.add_argument("-K", "--K", "--lookahead", type=int, nargs="+", default=[4], dest="Ks",
                   help="draft tokens per round (default 4)")
    g.add_argument("--budget", type=int, nargs="+", default=[12], help="SSD fan-out budget B = Σ F_k (default 12)")
    g.add_argument("--schedule", nargs="+", default=["uniform"], choices=SCHEDULES,
                   help="SSD fan-out schedule for each budget: uniform, or geometric (Thm 12 optimum)")
    g.add_argument("--fanout", type=_fanout, help="an explicit SSD schedule F_0,...,F_K instead (one K)")
    g.add_argument("--fanout-alpha", type=float, default=0.8, help="α for the geometric schedule (default 0.8)")
    g.add_argument("--fanout-r", type=float, default=1.0, help="power-law r for the geometric schedule (default 1)")
    g.add_argument("--C", type=float, nargs="+", default=[1.0], help="Saguaro constant(s) in (0, 1] (default 1)")
    g.add_argument("--backup", nargs="+", default=["neural"], choices=BACKUPS, help="SSD backup(s) (default neural)")
    g.add_argument("--temperature", type=float, nargs="+", default=[0.0], help="default 0 (greedy)")
    g.add_argument("--batch-size", type=int, nargs="+", default=[1], help="prompts per generate call (default 1)")
    g = p.add_argument_group("models and machine (the same for every system)")
    g.add_argument("--target", default="qwen-coder-1.5b")
    g.add_argument("--draft", default="qwen-coder-0.5b")
    g.add_argument("--dtype", default="bfloat16", choices=DTYPES)
    g.add_argument("--draft-dtype", choices=DTYPES, help="default: --dtype (float32 with --draft-int8)")
    g.add_argument("--draft-int8", action="store_true", help="int8 dynamic quantisation of the draft's Linear layers")
    g.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    g.add_argument("--seed", type=int, default=0, help="seed of call i is seed + i (default 0)")
    g.add_argument("--warmup", type=int, default=1, help="excluded warm-up calls per variant (default 1)")
    g.add_argument("--order", choices=["interleaved", "grouped"], default="interleaved",
                   help="interleaved (default): batch by batch across variants, against machine drift; grouped: "
                        "variant by variant, one engine (and SSD worker process) alive at a time, for big sweeps")
    g = p.add_argument_group("run folder")
    g.add_argument("--out", default="runs", help="parent folder of the run folder (default runs/)")
    g.add_argument("--name", help="run folder name after the timestamp (default: the prompt set)")
    g.add_argument("--resume", metavar="RUN_DIR", help="continue this run folder (its config; other flags ignored)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


def config_from(args):
    from reports.bench.config import BenchConfig

    return BenchConfig(
        target=args.target, draft=args.draft, prompts=args.prompts, n_prompts=args.num_prompts,
        categories=tuple(args.categories),
        prompt_order="file" if args.first else "round-robin", max_new_tokens=args.max_new_tokens, stop_on_eos=not args.ignore_eos,
        systems=tuple(args.systems), Ks=tuple(args.Ks), budgets=tuple(args.budget), schedules=tuple(args.schedule),
        fanout=args.fanout, fanout_alpha=args.fanout_alpha, fanout_r=args.fanout_r, Cs=tuple(args.C),
        backups=tuple(args.backup), temperatures=tuple(args.temperature), batch_sizes=tuple(args.batch_size),
        dtype=args.dtype, draft_dtype=args.draft_dtype, draft_int8=args.draft_int8, threads=args.threads,
        seed=args.seed, warmup=args.warmup, order=args.order,
    )


def run(args) -> int:
    from reports.bench import resume, start

    bench = resume(args.resume) if args.resume else start(config_from(args), args.out, args.name)
    variants, _ = bench.config.grid()
    print(f"run folder: {bench.run_dir.path} ({len(variants)} variants, {len(bench.prompts)} prompts)",
          file=sys.stderr)
    try:
        outcome = bench.run(progress=not args.no_progress)
    except KeyboardInterrupt:
        print(f"interrupted: continue with `saguaro bench --resume {bench.run_dir.path}`", file=sys.stderr)
        raise
    summary = outcome.summary
    print(format_table(summary["variants"], COLUMNS))
    for u in summary["unavailable"]:
        print(f"unavailable: {u['key']}: {u['reason']}", file=sys.stderr)
    if summary["errors"]:
        print(f"{len(summary['errors'])} prompts failed (recorded in results.jsonl, listed in summary.md)",
              file=sys.stderr)
    print(f"wrote {bench.run_dir.path}/summary.md; report: saguaro report {bench.run_dir.path}", file=sys.stderr)
    return 0

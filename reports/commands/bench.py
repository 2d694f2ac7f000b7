"""`saguaro bench`: this engine's AR and SD next to transformers' generate and assisted generation."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from reports.tables import format_table


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("bench", help="benchmark strategies and peers side by side on real prompts")
    p.add_argument("--prompts", default="spec_bench", help="spec_bench, humaneval, or a JSONL file of prompts")
    p.add_argument("-n", "--num-prompts", type=int, default=20)
    p.add_argument("--categories", nargs="+", default=[])
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--systems", nargs="+", default=["hf", "hf-assisted", "ar", "sd"])
    p.add_argument("-K", "--lookahead", type=int, nargs="+", default=[4], dest="Ks")
    p.add_argument("--C", type=float, default=1.0)
    p.add_argument("--target", default="qwen-coder-1.5b")
    p.add_argument("--draft", default="qwen-coder-0.5b")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--draft-dtype", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--draft-int8", action="store_true")
    p.add_argument("--threads", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=1, help="prompts run first and excluded")
    p.add_argument("--json", type=Path, help="write config, machine, summary and per-prompt results here")
    return p


def run(args) -> int:
    from reports.bench import Bench, BenchConfig, as_dict

    config = BenchConfig(
        target=args.target, draft=args.draft, prompts=args.prompts, n_prompts=args.num_prompts,
        categories=tuple(args.categories), max_new_tokens=args.max_new_tokens,
        temperature=args.temperature, systems=tuple(args.systems), Ks=tuple(args.Ks), C=args.C,
        dtype=args.dtype, draft_dtype=args.draft_dtype, draft_int8=args.draft_int8,
        threads=args.threads, seed=args.seed, warmup=args.warmup,
    )
    results = Bench(config).run(progress=sys.stderr.isatty())
    data = as_dict(config, results)
    if args.json:
        args.json.write_text(json.dumps(data, indent=2))
    print(format_table(data["summary"], ["system", "prompts", "tokens", "seconds", "tokens_per_s",
                                         "median_tokens_per_s", "vs_ar", "vs_hf", "alpha", "mean_accepted"]))
    print()
    print(format_table(data["by_category"], ["system", "category", "rounds", "alpha", "mean_accepted",
                                             "tokens_per_round"]))
    return 0

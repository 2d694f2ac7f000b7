"""`saguaro calibrate`: a run (about six minutes for the default pair on a 2-core CPU, most of it prefill) that
measures what an SD run cannot tell the simulator about SSD on this machine, as round records for
`saguaro simulate --fit`:

- the verify's time with the draft worker busy next to it (SSD) against alone (SD and AR), at the same
  batch sizes: the interference factor of this placement (about 1 for separate GPUs; shared memory
  bandwidth on one CPU). The three engines share one target and take turns call by call (AR, SD, SSD,
  then the next repetition in another order), so a drift of the machine's speed during the run falls
  on all of them alike and the factor compares like with like;
- the target's forward at one new token per row (AR), so that the verify's fit reaches down to AR;
- the branch decode's cost against the number of branches: SSD cache builds at each --batch size hold
  batch·budget branches;
- the neural backup's own time (the worker sends it with every answer), and the fast backups' (random
  tokens, prompt lookup) timed in-process, as the worker calls them.

The records go to --out (JSONL); pass them to `saguaro simulate --fit` together with an SD run's records.
The summary printed at the end is also written next to them (.summary.json); `simulate --fit` reads the
fast backups' times from it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from saguaro.commands.generate import DEFAULT_DRAFT, DEFAULT_TARGET

PROMPT = ("Write a Python function that returns the n-th Fibonacci number iteratively, then explain in a few "
          "sentences why the iterative version is faster than the naive recursive one.")


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("calibrate", help="measure SSD's timings on this machine for the simulator (a few minutes)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default=DEFAULT_TARGET, help=f"alias, model folder or .gguf (default {DEFAULT_TARGET})")
    p.add_argument("--draft", default=DEFAULT_DRAFT, help=f"alias, model folder or .gguf (default {DEFAULT_DRAFT})")
    p.add_argument("-K", "--K", type=int, default=4, help="draft tokens per round (default 4)")
    p.add_argument("--budget", type=int, default=12, help="SSD fan-out budget per sequence (default 12)")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4],
                   help="batch sizes; SSD builds batch·budget branches (default 1 4)")
    p.add_argument("--prompt", default=PROMPT, help="the prompt every sequence decodes (default: a coding question)")
    p.add_argument("--prompt-ids", type=int, nargs="+", metavar="ID", help="token ids instead of --prompt")
    p.add_argument("--tokens", type=int, default=32,
                   help="tokens per sequence in each SD and SSD call; AR's calls take half (default 32)")
    p.add_argument("--repeats", type=int, default=3,
                   help="calls per engine and batch size, taken in turns with the others (default 3)")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"],
                   help="target dtype (default bfloat16)")
    p.add_argument("--draft-int8", action="store_true", help="dynamic int8 quantisation of the draft")
    p.add_argument("--threads", type=int, default=1, help="target threads (default 1: one core, as in SSD)")
    p.add_argument("--draft-threads", type=int, default=1, help="SSD draft worker threads (default 1)")
    p.add_argument("--cache", type=Path, help="model cache folder (default ~/.cache/saguaro)")
    p.add_argument("--out", type=Path, required=True, help="JSONL file for the round records")
    return p


def _check(args) -> None:
    if args.K < 1:
        raise ValueError(f"-K must be >= 1 (draft tokens per round); got {args.K}")
    if args.budget < 1:
        raise ValueError(f"--budget must be >= 1; got {args.budget}")
    if min(args.batch) < 1:
        raise ValueError(f"--batch sizes must be >= 1; got {args.batch}")
    if args.tokens < 2 * (args.K + 1):
        raise ValueError(f"--tokens must be at least 2·(K+1) = {2 * (args.K + 1)} to see a few rounds")
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1; got {args.repeats}")
    if args.out.exists() and args.out.is_dir():
        raise ValueError(f"--out {args.out} is a folder: give a file name for the JSONL records")


def _records(llm, prompt: str | list[int], batch: int, tokens: int) -> list:
    from engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_new_tokens=tokens, stop_on_eos=False)
    return llm.generate([prompt] * batch, params).metrics.rounds


def fast_backup_ms(K: int, V: int, reps: int = 20) -> dict:
    """Median ms of the random and lookup backups for one missed row (they cost about the same per row)."""
    import torch

    from engine.ssd.backups import lookup_backup, random_backup

    generator = torch.Generator().manual_seed(0)
    context = list(range(200)) * 2
    times: dict = {"random": [], "lookup": []}
    q = torch.zeros(1, K, V)  # the worker writes each backup's q into the speculation's dense q
    for _ in range(reps):
        t0 = time.perf_counter()
        q[0] = random_backup(1, K, V, generator)[1][0]
        t1 = time.perf_counter()
        q[0] = lookup_backup([context], K, V)[1][0]
        times["random"].append((t1 - t0) * 1e3)
        times["lookup"].append((time.perf_counter() - t1) * 1e3)
    return {k: round(statistics.median(v), 3) for k, v in times.items()}


def summarize(records: list) -> dict:
    """Median verify by strategy and batch, the interference factor, tree step and backup times."""
    decode = [r for r in records if r.phase == "decode"]
    out: dict = {"verify_ms": {}, "interference": {}, "cache_build_ms": {}, "backup_ms": {}}
    for strategy in ("ar", "sd", "ssd"):
        for b in sorted({r.batch_size for r in decode}):
            times = [r.verify_ms for r in decode if r.strategy == strategy and r.batch_size == b]
            if times:
                out["verify_ms"].setdefault(strategy, {})[b] = round(statistics.median(times), 2)
    for b, ssd in out["verify_ms"].get("ssd", {}).items():
        sd = out["verify_ms"].get("sd", {}).get(b)
        if sd:
            out["interference"][b] = round(ssd / sd, 3)
    for r in decode:
        if r.strategy == "ssd" and r.cache_build_ms and r.branches:
            out["cache_build_ms"].setdefault(r.branches, []).append(r.cache_build_ms)
        if r.strategy == "ssd" and r.backup_ms and r.backup:
            out["backup_ms"].setdefault(r.hit.count(False) if r.hit else 0, []).append(r.backup_ms)
    for name in ("cache_build_ms", "backup_ms"):
        out[name] = {k: round(statistics.median(v), 1) for k, v in sorted(out[name].items())}
    factors = list(out["interference"].values())
    out["interference_factor"] = round(statistics.median(factors), 3) if factors else None
    return out


def run(args) -> int:
    _check(args)
    from engine import LLM, SpeculativeConfig
    from engine.config import DraftPlacement

    start = time.perf_counter()
    records = []
    prompt = args.prompt_ids or args.prompt
    common = dict(dtype=args.dtype, draft_int8=args.draft_int8, cache_dir=args.cache, chat_template=True)
    say = lambda text: print(f"calibrate: {text} ({time.perf_counter() - start:.0f} s)", file=sys.stderr)  # noqa: E731
    say("loading the target and the draft (SD: the draft in-process, the verify alone)")
    with LLM(args.target, args.draft, strategy="sd", speculative=SpeculativeConfig(K=args.K),
             threads=args.threads, **common) as sd:
        target, tokenizer = sd.target, sd.tokenizer
        vocab = int(target.get_output_embeddings().out_features)
        ar = LLM(target, strategy="ar", tokenizer=tokenizer, threads=args.threads, **common)
        say("starting SSD's draft worker in its own process (it builds the cache during each verify)")
        spec = SpeculativeConfig(K=args.K, budget=args.budget,
                                 placement=DraftPlacement(draft_threads=args.draft_threads))
        # the target keeps --threads in all three engines, so that only the worker next door differs
        with LLM(target, args.draft, strategy="ssd", speculative=spec, tokenizer=tokenizer, threads=args.threads,
                 **common) as ssd:
            if ssd.strategy_in_use != "ssd":
                raise RuntimeError(f"SSD's draft worker did not start ({ssd.fault}); nothing to calibrate")
            engines = [("ar", ar, max(args.K + 1, args.tokens // 2)), ("sd", sd, args.tokens),
                       ("ssd", ssd, args.tokens)]
            for b in args.batch:
                for _, llm, _ in engines:  # warm-up at this shape, not recorded
                    _records(llm, prompt, b, args.K + 2)
                for rep in range(args.repeats):
                    turn = engines[rep % 3:] + engines[:rep % 3]  # each engine goes first once in three
                    for _, llm, tokens in turn:
                        records += _records(llm, prompt, b, tokens)
                say(f"batch {b}: {args.repeats} turns of AR, SD and SSD done")
        ar.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(r.to_json() + "\n" for r in records))
    summary = summarize(records)
    summary["fast_backup_ms"] = fast_backup_ms(args.K, vocab)
    summary["wall_s"] = round(time.perf_counter() - start, 1)
    summary["settings"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                           if not k.startswith("_")}
    summary_path = args.out.with_suffix(".summary.json")
    summary_path.write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "settings"}, indent=1))
    print(f"wrote {args.out} ({len(records)} rounds) and {summary_path}; use: saguaro simulate --fit SD_RECORDS "
          f"{args.out}", file=sys.stderr)
    return 0

"""`saguaro bench`: this engine's AR, SD and SSD next to transformers' `generate` and assisted generation.

Every axis flag takes several values and the command runs the whole grid (axes a system does not have are skipped for
it): -K, --budget x --schedule (SSD fan-out), --C (temperature > 0 only), --backup, --temperature, --batch. Values are
space-separated: -K 2 4 auto --batch 1 4 --temperature 0 0.7. Results go to a new run folder, runs/<timestamp>-<name>/
(see --out); `--resume RUN_DIR` continues an interrupted run with its saved configuration, skipping what is done. Then
`saguaro report RUN_DIR ...` turns run folders into a Markdown report with figures.

Client mode: `--url http://HOST:PORT/v1` load-tests any OpenAI-compatible server (`saguaro serve`, vLLM, ...)
with streamed requests instead of running the engine here: open-loop Poisson arrivals at each `--rate`
(requests/s; inf = all at once) or a closed loop at each `--concurrency`, `--num-prompts` requests per point.
It records every streamed chunk's time and reports TTFT, TPOT, ITL and E2EL (theory.latency, as vLLM's
serving benchmark) and throughput per point; `--label` names the system (ar, sd, ssd) in reports, where
several client runs draw one line each against the request rate.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from saguaro.bench.config import BACKUPS, DEFAULT_SYSTEMS, SAMPLING_MODES, SCHEDULES, SYSTEMS
from saguaro.cli import HelpFormatter
from saguaro.commands.generate import add_adaptive_flags, add_precision_flags
from saguaro.commands.values import argument_type, flat, numbers, whole_or_auto
from saguaro.formatting import format_table

COLUMNS = [
    "key",
    "prompts",
    "errors",
    "tokens_per_s",
    "speedup_vs_ar",
    "speedup_vs_hf",
    "p50_ttft_ms",
    "mean_tpot_ms",
    "p99_itl_ms",
    "alpha",
    "tokens_per_round",
    "hit_rate",
]


_budget = argument_type(whole_or_auto, "a budget is a whole number of guesses or 'auto'")
# one or more of F_0 .. F_K a word: "4" (space-separated, like every list flag) or the older "4,3,2,2,1" / "4-3-2-2-1"
_fanout = argument_type(numbers, int, "a fan-out is F_0 ... F_K as integers (e.g. --fanout 4 3 2 2 1)", separators=",-")
_K = argument_type(whole_or_auto, "K is a whole number of draft tokens per round or auto")


def _rate(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a rate is requests per second or inf; got {text!r}") from None


# flags of the in-process engine bench (dest: the option shown in errors); client mode refuses them
ENGINE_FLAGS = {
    "systems": "--systems",
    "Ks": "-K",
    "budget": "--budget",
    "schedule": "--schedule",
    "fanout": "--fanout",
    "fanout_alpha": "--fanout-alpha",
    "fanout_r": "--fanout-r",
    "C": "--C",
    "backup": "--backup",
    "batch_size": "--batch",
    "target": "--target",
    "draft": "--draft",
    "dtype": "--dtype",
    "draft_dtype": "--draft-dtype",
    "draft_int8": "--draft-int8",
    "target_quant": "--target-quant",
    "draft_quant": "--draft-quant",
    "quant_group_size": "--quant-group-size",
    "target_head_quant": "--target-head-quant",
    "draft_head_quant": "--draft-head-quant",
    "threads": "--threads",
    "warmup": "--warmup",
    "order": "--order",
    "resume": "--resume",
    "K_min": "--K-min",
    "draft_cost": "--draft-cost",
    "confidence_stop": "--confidence-stop",
    "compiled": "--compile",
    "compile_max_len": "--max-len",
    "only": "--only",
}
CLIENT_FLAGS = {
    "model": "--model",
    "api_key": "--api-key",
    "rate": "--rate",
    "concurrency": "--concurrency",
    "endpoint": "--endpoint",
    "timeout": "--timeout",
    "deadline": "--deadline",
    "label": "--label",
    "system_prompt": "--system-prompt",
    "warmup_requests": "--warmup-requests",
}


def add_client_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("client mode: load on an OpenAI-compatible server (with --url)")
    g.add_argument("--url", help="the server's base URL, e.g. http://127.0.0.1:8000/v1 (switches to client mode)")
    g.add_argument("--model", help="model name to request (default: the first the server lists)")
    g.add_argument("--api-key", help="sent as a bearer token; never written to the run folder")
    g.add_argument("--rate", type=_rate, nargs="+", help="open loop: Poisson arrivals, requests/s (inf = all at once)")
    g.add_argument("--concurrency", type=int, nargs="+", help="closed loop: requests in flight")
    g.add_argument("--endpoint", choices=["completions", "chat"], help="default completions")
    g.add_argument("--timeout", type=float, help="seconds per request, to its last token (default: 300)")
    g.add_argument("--deadline", type=float, help="seconds for the whole run; then it stops (default: 3600)")
    g.add_argument("--label", help="the system's name in reports, e.g. ar, sd, ssd")
    g.add_argument(
        "--system-prompt",
        metavar="FILE",
        help="a text file sent with every request: the chat's system message, or text before a "
        "completions prompt (a prefix every request shares)",
    )
    g.add_argument(
        "--warmup-requests",
        type=int,
        metavar="N",
        help="requests sent one at a time before the first load point, with the set's first N prompts, "
        "and not recorded; the points take the prompts after them (default: 0)",
    )


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "bench",
        help="benchmark strategies and peers side by side on real prompts (sweeps), or load-test a server (--url)",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    g = p.add_argument_group("what to run")
    g.add_argument(
        "--systems",
        nargs="+",
        default=list(DEFAULT_SYSTEMS),
        choices=SYSTEMS,
        help="a system the engine cannot run is reported as unavailable",
    )
    g.add_argument(
        "--prompts",
        default="spec_bench",
        help="spec_bench, humaneval, or a JSONL file: one {'prompt': text} or {'ids': [token ids]} a line",
    )
    g.add_argument("-n", "--num-prompts", type=int, default=20, help="prompts, round-robin across tasks unless --first")
    g.add_argument(
        "--first",
        action="store_true",
        help="take the first n prompts in the set's file order instead (Spec-Bench's first 20 are MT-Bench)",
    )
    g.add_argument("--categories", nargs="+", default=[], help="keep these categories or tasks (e.g. mt_bench qa)")
    g.add_argument("--max-new-tokens", type=int, default=128, help="tokens per request")
    g.add_argument("--ignore-eos", action="store_true", help="always generate --max-new-tokens tokens")
    g = p.add_argument_group("sweep axes (several values each: the grid is run)")
    g.add_argument(
        "-K",
        type=_K,
        nargs="+",
        dest="Ks",
        metavar="K",
        help="draft tokens per round; auto = adaptive K (sd and ssd: each round's K in --K-min..8 from the "
        "running acceptance and draft/verify times). Default: auto with sd or ssd among --systems "
        "(engine.config.COMMAND_LINE_DEFAULTS), else 4",
    )
    g.add_argument(
        "--K", "--lookahead", type=_K, nargs="+", dest="Ks", default=argparse.SUPPRESS, help=argparse.SUPPRESS
    )
    add_adaptive_flags(g)
    g.add_argument(
        "--budget",
        type=_budget,
        nargs="+",
        help="SSD fan-out budget B = Σ F_k, or auto: the engine sizes it at run time so that the cache "
        "build fits inside one verify (default: auto, engine.config.COMMAND_LINE_DEFAULTS)",
    )
    g.add_argument(
        "--schedule",
        nargs="+",
        choices=SCHEDULES,
        help="SSD fan-out schedule for each budget: uniform, or geometric (Thm 12 optimum at "
        "--fanout-alpha; with --budget auto the engine's own, from the ranks the run measures; "
        "default: geometric, engine.config.COMMAND_LINE_DEFAULTS)",
    )
    g.add_argument(
        "--fanout",
        type=_fanout,
        nargs="+",
        action="extend",
        metavar="F",
        help="an explicit SSD schedule F_0 ... F_K instead (one K), e.g. --fanout 4 3 2 2 1",
    )
    g.add_argument("--fanout-alpha", type=float, default=0.8, help="α for the geometric schedule")
    g.add_argument("--fanout-r", type=float, default=1.0, help="power-law r for the geometric schedule")
    g.add_argument("--C", type=float, nargs="+", default=[1.0], help="Saguaro constant(s) in (0, 1]")
    g.add_argument("--backup", nargs="+", default=["neural"], choices=BACKUPS, help="SSD backup(s)")
    g.add_argument(
        "--temperature",
        type=float,
        nargs="+",
        default=[1.0],
        help="0 = greedy (the default is the API's, engine.SamplingParams)",
    )
    g.add_argument(
        "--sampling-mode",
        nargs="+",
        choices=SAMPLING_MODES,
        default=["standard"],
        dest="sampling_modes",
        help="ar, sd, ssd at T > 0: standard (rejection sampling) and / or invariant (drafter-invariant "
        "sampling: the same text for every strategy; docs/api.md)",
    )
    g.add_argument(
        "--compile",
        nargs="+",
        choices=["off", "on"],
        dest="compiled",
        metavar="off|on",
        help="ar, sd, ssd with eager (off) and / or compiled forwards on a static KV cache (on); "
        "--compile off on: both, interleaved (default: off)",
    )
    g.add_argument(
        "--max-len",
        type=int,
        default=2048,
        dest="compile_max_len",
        help="with --compile on: tokens per row of the static KV cache",
    )
    g.add_argument(
        "--only",
        nargs="+",
        metavar="PATTERN",
        help="run only the grid's variants that a pattern picks: a variant key or some of its words, "
        "e.g. --only 'sd K=auto' 'ssd K=3 B=8 uniform' (chosen configurations side by side, "
        "interleaved, without the rest of the grid)",
    )
    g.add_argument(
        "--batch", type=int, nargs="+", default=[1], dest="batch_size", metavar="B", help="prompts per generate call"
    )
    g.add_argument(
        "--batch-size", type=int, nargs="+", dest="batch_size", default=argparse.SUPPRESS, help=argparse.SUPPRESS
    )
    g = p.add_argument_group("models and machine (the same for every system)")
    g.add_argument("--target", default="qwen-coder-1.5b")
    g.add_argument("--draft", default="qwen-coder-0.5b")
    add_precision_flags(g)
    g.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    g.add_argument("--seed", type=int, default=0, help="seed of call i is seed + i (fixed, so that runs repeat)")
    g.add_argument("--warmup", type=int, default=1, help="excluded warm-up calls per variant")
    g.add_argument(
        "--order",
        choices=["interleaved", "grouped"],
        default="interleaved",
        help="interleaved: batch by batch across variants, against machine drift; grouped: "
        "variant by variant, one engine (and SSD worker process) alive at a time, for big sweeps",
    )
    g = p.add_argument_group("run folder")
    g.add_argument("--out", default="runs", help="parent folder of the run folder")
    g.add_argument("--name", help="run folder name after the timestamp (default: the prompt set)")
    g.add_argument("--resume", metavar="RUN_DIR", help="continue this run folder (its config; other flags ignored)")
    g.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress lines on stderr (they show on a terminal, or always with saguaro -v)",
    )
    add_client_flags(p)
    # argparse's get_default skips a default of None and finds a hidden alias's SUPPRESS instead: None it is
    p.set_defaults(
        _defaults={
            dest: None if p.get_default(dest) == argparse.SUPPRESS else p.get_default(dest) for dest in ENGINE_FLAGS
        }
    )
    return p


def sweep_defaults(args) -> tuple[list, list, list]:
    """-K, --budget and --schedule as given, the unset ones from SD's and SSD's command-line defaults
    (engine.config.COMMAND_LINE_DEFAULTS): K auto where sd or ssd runs, else 4; SSD's budget auto, geometric."""
    from engine.config import COMMAND_LINE_DEFAULTS, Strategy

    ssd = COMMAND_LINE_DEFAULTS[Strategy.SSD]
    speculative = {"sd", "ssd"} & set(args.systems)
    if args.Ks:
        Ks = args.Ks
    elif args.fanout:  # an explicit schedule says its K
        Ks = [len(flat(args.fanout)) - 1]
    else:
        Ks = [COMMAND_LINE_DEFAULTS[Strategy.SD]["K"]] if speculative else [4]
    budgets = args.budget or [ssd["budget"]]
    schedules = args.schedule or [ssd["schedule"].value]
    return Ks, budgets, schedules


def config_from(args):
    from saguaro.bench.config import BenchConfig

    Ks, budgets, schedules = sweep_defaults(args)
    return BenchConfig(
        target=args.target,
        draft=args.draft,
        prompts=args.prompts,
        n_prompts=args.num_prompts,
        categories=tuple(args.categories),
        prompt_order="file" if args.first else "round-robin",
        max_new_tokens=args.max_new_tokens,
        stop_on_eos=not args.ignore_eos,
        systems=tuple(args.systems),
        Ks=tuple(Ks),
        budgets=tuple(budgets),
        schedules=tuple(schedules),
        fanout=tuple(flat(args.fanout)) if args.fanout else None,
        fanout_alpha=args.fanout_alpha,
        fanout_r=args.fanout_r,
        Cs=tuple(args.C),
        backups=tuple(args.backup),
        temperatures=tuple(args.temperature),
        batch_sizes=tuple(args.batch_size),
        dtype=args.dtype,
        draft_dtype=args.draft_dtype,
        draft_int8=args.draft_int8,
        target_quant=args.target_quant,
        draft_quant=args.draft_quant,
        quant_group_size=args.quant_group_size,
        target_head_quant=args.target_head_quant,
        draft_head_quant=args.draft_head_quant,
        threads=args.threads,
        seed=args.seed,
        warmup=args.warmup,
        order=args.order,
        K_min=args.K_min,
        draft_cost=args.draft_cost,
        confidence_stop=args.confidence_stop,
        compiled=_compiled(args.compiled),
        compile_max_len=args.compile_max_len,
        only=tuple(args.only or ()),
        sampling_modes=tuple(dict.fromkeys(args.sampling_modes)),
    )


def _compiled(values: list[str] | None) -> tuple[bool, ...]:
    """--compile's values as the config's (absent: eager only)."""
    return (False,) if values is None else tuple(dict.fromkeys(v == "on" for v in values))


def _given(args, flags: dict[str, str], defaults: dict) -> list[str]:
    return [option for dest, option in flags.items() if getattr(args, dest) != defaults.get(dest)]


def client_config_from(args):
    """The ClientConfig of `saguaro bench --url ...`; ValueError for flags that belong to the engine bench."""
    from saguaro.bench.client_config import ClientConfig

    engine_only = _given(args, ENGINE_FLAGS, args._defaults)
    if engine_only:
        raise ValueError(
            f"--url load-tests a server, which chooses its own strategy and models: drop "
            f"{' '.join(engine_only)} (or drop --url to bench the engine here)"
        )
    if len(args.temperature) != 1:
        raise ValueError("client mode takes one --temperature per run: run the bench once per temperature")
    return ClientConfig(
        url=args.url,
        model=args.model,
        endpoint=args.endpoint or "completions",
        rates=tuple(args.rate or ()),
        concurrencies=tuple(args.concurrency or ()),
        num_prompts=args.num_prompts,
        prompts=args.prompts,
        categories=tuple(args.categories),
        prompt_order="file" if args.first else "round-robin",
        max_new_tokens=args.max_new_tokens,
        ignore_eos=args.ignore_eos,
        temperature=args.temperature[0],
        seed=args.seed,
        timeout_s=args.timeout or 300.0,
        deadline_s=args.deadline or 3600.0,
        label=args.label,
        system_prompt=_system_prompt(args.system_prompt),
        warmup=args.warmup_requests or 0,
    )


def _system_prompt(path: str | None) -> str | None:
    """The text of --system-prompt FILE (UTF-8); ValueError that names the file if it cannot be read."""
    if path is None:
        return None
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"--system-prompt {path}: cannot read it as UTF-8 text ({err})") from None


def run_client(args) -> int:
    from saguaro.bench.client_run import COLUMNS as POINT_COLUMNS
    from saguaro.bench.client_run import start_client

    bench = start_client(client_config_from(args), args.out, args.name, api_key=args.api_key)
    points = bench.config.points()
    print(
        f"run folder: {bench.run_dir.path} ({len(points)} load points of {bench.config.num_prompts} requests, "
        f"model {bench.model} at {bench.config.url})",
        file=sys.stderr,
    )

    def progress(point: dict) -> None:
        if not args.no_progress:
            print(
                f"{point['point']}: {point['completed']} completed, {point['failed']} failed, "
                f"{point['not_sent']} not sent in {point['duration_s']:.1f} s",
                file=sys.stderr,
            )

    outcome = bench.run(on_point=progress)
    print(format_table(outcome.points, POINT_COLUMNS))
    if outcome.summary["not_run"]:
        print(f"not run, the --deadline passed first: {', '.join(outcome.summary['not_run'])}", file=sys.stderr)
    failed = sum(p["failed"] for p in outcome.points)
    if failed:
        print(f"{failed} requests failed (errors in requests.jsonl)", file=sys.stderr)
    print(f"wrote {bench.run_dir.path}/summary.md; report: saguaro report {bench.run_dir.path}", file=sys.stderr)
    return 0


def run(args) -> int:
    if args.url:
        return run_client(args)
    client_only = [option for dest, option in CLIENT_FLAGS.items() if getattr(args, dest) is not None]
    if client_only:
        raise ValueError(
            f"{' '.join(client_only)} belong to client mode: add --url http://HOST:PORT/v1 (a server "
            f"to load-test), or drop them to bench the engine here"
        )
    from saguaro.bench import resume, start

    bench = resume(args.resume) if args.resume else start(config_from(args), args.out, args.name)
    variants, _ = bench.config.grid()
    print(f"run folder: {bench.run_dir.path} ({len(variants)} variants, {len(bench.prompts)} prompts)", file=sys.stderr)
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
        print(
            f"{len(summary['errors'])} prompts failed (recorded in results.jsonl, listed in summary.md)",
            file=sys.stderr,
        )
    print(f"wrote {bench.run_dir.path}/summary.md; report: saguaro report {bench.run_dir.path}", file=sys.stderr)
    return 0

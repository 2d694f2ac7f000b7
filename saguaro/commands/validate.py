"""`saguaro validate`: the simulator's predictions checked against measured runs (simulations only, no torch).

  saguaro validate engine RUN_DIR... --calibration CALIB.jsonl [CALIB_T07.jsonl ...] [--terms] [--json OUT.json]
  saguaro validate serving CLIENT_RUN... --calibration CALIB.jsonl --sd-run SD_BENCH_RUN \\
      --server-rounds SERVER_ROUNDS.jsonl --max-num-seqs 8 [--terms] [--json OUT.json]
  saguaro validate audit [--only SET ...] [--out DIR] [--markdown TABLE.md] [--figure FIGURE.png]
  saguaro validate paper [--fits KEY ...] [--variants] [--rounds 3000] [--json TABLE.json]
  saguaro validate defaults RUN_DIR... [--markdown TABLE.md]

engine: every configuration of `saguaro bench` runs predicted from `saguaro calibrate` records plus the runs'
own SD variants (α, hits and the machine's level), against the decode tokens/s each measured. serving: each
load point of a `saguaro bench --url` run replayed, TTFT and TPOT (p50, p99) against the client's. audit: every
held-out set of the committed studies (reports/*/manifest.json) predicted again with today's code. paper: the
published GPU figures (the paper's batch-1 table and the reference engine's test log: Llama-3.1-70B and
Qwen3-32B on H100s) next to the simulator's, one α fitted to each SD figure. defaults: whether the command
line's speculation defaults ran within 5% of the best configuration in each `saguaro bench` run.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

FITS = ("paper-llama", "paper-qwen3", "log-llama", "log-qwen3")  # saguaro.validation.published.FIT_KEYS (tested)


def add_parser(subparsers) -> argparse.ArgumentParser:
    from saguaro.cli import HelpFormatter

    p = subparsers.add_parser(
        "validate",
        help="check the simulator's predictions against measured runs",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    actions = p.add_subparsers(dest="validate_action", required=True, metavar="ACTION")
    engine = actions.add_parser(
        "engine", help="predict every configuration of saguaro bench runs", formatter_class=HelpFormatter
    )
    engine.add_argument("runs", type=Path, nargs="+", help="saguaro bench run folders")
    engine.add_argument(
        "--calibration",
        type=Path,
        nargs="+",
        required=True,
        help="saguaro calibrate records; several at different --temperature: each configuration "
        "takes the one at its temperature, else the nearest; several at one temperature: one "
        "fit over all their records (e.g. a calibration before the runs and one after them)",
    )
    engine.add_argument("--rounds", type=int, default=4000, help="simulated rounds per configuration")
    engine.add_argument("--seed", type=int, default=0)
    engine.add_argument(
        "--no-level",
        action="store_true",
        help="the calibration's level as it is (default: leveled to each run folder's own SD "
        "variants, else to its temperature's SD reference)",
    )
    engine.add_argument(
        "--terms",
        action="store_true",
        help="also compare each configuration's rounds term by term (verify, draft, cache build, "
        "backup: median measured / predicted, ms) with its leveled fit",
    )
    _add_build_level(engine)
    engine.add_argument("--json", type=Path, help="also write every row as JSON here")

    serving = actions.add_parser(
        "serving", help="predict the load points of saguaro bench --url runs", formatter_class=HelpFormatter
    )
    serving.add_argument("client_runs", type=Path, nargs="+", help="saguaro bench --url run folders")
    serving.add_argument(
        "--calibration",
        type=Path,
        nargs="+",
        required=True,
        help="saguaro calibrate records; several: one fit over all of them",
    )
    serving.add_argument(
        "--sd-run",
        type=Path,
        required=True,
        help="saguaro bench run with an SD variant at batch 1 on the served prompts",
    )
    serving.add_argument("--server-rounds", type=Path, required=True, help="the server's --rounds-out records")
    serving.add_argument("--max-num-seqs", type=int, required=True, help="the server's --max-num-seqs")
    serving.add_argument("--temperature", type=float, default=0.0)
    serving.add_argument("--seeds", type=int, default=20, help="simulations per point (the median is predicted)")
    serving.add_argument(
        "--no-level",
        action="store_true",
        help="the calibration's level as it is (default: leveled to the SD run's rounds)",
    )
    serving.add_argument(
        "--no-prefill-overlap",
        dest="prefill_overlap",
        action="store_false",
        help="the server predates SSD's Prefill message (its worker prefilled joiners after the target)",
    )
    serving.add_argument(
        "--terms",
        action="store_true",
        help="also compare the server's rounds, term by term, with the fit (median per batch size)",
    )
    _add_build_level(serving)
    serving.add_argument("--json", type=Path, help="also write every point as JSON here")

    audit = actions.add_parser(
        "audit", help="predict every committed study's held-out sets again", formatter_class=HelpFormatter
    )
    audit.add_argument("--reports", type=Path, help="the studies' folder (default: this checkout's reports/)")
    audit.add_argument("--only", nargs="+", metavar="SET", help="held-out sets to run (default: all)")
    audit.add_argument("--rounds", type=int, default=4000, help="simulated rounds per configuration")
    audit.add_argument(
        "--out", type=Path, help="keep each validation's JSON and the unpacked runs here (default: a temporary folder)"
    )
    audit.add_argument("--markdown", type=Path, help="also write the tables to this file")
    audit.add_argument("--figure", type=Path, help="also draw predicted against measured tokens/s to this PNG")

    paper = actions.add_parser(
        "paper", help="published GPU figures next to the simulator's predictions", formatter_class=HelpFormatter
    )
    paper.add_argument("--rounds", type=int, default=3000, help="target forwards per simulation")
    paper.add_argument("--seed", type=int, default=0, help="seed of every simulation")
    paper.add_argument(
        "--fits",
        nargs="+",
        default=list(FITS),
        choices=FITS,
        help="the SD figures to fit, each with the rows it predicts (source-pair)",
    )
    paper.add_argument(
        "--variants",
        action="store_true",
        help="also the paper's fits with one choice moved at a time (hit model, engine, K)",
    )
    paper.add_argument("--json", type=Path, help="also write every figure and its inputs as JSON")

    defaults = actions.add_parser(
        "defaults",
        help="the command line's speculation defaults against each run's best",
        formatter_class=HelpFormatter,
    )
    defaults.add_argument(
        "runs", type=Path, nargs="+", help="saguaro bench run folders with the defaults among their variants"
    )
    defaults.add_argument("--markdown", type=Path, help="also write the table to this file")
    return p


def _add_build_level(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--build-level",
        action="store_true",
        help="scale the fit's builds to the calibration's engine build rounds (saguaro calibrate "
        "--build-tokens): an experiment, no better on the held-out runs of 2026-12-02 "
        "(reports/2026-12-cpu-prediction-accuracy)",
    )


def run(args: argparse.Namespace) -> int:
    action = {"engine": _engine, "serving": _serving, "audit": _audit, "paper": _paper, "defaults": _defaults}[
        args.validate_action
    ]
    return action(args)


def _engine(args: argparse.Namespace) -> int:
    from saguaro.validation.engine import validate_runs
    from saguaro.validation.tables import engine_text

    result = validate_runs(
        args.runs,
        args.calibration,
        rounds=args.rounds,
        seed=args.seed,
        level=not args.no_level,
        build_level=args.build_level,
    )
    print(engine_text(result, with_terms=args.terms))
    if args.json:
        args.json.write_text(json.dumps(result.to_json(), indent=1) + "\n")
    return 0


def _serving(args: argparse.Namespace) -> int:
    from saguaro.validation.serving import validate_served
    from saguaro.validation.tables import served_text
    from simulator.records import read_records

    result = validate_served(
        args.client_runs,
        args.calibration,
        args.sd_run,
        args.server_rounds,
        args.max_num_seqs,
        temperature=args.temperature,
        seeds=args.seeds,
        level=not args.no_level,
        prefill_overlap=args.prefill_overlap,
        build_level=args.build_level,
    )
    print(served_text(result, read_records(args.server_rounds) if args.terms else None))
    if args.json:
        args.json.write_text(json.dumps(result.to_json(), indent=1) + "\n")
    return 0


def _audit(args: argparse.Namespace) -> int:
    from saguaro.validation.audit import markdown, run_audit
    from saguaro.validation.studies import REPORTS

    if args.rounds < 1:
        raise ValueError(f"--rounds must be at least 1, got {args.rounds}")
    with tempfile.TemporaryDirectory(prefix="saguaro-audit-") as scratch:
        out = args.out or Path(scratch)
        results = run_audit(args.reports or REPORTS, out, args.only, args.rounds)
    text = markdown(results)
    print(text, end="")
    if args.markdown:
        args.markdown.write_text(text)
    if args.figure:
        from saguaro.validation.figure import save

        save(results, args.figure)
    return 0


def _paper(args: argparse.Namespace) -> int:
    from saguaro.validation import paper

    results = paper.run_fits(args.fits, args.rounds, args.seed)
    spread = (
        paper.variants(args.rounds, args.seed, tuple(k for k in args.fits if k.startswith("paper")))
        if args.variants
        else []
    )
    within, predicted = paper.summary(results)
    sections = [
        ("published against predicted", paper.table(results)),
        ("the SSD draft's cycle a round", paper.cycle_table(results)),
        ("inputs: engine, α and the hit model of every SSD prediction", paper.inputs_text(results)),
        ("predicted rows more than 10% off: what they miss and what would settle it", paper.blocked_text(results)),
        ("variants: one choice moved at a time, α refitted", paper.variant_table(spread) if spread else ""),
    ]
    print(f"{within} of {predicted} predicted figures within 10%")
    for title, text in sections:
        if text:
            print(f"\n{title}\n{text}")
    if args.json:
        command = (
            f"saguaro validate paper --rounds {args.rounds} --seed {args.seed} --fits {' '.join(args.fits)}"
            + (" --variants" if args.variants else "")
            + f" --json {args.json}"
        )
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(paper.payload(results, spread, command), indent=2) + "\n", encoding="utf-8")
    return 0


def _defaults(args: argparse.Namespace) -> int:
    from saguaro.validation.defaults import check, markdown

    rows = check(args.runs)
    text = markdown(rows)
    print(text, end="")
    print(f"{sum(r['within'] for r in rows)} of {len(rows)} within 5% of their run's best")
    if args.markdown:
        args.markdown.write_text(text)
    return 0

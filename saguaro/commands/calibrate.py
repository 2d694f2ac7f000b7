"""`saguaro calibrate`: timed forwards that tell the simulator what an SD run cannot about SSD on this
machine, at the contexts the workload will have (--context). For the default pair on a 2-core CPU that takes
about two minutes where the CPU has fast bfloat16 GEMMs (AVX-512), about nine (--batch 1 2 4) to sixteen
(--batch 1 4 8) on an AVX2-only one (float32, a five-row verify of 1.3 s, 2026-12-03); the progress lines say
what is left at the pace so far.

One long prompt (real prompt text repeated to the largest --context) is prefilled ONCE by the target here
and ONCE by the draft in a worker process on the other core(s), as SSD places them. Each smaller context is
reached by rolling the caches back exactly (engine.kv_cache), each batch size by copying that row; every
timed forward is rolled back too, so nothing is prefilled twice. At each context and batch size:

- the target's AR step (one token per row) and verify (K+1 tokens per row), alone, each one round of the
  engine's own decode loop (its AR proposer, and one proposing fixed tokens) timed as its round records
  time them (verify_ms: the forward, the warp, the rejection sampling and the roll-back); at batch 1 also
  the verify of blocks 2, 3 and 2K wide, where its cost bends (the fit's knee). At batch > 1
  every row but the first is one token shorter, as the rows of a real batch differ in length: rows
  without a hole take another attention path in transformers, much slower on CPU in bfloat16 (the
  draft's rows below get the same);
- the draft's SD proposal (K steps over the batch, and one step feeding one token a row and then two, as
  SD's first step does after an all-accepted round, each with its own 2-token verify: two lengths tell a
  proposal's own cost from its steps', two widths the cost of a row even at batch 1) and its neural backup
  (the worker's K-step draft over the missed rows), alone, as SD and SSD run them while the target waits;
- for each --budget B, --repeats times in turn: the verify alone, then one build of SSD's cache (the glue
  forward, then the K-step branch decode of batch·B branches, each branch a copy of its sequence's KV) with
  one verify beside it, then the wait for the build, as an SSD round runs them (verifying on until the
  build ended would keep the target busy through build time the engine's worker has alone:
  the int4 pair's one-branch build took 115-202 ms that way, 123 ms (median) in the engine's rounds, and
  114-136 ms timed this way; two untimed builds go first, as a fresh worker's first build ran 10-30% slow).
  Each pair's busy verify over its lone one is the verify's slowdown (the interference factor of this
  placement, about 1 for separate GPUs): taken seconds apart, the two see the machine alike, where blocks
  minutes apart gave factors from 0.75 to 1.20 on one 2-core VM. The builds give their cost against
  branches and context, as they are when SSD runs. With --builds-alone, the first two pairs of a point are
  each followed by one build with the target idle, written as a record marked level "alone": the fit's build
  line then comes from them, scaled by the median of the builds beside the verify over it (an experiment:
  on a calibration of 2026-12-04 it put 7 of 11 held-out engine rows within 10% against 10 for the line
  through the builds beside, 12 of 20 served figures within 15% against 8; simulator/README.md).

Then the engine itself runs SSD for --link-tokens tokens on the prompt at the shortest context (K 1, one
guess per outcome, the draft worker as SSD starts it): in the rounds that hit with a build shorter than the
verify, the target's wait is the link both ways and the worker's answer (its lookup, the message, the target
decoding it), which no timed forward shows: 2.3-3.5 ms a round for the default and the int4 pair on this
2-core VM, as in their bench rounds, where the simulator had 0. Those rounds are written with the rest (real
rounds: the fit's link comes from them). With --build-tokens N, the engine's SSD then runs at the
calibration's K and middle --budget (uniform fan-out, neural backup) at each --batch size for N tokens a row,
on the same prompt (a batch's rows a token shorter each), and its rounds are written too, marked level
"build": the fit measures their builds against its build line, per batch size (`simulator.fit`: the build
level; `saguaro validate engine --build-level` applies it). An experiment, off by default: the harness's builds
ran 12-37% dearer than the engine's within minutes on a 2-core VM, but on the held-out runs of 2026-12-02 10:50
(reports/2026-12-cpu-prediction-accuracy) the level made the predictions worse. Should the engine's SSD fail in
either run, the timed points are written all the same, without a link or a build level.

The records go to --out (JSONL, the engine's round-record schema, one record per timed forward or pair):
pass them to `saguaro simulate --fit` (alone, or with an SD run's records). Their accepted counts are not
measurements (timing only: do not pass them to --calibrate). The summary printed at the end (medians per
point, the inputs: pair, dtype, threads, contexts, batches, CPU) is also written next to them
(.summary.json); `simulate --fit` reads the fast backups' times from it.

Last, with --host-rounds N (default 32), the engine's own work a round with its forwards taken out
(saguaro.calibration.host_terms): AR, SD and SSD at K and the temperature above, batch 1 and 8, the worker in
this process, on a random pair of the target's vocabulary, N timed rounds each (about 15 s at the default pair's
vocabulary, 151,936). The summary records them ("host_terms": the rounds, where they ran, the simulator's terms
from them); `simulate --fit` then counts at least that work outside each round's timed forwards, which the
timed points above leave out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from saguaro.bench.environment import cpu_model, machine
from saguaro.calibration.draft_worker import start_worker
from saguaro.calibration.measure import (
    build_rounds,
    fast_backup_ms,
    fit_summary,
    level_budget,
    link_rounds,
    long_prompt,
    measure,
)
from saguaro.commands.generate import (
    DEFAULT_DRAFT,
    DEFAULT_TARGET,
    DTYPE_HELP,
    DTYPES,
    add_quant_flags,
    quant_kwargs,
    resolve_dtypes,
)

PROMPT = (
    "Write a Python function that returns the n-th Fibonacci number iteratively, then explain in a few "
    "sentences why the iterative version is faster than the naive recursive one. Then write tests for it "
    "with pytest, covering n = 0, n = 1, a large n, and a negative n that must raise ValueError. "
)


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "calibrate",
        help="measure SSD's timings on this machine for the simulator (2-16 minutes)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--target", default=DEFAULT_TARGET, help=f"alias, model folder or .gguf (default {DEFAULT_TARGET})")
    p.add_argument("--draft", default=DEFAULT_DRAFT, help=f"alias, model folder or .gguf (default {DEFAULT_DRAFT})")
    p.add_argument("-K", "--K", type=int, default=4, help="draft tokens per round (default 4)")
    p.add_argument(
        "--budget",
        type=int,
        nargs="+",
        default=[4, 8, 16],
        help="SSD fan-out budgets per sequence; a build holds batch·budget branches (default 4 8 16: "
        "a build's cost is not a line in branches, so time the budgets you plan for)",
    )
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4], help="batch sizes (default 1 4)")
    p.add_argument(
        "--context",
        type=int,
        nargs="+",
        default=[64, 512],
        help="context lengths in tokens to time the decode forwards at; cover the workload's "
        "(prompt + output), e.g. 64 512 1024 (default 64 512)",
    )
    p.add_argument("--prompt", default=PROMPT, help="text repeated to the longest --context (default: a coding task)")
    p.add_argument("--prompt-ids", type=int, nargs="+", metavar="ID", help="token ids instead of --prompt")
    p.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="the workload's temperature: the target's verify and the draft's SD proposal, backup and "
        "cache build sample at it, as they do in the run (default 0: greedy). At T > 0 sampling "
        "the draft's branches costs more; calibrate at each temperature you plan for",
    )
    p.add_argument(
        "--link-tokens",
        type=int,
        default=48,
        help="tokens the engine's own SSD generates at the end (K 1, one guess per outcome) to time "
        "the wait of a round that hit: the link both ways and the worker's answer, which the "
        "timed forwards cannot show (default 48; 0: skip, the fit's link is then 0)",
    )
    p.add_argument(
        "--build-tokens",
        type=int,
        default=0,
        help="tokens a row the engine's own SSD generates at the end, at K, the middle --budget and each "
        "--batch, whose cache builds the fit measures against its own (an experiment; about 20 s a "
        "batch size for 32 tokens here; default 0: skip)",
    )
    p.add_argument(
        "--builds-alone",
        action="store_true",
        help="also time two builds a point with the target idle; the fit's build line is then fitted on "
        "them and scaled by the builds beside the verify (an experiment: about 80 s more at "
        "--batch 1 2 4 8 here; see simulator/README.md)",
    )
    p.add_argument(
        "--host-rounds",
        type=int,
        default=32,
        help="rounds of AR, SD and SSD at batch 1 and 8 timed with the forwards taken out, for the engine's "
        "own work a round (about 15 s at a vocabulary of 151,936; default 32; 0: skip)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="timed forwards per point (AR, verify, SD draft; SSD builds take two) (default 3)",
    )
    p.add_argument(
        "--dtype",
        default="auto",
        choices=DTYPES,
        help=DTYPE_HELP + " (the target's: calibrate the models as the runs load them)",
    )
    p.add_argument(
        "--draft-int8", action="store_true", help="dynamic int8 draft (the same as --draft-quant int8-dynamic)"
    )
    add_quant_flags(p)  # calibrate the models as the run will load them: a low-bit target has other costs
    p.add_argument("--threads", type=int, default=1, help="target threads (default 1: one core, as in SSD)")
    p.add_argument("--draft-threads", type=int, default=1, help="draft worker threads (default 1)")
    p.add_argument("--cache", type=Path, help="model cache folder (default ~/.cache/saguaro)")
    p.add_argument("--out", type=Path, required=True, help="JSONL file for the timing records")
    return p


def _check(args) -> None:
    if args.K < 1:
        raise ValueError(f"-K must be >= 1 (draft tokens per round); got {args.K}")
    if min(args.budget) < 1:
        raise ValueError(f"--budget values must be >= 1; got {args.budget}")
    if min(args.batch) < 1:
        raise ValueError(f"--batch sizes must be >= 1; got {args.batch}")
    if min(args.context) < args.K + 1:
        raise ValueError(f"--context values must be at least K+1 = {args.K + 1} tokens; got {args.context}")
    if not args.temperature >= 0:
        raise ValueError(f"--temperature must be >= 0 (0: greedy); got {args.temperature}")
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1; got {args.repeats}")
    if args.link_tokens < 0:
        raise ValueError(f"--link-tokens must be >= 0 (0: skip the engine's rounds); got {args.link_tokens}")
    if args.build_tokens < 0:
        raise ValueError(f"--build-tokens must be >= 0 (0: skip the engine's build rounds); got {args.build_tokens}")
    if args.host_rounds < 0:
        raise ValueError(f"--host-rounds must be >= 0 (0: skip the host work); got {args.host_rounds}")
    if args.threads < 1 or args.draft_threads < 1:
        raise ValueError("--threads and --draft-threads must be >= 1")
    if args.out.exists() and args.out.is_dir():
        raise ValueError(f"--out {args.out} is a folder: give a file name for the JSONL records")


def _config(args):
    """The engine's configuration of the pair as an SSD run would load it (its checks refuse bad quant flags
    before any model loads)."""
    from engine.config import EngineConfig

    return EngineConfig(
        target=str(args.target),
        draft=str(args.draft),
        strategy="ssd",
        dtype=args.dtype,
        threads=args.threads,
        cache_dir=None if args.cache is None else str(args.cache),
        **quant_kwargs(args),
    )


def quant_inputs(config) -> dict:
    """The low-bit settings as the calibration's inputs record them (the CLI flags' names and values)."""
    target, draft = config.target_quant, config.draft_quant
    return {
        "draft_int8": draft is not None and draft.dynamic,
        "target_quant": target and target.scheme,
        "target_head_quant": target and target.head,
        "draft_quant": draft and draft.scheme,
        "draft_head_quant": draft and draft.head,
    }


def host_work(args, vocab: int) -> dict:
    """The summary's "host_terms": the engine's rounds with its forwards taken out on a random pair of `vocab`
    (saguaro.calibration.host_terms), or {"error": why} where the measurement failed (the timed points are kept)."""
    # imported here: the simulator it reads would load simpy for every command (`saguaro theory` stays light)
    from saguaro.calibration.host_terms import describe, host_pair, measure_host_terms

    try:
        terms = measure_host_terms(
            *host_pair(vocab),
            K=args.K,
            rounds=args.host_rounds,
            temperature=args.temperature,
            meta={"command": "saguaro calibrate"},
        )
    except (ValueError, RuntimeError) as err:
        return {"error": f"{type(err).__name__}: {err}"}
    for line in describe(terms):
        print(f"calibrate: {line.strip()}", file=sys.stderr)
    return terms.to_dict()


def run(args) -> int:
    _check(args)
    resolve_dtypes(args)  # the summary and the records say which dtype auto took
    config = _config(args)
    from engine import LLM
    from engine.loading.recipe import draft_recipe

    start = time.perf_counter()
    say = lambda text: print(f"calibrate: {text} ({time.perf_counter() - start:.0f} s)", file=sys.stderr)  # noqa: E731
    say("loading the target here and the draft in its own process")
    recipe = draft_recipe(None, config)  # the worker loads the draft as SSD's worker does (dtype, low-bit scheme)
    with LLM(
        args.target,
        strategy="ar",
        dtype=args.dtype,
        threads=args.threads,
        cache_dir=args.cache,
        target_quant=config.target_quant,
    ) as llm:
        target = llm.target
        if args.prompt_ids:
            ids = list(args.prompt_ids)
        else:
            if llm.tokenizer is None:
                raise ValueError("the target has no tokenizer: give --prompt-ids")
            ids = llm.tokenizer.encode(args.prompt, add_special_tokens=False)
        longest = max(args.context)
        if llm.max_context is not None and longest + 2 * args.K + 1 > llm.max_context:
            raise ValueError(
                f"--context {longest} + 2K+1 exceeds the target's context window ({llm.max_context} "
                f"tokens): give smaller --context values"
            )
        ids = long_prompt(ids, longest + 2 * args.K + 1)  # the tail feeds the timed forwards (up to 2K wide)
        vocab = int(target.get_output_embeddings().out_features)
        worker = start_worker(recipe, args.draft_threads, ids, args.K, args.temperature)
        try:
            message = worker.recv(600)
            if message[0] != "ready" or message[1] != vocab:
                raise ValueError(
                    f"target and draft have different vocabularies ({vocab} vs {message[1]} logits): "
                    "calibrate a pair that shares the tokenizer"
                )
            say("both models loaded")
            records, summary = measure(args, target, ids, worker, say)
        finally:
            worker.close()
        if args.link_tokens:
            say(
                f"the engine's own SSD (K 1, its draft worker started anew) for {args.link_tokens} tokens, "
                "to time the link"
            )
            try:
                rounds, summary["link"] = link_rounds(args, config, llm, ids[: min(args.context)])
            except Exception as err:  # noqa: BLE001  an extra: the timed points are kept whatever it raises
                rounds, summary["link"] = [], {"error": f"{type(err).__name__}: {err}"}
                say(f"the engine's SSD rounds failed ({type(err).__name__}: {err}): the link is not timed")
            records += rounds
            link = summary["link"]
            if rounds:
                say(
                    f"the engine's SSD at K 1, {link['rounds']} rounds: "
                    + (
                        f"{link['hits_timed']} hit with the build inside the verify, waiting {link['hit_wait_ms']} ms"
                        if link["hits_timed"]
                        else "none hit with the build inside the verify: the link is not timed"
                    )
                )
        if args.build_tokens:
            batches = " ".join(map(str, sorted(set(args.batch))))
            say(
                f"the engine's own SSD (K {args.K}, budget {level_budget(args.budget)}, batch {batches}) for "
                f"{args.build_tokens} tokens a row, to measure its builds against the calibration's"
            )
            try:
                rounds, summary["build_level"] = build_rounds(args, config, llm, ids[: min(args.context)])
            except Exception as err:  # noqa: BLE001  an extra, as the link rounds are
                rounds, summary["build_level"] = [], {"error": f"{type(err).__name__}: {err}"}
                say(f"the engine's SSD build rounds failed ({type(err).__name__}: {err}): no build level is measured")
            records += rounds
            if rounds:
                say(f"the engine's builds, median ms by batch size: {summary['build_level']['build_ms']}")
    if args.host_rounds:
        say(
            f"the engine's own work a round, its forwards taken out: AR, SD and SSD at batch 1 and 8, "
            f"{args.host_rounds} rounds each"
        )
        summary["host_terms"] = host_work(args, vocab)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in records))
    summary["fast_backup_ms"] = fast_backup_ms(args.K, vocab)
    summary["fit"] = fit_summary(args.out)
    summary["wall_s"] = round(time.perf_counter() - start, 1)
    summary["inputs"] = {
        "target": str(args.target),
        "draft": str(args.draft),
        "dtype": args.dtype,
        **quant_inputs(config),
        "quant_group_size": args.quant_group_size,
        "threads": args.threads,
        "draft_threads": args.draft_threads,
        "K": args.K,
        "temperature": args.temperature,
        "budgets": args.budget,
        "batches": args.batch,
        "contexts": args.context,
        "repeats": args.repeats,
        "link_tokens": args.link_tokens,
        "build_tokens": args.build_tokens,
        "host_rounds": args.host_rounds,
        "cpu": cpu_model(),
        "cpu_flags": machine().get("cpu_flags"),  # "AMD EPYC" names AVX2-only and AVX-512 hosts
        "torch": __import__("torch").__version__,
        # batch > 1: rows of different lengths (saguaro.calibration.target_rounds.ragged)
        "ragged_rows": True,
    }
    summary["settings"] = {
        k: (str(v) if isinstance(v, Path) else v)
        for k, v in vars(args).items()
        if not k.startswith("_") and k != "func"
    }
    summary_path = args.out.with_suffix(".summary.json")
    summary_path.write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "settings"}, indent=1))
    print(
        f"wrote {args.out} ({len(records)} timing points) and {summary_path}; use: saguaro simulate --fit "
        f"{args.out} [SD_RECORDS]",
        file=sys.stderr,
    )
    return 0

"""What `saguaro calibrate` measures, and how: the timed points at each context, batch size and budget (the
draft's side timed in its own process, saguaro.calibration.draft_worker), the engine's own SSD rounds, and the
records and summary it writes (saguaro/commands/calibrate.py is the command line)."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from saguaro.calibration.draft_worker import DraftWorker
from saguaro.calibration.target_rounds import TargetRounds


def long_prompt(ids: list[int], length: int) -> list[int]:
    """`ids` repeated (whole copies, then a cut) to exactly `length` tokens."""
    if not ids:
        raise ValueError("the prompt is empty: give --prompt text or --prompt-ids")
    return (ids * (length // len(ids) + 1))[:length]


def _ms(pairs) -> list[float]:
    return [(t1 - t0) * 1e3 for t0, t1 in pairs]


def fast_backup_ms(K: int, V: int, reps: int = 20) -> dict:
    """Median ms of the random and lookup backups for one missed row (they cost about the same per row)."""
    import torch

    from engine.sampling import Keys
    from engine.ssd.backups import lookup_backup, random_backup

    keys = Keys.of([0], [400])
    context = list(range(200)) * 2
    times: dict = {"random": [], "lookup": []}
    q = torch.zeros(1, K, V)  # the worker writes each backup's q into the speculation's dense q
    for _ in range(reps):
        t0 = time.perf_counter()
        q[0] = random_backup(keys, K, V)[1][0]
        t1 = time.perf_counter()
        q[0] = lookup_backup([context], K, V)[1][0]
        times["random"].append((t1 - t0) * 1e3)
        times["lookup"].append((time.perf_counter() - t1) * 1e3)
    return {k: round(statistics.median(v), 3) for k, v in times.items()}


def _record(strategy: str, K: int, b: int, c: int, verify_ms: float, draft_ms: float = 0.0, **ssd) -> dict:
    """A timing point in the engine's round-record schema (accepted counts are placeholders, not measured)."""
    rec = dict(
        strategy=strategy,
        round=1,
        batch_size=b,
        K=K if strategy != "ar" else 0,
        context_len=c,
        accepted=[0] * b,
        emitted=[1] * b,
        draft_ms=round(draft_ms, 3),
        verify_ms=round(verify_ms, 3),
        round_ms=round(verify_ms + draft_ms, 3),
        draft_forwards=K if draft_ms else 0,
        phase="decode",
    )
    if ssd:
        rec.update(ssd)
    return rec


def _prefill_record(b: int, tokens: int, target_ms: float, draft_ms: float) -> dict:
    return dict(
        strategy="sd",
        round=0,
        batch_size=b,
        K=0,
        context_len=0,
        accepted=[0] * b,
        emitted=[1] * b,
        draft_ms=round(draft_ms, 3),
        verify_ms=round(target_ms, 3),
        round_ms=round(target_ms + draft_ms, 3),
        draft_forwards=1,
        phase="prefill",
        tokens=tokens,
    )


def _fanout(K: int, per_row: int) -> list[int]:
    """A uniform schedule of `per_row` guesses over the K+1 outcomes (the records' fan-out field)."""
    return [per_row // (K + 1) + (i < per_row % (K + 1)) for i in range(K + 1)]


def verify_widths(K: int) -> list[int]:
    """Block widths (K+1 for a round of K) timed at batch 1: 2, 3, K + 1 and 2K, so the verify's fit sees
    how the cost bends at a few rows (simulator.fit: the knee)."""
    return sorted({2, 3, K + 1, 2 * K})


def prefill_points(contexts: list[int], batches: list[int]) -> list[tuple[int, int]]:
    """(batch, tokens) of the timed prefills: batch 1 at the shortest, middle and longest context, and each
    larger batch at the shortest and twice it (within the longest), so that the fit sees rows come from both
    length and batch; the longest at batch 1 comes last (its cache is the base the decode points roll back)."""
    lo, hi = min(contexts), max(contexts)
    points = {(1, lo), (1, (lo + hi) // 2)}
    points |= {(b, n) for b in batches if b > 1 for n in (lo, min(2 * lo, hi))}
    points.discard((1, hi))
    return sorted(points) + [(1, hi)]


# Untimed builds before the first timed one: a fresh worker's first build ran 10-30% over the median of its next
# 19 (three workers on a 2-core VM, default pair, batch 1, 8 branches, context 150: 481, 515, 440 ms against
# 371, 431, 401), and the first point's three repeats are all a calibration has of that shape.
WARM_BUILDS = 2
# Builds timed with the target idle, per point (--builds-alone): the fit's build line is then fitted on them and
# scaled by the builds beside the verify (simulator.fit). Two a point: two in a row differed by up to 1.4x
# (2026-12-04, reports/2026-12-cpu-prediction-accuracy).
ALONE_BUILDS = 2


def measure(args, target, ids: list[int], worker: DraftWorker, say) -> tuple[list[dict], dict]:
    """Every timed point: records (JSONL dicts) and the summary's medians."""
    import torch

    from engine.kv_cache import KVState

    K, reps = args.K, args.repeats
    contexts = sorted(set(args.context), reverse=True)  # longest first: shorter ones are roll-backs
    records: list[dict] = []
    med = lambda xs: round(statistics.median(xs), 2)  # noqa: E731
    summary: dict = {
        "prefill_ms": {},
        "ar_ms": {},
        "verify_ms": {},
        "verify_busy_ms": {},
        "interference": {},
        "sd_draft_ms": {},
        "sd_step_ms": {},
        "backup_ms": {},
        "cache_build_ms": {},
    }

    def prefill(n: int, keep: bool, b: int = 1) -> tuple[KVState, float, float]:
        worker.conn.send(("prefill", n, keep, b))  # the draft prefills on its core meanwhile
        state = KVState(target, b, torch.device("cpu"))
        t0 = time.perf_counter()
        state.extend(torch.tensor([ids[:n]] * b, dtype=torch.long), logits_to_keep=1)
        target_ms = (time.perf_counter() - t0) * 1e3
        return state, target_ms, _ms(worker.recv())[0]

    points = prefill_points(contexts, args.batch)
    # Warm-up at the first timed point's own shape: the first forwards of a process are slow, and a warm-up at
    # K + 1 tokens left the first timed prefill ~29% dear (2-core EPYC, 2026-12-01), bending the prefill fit's
    # intercept.
    prefill(points[0][1], keep=False, b=points[0][0])
    for i, (b, n) in enumerate(points, 1):  # the longest at batch 1 last: it is kept as the base
        state, target_ms, draft_ms = prefill(n, keep=(b, n) == (1, max(contexts)), b=b)
        if (b, n) == (1, max(contexts)):
            base = state
        records.append(_prefill_record(b, n, target_ms, draft_ms))
        summary["prefill_ms"][f"{b}x{n}"] = {"target": round(target_ms, 1), "draft": round(draft_ms, 1)}
        # a line each: on an AVX2-only host the batch-8 prefills take 24-43 s apiece (200 s in all, 2026-12-03)
        say(f"prefilled {b} x {n} tokens, target and draft ({i} of {len(points)})")
    rounds = TargetRounds(target, ids, K, widths=verify_widths(K), temperature=getattr(args, "temperature", 0.0))
    warm_builds = WARM_BUILDS
    alone_builds = ALONE_BUILDS if getattr(args, "builds_alone", False) else 0
    timed = rounds.step  # one round of the engine's decode loop: T = 1 the AR step, T = K+1 the verify

    points_started, points_done, n_points = time.perf_counter(), 0, len(contexts) * len(args.batch)
    for c in contexts:
        base.rollback(base.lengths - c)
        if worker.ask("context", c) != c:
            raise RuntimeError(f"the draft worker could not roll its cache back to {c} tokens")
        for b in args.batch:
            key = f"{b}x{c}"
            rounds.batch(base, b)
            timed(K + 1)  # warm-up at this shape, not recorded
            ar, alone = [], []
            for _ in range(reps):
                ar += _ms([timed(1)])
                alone += _ms([timed(K + 1)])
            sd = _ms(worker.ask("sd", b, reps))
            # One draft step too, first feeding one token a row, then two, as SD's first step does after a
            # round that accepted all K (x_K and the bonus). With two lengths the fit tells a proposal's own
            # cost from its steps'; with two widths, a step's cost per row from its fixed cost even at batch 1.
            # The int4 pair's SD step took 29.5 ms at width 1 and 35.3 at width 2 (its Spec-Bench run of
            # 2026-12-02, reports/2026-12-cpu-lowbit-vs-llamacpp):
            # fitted from width 1 alone, SD at K 1 came out 7-9% fast, and leveling to it put every draft
            # forward (builds and backups too) ~18% dear.
            one = _ms(worker.ask("sd", b, reps, 1, 1))
            wide = _ms(worker.ask("sd", b, reps, 1, 2))
            two = _ms([timed(2) for _ in range(2 * reps)])  # their verifies (2 tokens a row), for the records
            backup = _ms(worker.ask("backup", b, max(1, reps - 1)))
            records += [_record("ar", K, b, c, t) for t in ar]
            records += [_record("sd", K, b, c, v, d, first_width=1) for v, d in zip(alone, sd, strict=True)]
            records += [_record("sd", 1, b, c, v, d, first_width=1) for v, d in zip(two[:reps], one, strict=True)]
            records += [_record("sd", 1, b, c, v, d, first_width=2) for v, d in zip(two[reps:], wide, strict=True)]
            if b == 1:  # the verify at other widths: at batch 1 it is not a line in the rows (simulator.fit)
                for w in verify_widths(K):
                    if w not in (2, K + 1):  # width 2 is timed above, with the one-step proposal
                        records += [_record("sd", w - 1, b, c, t) for t in _ms([timed(w) for _ in range(reps)])]
            summary["ar_ms"][key], summary["verify_ms"][key] = med(ar), med(alone)
            summary["sd_draft_ms"][key], summary["backup_ms"][key] = med(sd), med(backup)
            summary["sd_step_ms"][key] = {"width_1": med(one), "width_2": med(wide)}
            busy_all: list[float] = []
            ratios: list[float] = []
            for B in args.budget:
                hits = dict(hit=[True] * b, branches=b * B, backup=None, wait_ms=0.0, fanout=_fanout(K, B))
                builds, lone = [], []
                for _ in range(warm_builds):  # untimed, once: a worker's first build runs slow
                    worker.ask("build", b, B)
                    worker.recv()
                warm_builds = 0
                for i in range(reps):  # in turn: the verify alone, then next to one build, then a build alone
                    single = _ms([timed(K + 1)])[0]
                    worker.conn.send(("build", b, B))
                    worker.recv()  # ("started", t): the build is under way
                    # One verify beside it, then wait for it, as an SSD round runs them. Verifying on until
                    # the build ended would keep the target busy through builds the engine finishes
                    # alone: the int4 pair's one-branch build took 115-202 ms that way, 123 (median) in the engine.
                    verify = _ms([timed(K + 1)])[0]
                    builds += _ms(worker.recv())
                    busy_all.append(verify)
                    ratios.append(verify / single)
                    records.append(_record("sd", K, b, c, single))  # the verify alone, taken between the builds
                    records.append(_record("ssd", K, b, c, verify, cache_build_ms=round(builds[-1], 3), **hits))
                    if i < alone_builds:  # the build with the target idle: the fit's build line (simulator.fit)
                        worker.ask("build", b, B)
                        lone += _ms(worker.recv())
                        records.append(
                            _record("ssd", K, b, c, 0.0, cache_build_ms=round(lone[-1], 3), level="alone", **hits)
                        )
                summary["cache_build_ms"][f"{key}x{b * B}"] = med(builds)
                if lone:
                    summary.setdefault("cache_build_alone_ms", {})[f"{key}x{b * B}"] = med(lone)
            # the backup's own time: an SSD round whose every row missed (the worker drafts the whole batch)
            B0 = args.budget[0]
            miss = dict(hit=[False] * b, branches=b * B0, backup="neural", fanout=_fanout(K, B0), cache_build_ms=0.0)
            records += [
                _record(
                    "ssd", K, b, c, busy_all[i % len(busy_all)], t, wait_ms=round(t, 3), backup_ms=round(t, 3), **miss
                )
                for i, t in enumerate(backup)
            ]
            summary["verify_busy_ms"][key] = med(busy_all)
            summary["interference"][key] = round(statistics.median(ratios), 3)  # of pairs a few seconds apart
            points_done += 1
            say(
                f"context {c}, batch {b}: verify {med(alone)} ms alone, {med(busy_all)} ms next to the builds"
                + _time_left(time.perf_counter() - points_started, points_done, n_points)
            )
    factors = list(summary["interference"].values())
    summary["interference_factor"] = round(statistics.median(factors), 3)
    return records, summary


def _time_left(elapsed_s: float, done: int, total: int) -> str:
    """The progress line's tail: the points left and their time at the pace so far (a point's cost grows with
    its batch and context, so this is a rough guide; a slow host is told early what it is in for)."""
    if done >= total:
        return ""
    left_s = elapsed_s / done * (total - done)
    return (
        f"; point {done} of {total}, about {left_s / 60:.0f} min left at this pace (fewer --context, --batch, "
        f"--budget or --repeats take less)"
        if left_s >= 90
        else f"; point {done} of {total}"
    )


LINK_SPEC = dict(K=1, fanout=(1, 1))  # the link rounds' SSD: its builds (two branches, one step) fit in a verify


def _engine_ssd(
    args, config, llm, spec, batches: list[list[list[int]]], tokens: int, warmup: int = 0
) -> list[list[dict]]:
    """Per batch of prompts, the decode rounds (JSONL dicts) of the engine's own SSD with `spec`, `tokens` new
    tokens a prompt, one draft worker for all; its prefills are not calibrated ones. `warmup` > 0: first that many
    tokens on the first batch, not kept (a fresh worker's first builds run slow). The draft worker is started as
    SSD starts it, with `llm`'s target; torch's thread count is restored after (the engine sets its own)."""
    import torch

    from engine import LLM
    from engine.sampling_params import SamplingParams

    threads = torch.get_num_threads()
    try:
        with LLM(
            llm.target,
            str(args.draft),
            strategy="ssd",
            speculative=spec,
            tokenizer=llm.tokenizer,
            dtype=args.dtype,
            draft_quant=config.draft_quant,
            cache_dir=args.cache,
        ) as ssd:

            def sampling(n: int) -> SamplingParams:
                return SamplingParams(temperature=args.temperature, max_new_tokens=n, stop_on_eos=False, seed=0)

            if warmup:
                ssd.generate(batches[0], sampling(warmup))
            runs = [ssd.generate(prompts, sampling(tokens)) for prompts in batches]
    finally:
        torch.set_num_threads(threads)
    rounds = [[json.loads(r.to_json()) for r in generation.metrics.rounds] for generation in runs]
    return [[r for r in run if r.get("phase", "decode") == "decode"] for run in rounds]


def link_rounds(args, config, llm, prompt: list[int]) -> tuple[list[dict], dict]:
    """The engine's own SSD decode rounds (JSONL dicts) on `prompt` and what they say of the link: the median wait of
    the rounds `simulator.fit.link_waits` counts (every row hit, the build inside the verify: the target waited
    for the link and the worker's answer only; the fit halves it, a message each way)."""
    from engine.config import DraftPlacement, SpeculativeConfig
    from simulator.fit import link_waits
    from simulator.records import parse_record

    spec = SpeculativeConfig(**LINK_SPEC, placement=DraftPlacement(draft_threads=args.draft_threads))
    (decode,) = _engine_ssd(args, config, llm, spec, [[prompt]], args.link_tokens)
    waits = link_waits([parse_record(r, "the link rounds") for r in decode])  # the rule the fit's link uses
    return decode, {
        "rounds": len(decode),
        "hits_timed": len(waits),
        "hit_wait_ms": round(statistics.median(waits), 3) if waits else None,
        "verify_ms": round(statistics.median(r["verify_ms"] for r in decode), 2) if decode else None,
        "spec": {"K": LINK_SPEC["K"], "fanout": list(LINK_SPEC["fanout"])},
    }


def level_budget(budgets: list[int]) -> int:
    """The budget the build-level rounds run at: the middle one of --budget (the lower of the two middle ones)."""
    ordered = sorted(set(budgets))
    return ordered[(len(ordered) - 1) // 2]


BUILD_WARMUP_TOKENS = 8  # generated first and not kept: a fresh worker's first builds run slow (WARM_BUILDS)


def build_rounds(args, config, llm, prompt: list[int]) -> tuple[list[dict], dict]:
    """The engine's own SSD at the calibration's K, `level_budget` branches a row (uniform fan-out, neural backup)
    and each --batch size, --build-tokens new tokens a row: its decode rounds (JSONL dicts marked level "build")
    and their build times by batch size. Their builds are the engine's, of the shapes the workload runs; the fit
    measures them against its build line (`simulator.fit`: build_level, applied only on request). One draft
    worker runs every batch size, after a few tokens not kept. A batch's rows are the prompt less 0, 1, 2, ... of
    its last tokens (never less than one token), so that they differ in length as a real batch's do."""
    from engine.config import DraftPlacement, FanoutSchedule, SpeculativeConfig
    from simulator.fit import own_batch_builds
    from simulator.records import parse_record
    from theory.glossary import Backup

    budget = level_budget(args.budget)
    spec = SpeculativeConfig(
        K=args.K,
        schedule=FanoutSchedule.UNIFORM,
        budget=budget,
        backup=Backup.NEURAL,
        placement=DraftPlacement(draft_threads=args.draft_threads),
    )
    batches = sorted(set(args.batch))
    prompts = [[prompt[: max(1, len(prompt) - i)] for i in range(b)] for b in batches]
    runs = _engine_ssd(args, config, llm, spec, prompts, args.build_tokens, warmup=BUILD_WARMUP_TOKENS)
    records = [dict(r, level="build") for run in runs for r in run]
    # by the rounds' batch size, as the fit measures them (a row that finished first leaves the batch)
    own = own_batch_builds([parse_record(r, "the build rounds") for r in records])
    builds = {
        str(b): round(statistics.median(r.cache_build_ms for r in own[b]), 2) if b in own else None for b in batches
    }
    return records, {
        "K": args.K,
        "budget": budget,
        "tokens": args.build_tokens,
        "rounds": len(records),
        "build_ms": builds,
    }


def fit_summary(path: Path) -> dict:
    """The timing fit of these records (simulator.fit_timing): coefficients, relative RMS errors, and its
    predictions at batch 4, context 300 (K 4, 32 and 64 branches) to compare with a run at that shape."""
    from simulator import fit_timing, read_records

    f = fit_timing(read_records(path))
    r = lambda x: round(float(x), 5)  # noqa: E731
    ssd = f.for_strategy("ssd")
    return {
        "verify": [r(c) for c in f.verify],
        "verify_knee": [r(c) for c in f.verify_knee] if f.verify_knee else None,
        "decode": [r(c) for c in f.decode] if f.decode else None,
        "decode_one_row": [r(c) for c in f.decode_one_row] if f.decode_one_row else None,
        "decode_knee": [r(c) for c in f.decode_knee] if f.decode_knee else None,
        "backup": [r(c) for c in f.backup] if f.backup else None,
        "prefill_attention": [r(c) for c in f.prefill_attention],
        "prefill_target": [r(c) for c in f.prefill_target] if f.prefill_target else None,
        "prefill_draft": [r(c) for c in f.prefill_draft] if f.prefill_draft else None,
        "draft": [r(c) for c in f.draft] if f.draft else None,
        "draft_call": r(f.draft_call),
        "link_latency_ms": r(f.link_latency_ms),
        "overhead_ms": {k: r(v) for k, v in f.overhead.items()},
        "build": [r(c) for c in f.build] if f.build else None,
        "ssd_verify_factor": r(f.ssd_verify_factor),
        "build_beside": r(f.build_beside),
        "errors": {k: r(v) for k, v in f.errors.items()},
        "at_b4_c300_K4_ms": {
            "verify": r(f.verify_ms(4, 5, 300)),
            "verify_ssd": r(ssd.verify_ms(4, 5, 300)),
            "sd_draft": r(f.draft_ms(4, 4, 300)) if f.draft else None,
            "build_32": r(f.cache_build_ms(4, 4, 32, 300)) if f.draft else None,
            "build_64": r(f.cache_build_ms(4, 4, 64, 300)) if f.draft else None,
        },
        "build_level": [[b, r(x)] for b, x in f.build_level],
    }

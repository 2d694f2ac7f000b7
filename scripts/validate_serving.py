"""Served runs, predicted: replay each load point of a `saguaro bench --url` run in the simulator and compare its
TTFT and TPOT (p50, p99) with what the client measured.

- the requests: each point's arrival times, prompt and output lengths as the client logged them
  (`simulator.Replayed`), served by a batch of at most --max-num-seqs (the server's setting). A closed-loop
  point (--concurrency N) is simulated as one: a request is sent when one finishes in the simulation, not at
  the time it was sent in the measured run (replayed at those times, a prediction slower than the run made
  the requests of a concurrency-1 point overlap, and each one slowed the next). At concurrency 1 each request
  runs alone, one after the other, with its own lengths; above 1 a `ClosedLoop` of N with the point's
  length ranges (drawn: an approximation);
- timing: `fit_timing` on `saguaro calibrate` records only (with their fast backups); several calibrations make
  one fit over all their records (`saguaro simulate --fit A B`: one before the runs and one after them average
  the machine's drift between them);
- acceptance and hits: an SD bench run's records on the same prompts at the same temperature (the variant at
  batch 1 with the largest K: α per position and the empirical hit model), as in validate_ssd.py;
- the served strategy's settings (K, fan-out, backup) from the server's own round records (--server-rounds);
  nothing else is read from them;
- SSD's joiners: the worker prefills their draft side while the target prefills them (the engine's Prefill
  message); --no-prefill-overlap for servers before it (stop 21's records: it reproduces stop 22's table).
Each point is simulated with --seeds seeds (acceptance and hits are drawn) and the median of each statistic is
the prediction; with few requests per point a p99 is close to the slowest request.

    python scripts/validate_serving.py CLIENT_RUN --calibration CALIB.jsonl --sd-run SD_BENCH_RUN \
        --server-rounds SERVER_ROUNDS.jsonl --max-num-seqs 4 [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from saguaro.commands.simulate import check_same_precision, fit_all
from saguaro.runfolder import RunDir
from simulator import ClosedLoop, Lengths, PerPositionAcceptance, Policy, Replayed, SimConfig, simulate
from simulator.hits import from_records
from simulator.link import LinkSpec
from simulator.records import parse_record, read_records
from theory.glossary import Backup, Strategy
from theory.latency import statistics

METRICS = ("ttft", "tpot")
STATS = ("p50", "p99")
TOLERANCE = 0.15


def client_points(path: Path) -> dict[str, list[dict]]:
    """point name -> the point's requests (those that completed), in arrival order."""
    points: dict[str, list[dict]] = defaultdict(list)
    for line in (path / "requests.jsonl").read_text(encoding="utf-8").splitlines():
        request = json.loads(line)
        if request.get("error") is None and request.get("ttft_s") is not None:
            points[request["point"]].append(request)
    for requests in points.values():
        for r in requests:  # a closed-loop point has no schedule: its requests arrive when sent
            r["arrival_s"] = r["scheduled_s"] if r.get("scheduled_s") is not None else r["sent_s"]
    return {k: sorted(v, key=lambda r: r["arrival_s"]) for k, v in points.items()}


def measured(requests: list[dict]) -> dict[str, float]:
    out = {}
    for metric in METRICS:
        values = [r[f"{metric}_s"] * 1e3 for r in requests if r.get(f"{metric}_s") is not None]
        stats = statistics(values, (50, 99))
        out.update({f"{metric}_{s}": stats[s] for s in STATS})
    return out


def reference_sd(run: Path, temperature: float) -> list:
    """Decode records of the run's SD variant at batch 1 with the largest K, at this temperature."""
    bench = RunDir.open(run)
    settings = {r["key"]: r["settings"] for r in bench.results() if r.get("system") == "sd" and "settings" in r}
    records: dict[str, list] = defaultdict(list)
    for row in bench.rounds():
        if row.get("phase") == "decode" and row["key"] in settings:
            records[row["key"]].append(parse_record(row))
    keys = [k for k, rows in records.items()
            if rows[0].batch_size == 1 and settings[k]["temperature"] == temperature]
    if not keys:
        raise ValueError(f"{run} has no SD variant at batch 1 and temperature {temperature:g}")
    return records[max(keys, key=lambda k: settings[k]["K"])]


def served_policy(path: Path) -> Policy:
    decode = [r for r in read_records(path) if r.is_decode]
    if not decode:
        raise ValueError(f"{path} holds no decode rounds: pass the server's --rounds-out file")
    first = decode[0]
    if first.strategy.value != "ssd":
        return Policy(first.strategy, K=first.K)
    fanouts = {r.fanout for r in decode if r.fanout}
    if len(fanouts) != 1:
        raise ValueError(f"the server used several fan-out schedules ({sorted(fanouts)}): give a run with one")
    return Policy("ssd", K=first.K, fanout=fanouts.pop(), backup=Backup(first.backup or "neural"))


def closed_loop_concurrency(requests: list[dict]) -> int | None:
    """N for a closed-loop point (its requests have no schedule: each was sent when one finished), else None."""
    if any(r.get("scheduled_s") is not None for r in requests):
        return None
    n = requests[0].get("concurrency")
    if n is None or int(n) < 1:
        raise ValueError(f"point {requests[0].get('point')!r} has neither a schedule nor a concurrency: "
                         "give a `saguaro bench --url` run's folder")
    return int(n)


def _stats(result) -> dict[str, float]:
    return {f"{m}_{s}": getattr(result, f"{m}_ms")[s] for m in METRICS for s in STATS}


def predict(timing, policy: Policy, acceptance, hits, requests: list[dict], max_num_seqs: int,
            seeds: int, prefill_overlap: bool = True) -> dict[str, float]:
    concurrency = closed_loop_concurrency(requests)
    prompts = tuple(int(r["prompt_tokens"]) for r in requests)
    outputs = tuple(int(r["new_tokens"]) for r in requests)

    def run(workload, seed: int, limit: int | None = None):
        return simulate(SimConfig(policy=policy, timing=timing, acceptance=acceptance,
                                  hits=hits if policy.strategy.value == "ssd" else None, workload=workload,
                                  link=LinkSpec(latency_ms=getattr(timing, "link_latency_ms", 0.0)), rounds=10**9,
                                  requests=limit, seed=seed, prefill_overlap=prefill_overlap))

    runs = []
    for seed in range(seeds):
        if concurrency == 1:  # one request at a time: each alone in the server, with its own lengths
            alone = [run(Replayed((0.0,), (p,), (o,), max_num_seqs), seed * len(requests) + i)
                     for i, (p, o) in enumerate(zip(prompts, outputs))]
            got = {}
            for metric in METRICS:
                values = [v for a in alone if np.isfinite(v := getattr(a, f"{metric}_ms")["p50"])]
                stats = statistics(values, (50, 99))
                got.update({f"{metric}_{s}": stats[s] for s in STATS})
            runs.append(got)
        elif concurrency is not None:
            workload = ClosedLoop(min(concurrency, max_num_seqs), Lengths(min(prompts), max(prompts)),
                                  Lengths(min(outputs), max(outputs)))
            runs.append(_stats(run(workload, seed, limit=len(requests))))
        else:
            t0 = requests[0]["arrival_s"]
            workload = Replayed(tuple((r["arrival_s"] - t0) * 1e3 for r in requests), prompts, outputs, max_num_seqs)
            runs.append(_stats(run(workload, seed)))
    return {k: float(np.median([r[k] for r in runs])) for k in runs[0]}


def term_table(timing, records) -> list[str]:
    """Markdown rows: per batch size, the served rounds' verify, cache build, neural backup and round against
    what the fit predicts for the same shapes. The round as the per-row policy runs it: max(verify, the build
    that was looked up) + the backup if a row missed."""
    ssd = timing.for_strategy(Strategy.SSD)
    by_batch: dict[int, list] = defaultdict(list)
    for r in records:
        if r.is_decode and r.strategy is Strategy.SSD:
            by_batch[r.batch_size].append(r)

    def cell(pairs: list[tuple[float, float]]) -> str:
        if not pairs:
            return "-"
        m, q = np.median([a for a, _ in pairs]), np.median([b for _, b in pairs])
        return f"{m:.0f} / {q:.0f} ({q / m - 1:+.0%})"

    out = ["| batch | rounds | verify | cache build | neural backup | round (built rounds) |",
           "|---|---|---|---|---|---|"]
    for b, rows in sorted(by_batch.items()):
        verify = lambda r: ssd.verify_ms(b, r.K + 1, r.context_len)  # noqa: E731
        build = lambda r: ssd.cache_build_ms(b, r.K, r.branches, r.context_len)  # noqa: E731
        backup = lambda r: ssd.backup_ms(Backup.NEURAL, b, r.K, r.context_len)  # noqa: E731
        built = [r for r in rows if r.cache_build_ms]
        missed = [r for r in rows if r.backup is Backup.NEURAL and r.backup_time_ms and not all(r.hit)]
        rounds = [(r.round_ms, max(verify(r), build(r)) + (backup(r) if not all(r.hit) else 0.0)) for r in built]
        out.append(f"| {b} | {len(rows)} | {cell([(r.verify_ms, verify(r)) for r in rows])} | "
                   f"{cell([(r.cache_build_ms, build(r)) for r in built])} | "
                   f"{cell([(r.backup_time_ms, backup(r)) for r in missed])} | {cell(rounds)} |")
    shapes: dict[tuple[int, int], list[float]] = defaultdict(list)
    for r in records:
        if not r.is_decode:
            shapes[(r.batch_size, r.tokens)].append(r.verify_ms)
    out += ["", "| prefill: batch × tokens (prefills) | measured (median) | predicted |", "|---|---|---|"]
    for (b, n), ms in sorted(shapes.items()):
        m, want = float(np.median(ms)), ssd.prefill_ms(Strategy.SSD, b, n)
        out.append(f"| {b} × {n} ({len(ms)}) | {m:.0f} | {want:.0f} ({want / m - 1:+.0%}) |")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("client_runs", type=Path, nargs="+", help="saguaro bench --url run folders")
    p.add_argument("--calibration", type=Path, nargs="+", required=True,
                   help="saguaro calibrate records; several: one fit over all of them")
    p.add_argument("--sd-run", type=Path, required=True, help="saguaro bench run with an SD variant at batch 1")
    p.add_argument("--server-rounds", type=Path, required=True, help="the server's --rounds-out records")
    p.add_argument("--max-num-seqs", type=int, required=True, help="the server's --max-num-seqs")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--no-level", action="store_true",
                   help="the calibration's level as it is (default: leveled to the SD run's rounds)")
    p.add_argument("--json", type=Path)
    p.add_argument("--no-prefill-overlap", dest="prefill_overlap", action="store_false",
                   help="the server predates SSD's Prefill message (its worker prefilled joiners after the target)")
    p.add_argument("--terms", action="store_true",
                   help="also compare the server's rounds, term by term, with the fit (median per batch size)")
    p.add_argument("--build-level", action="store_true",
                   help="scale the fit's builds to the calibration's engine build rounds (saguaro calibrate "
                        "--build-tokens): an experiment, worse on stop 32's runs (simulator.fit)")
    args = p.parse_args(argv)
    try:
        check_same_precision(args.calibration, [args.sd_run])
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    timing = fit_all([str(path) for path in args.calibration])
    if args.build_level:
        try:
            timing = timing.with_build_level()
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    sd_rows = reference_sd(args.sd_run, args.temperature)
    if not args.no_level:
        timing = timing.leveled(sd_rows)
        print(f"level from {args.sd_run.name}: {timing.level_text()}", file=sys.stderr)
    hits = from_records(sd_rows)
    acceptance = PerPositionAcceptance(tuple(float(a) for a in hits.meta["alpha"]))
    policy = served_policy(args.server_rounds)
    rows = []
    for run in args.client_runs:
        for point, requests in client_points(run).items():
            got = measured(requests)
            want = predict(timing, policy, acceptance, hits, requests, args.max_num_seqs, args.seeds,
                           args.prefill_overlap)
            rows.append({"run": run.name, "point": point, "requests": len(requests), "measured": got,
                         "predicted": want, "error": {k: want[k] / got[k] - 1 for k in got}})
    cols = [f"{m}_{s}" for m in METRICS for s in STATS]
    print("| point | requests | " + " | ".join(f"{c} measured / predicted (ms)" for c in cols) + " |")
    print("|---|---|" + "---|" * len(cols))
    for r in rows:
        cells = [f"{r['measured'][c]:.0f} / {r['predicted'][c]:.0f} ({r['error'][c]:+.0%})" for c in cols]
        print(f"| {r['point']} | {r['requests']} | " + " | ".join(cells) + " |")
    errors = [abs(e) for r in rows for e in r["error"].values()]
    print(f"\n{sum(e <= TOLERANCE for e in errors)} of {len(errors)} figures within {TOLERANCE:.0%}; "
          f"median |error| {np.median(errors):.1%}; policy {policy.strategy.value} K={policy.K}"
          + (f" F={'-'.join(map(str, policy.fanout))} {policy.backup.value}" if policy.fanout else "")
          + f"; ssd_verify_factor {timing.ssd_verify_factor:.3f}"
          + (f"; {timing.build_level_text()}" if timing.build_level else ""))
    if args.terms:
        print("\nThe server's rounds against the fit, median per batch size (ms, measured / predicted):\n")
        print("\n".join(term_table(timing, read_records(args.server_rounds))))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "policy": str(policy), "levels": timing.levels,
                                         "build_level": timing.build_level,
                                         "build_level_applied": bool(timing.build_scale)}, indent=1)
                             + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

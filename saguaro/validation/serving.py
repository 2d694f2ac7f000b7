"""Served runs, predicted (`saguaro validate serving`): replay each load point of a `saguaro bench --url` run in
the simulator and compare its TTFT and TPOT (p50, p99) with what the client measured.

- the requests: each point's arrival times, prompt and output lengths as the client logged them
  (`simulator.Replayed`), served by a batch of at most `max_num_seqs` (the server's setting). A closed-loop
  point (--concurrency N) is simulated as one: a request is sent when one finishes in the simulation, not at
  the time it was sent in the measured run (replayed at those times, a prediction slower than the run made
  the requests of a concurrency-1 point overlap, and each one slowed the next). At concurrency 1 each request
  runs alone, one after the other, with its own lengths; above 1 a `ClosedLoop` of N with the point's length
  ranges (drawn: an approximation);
- timing: `fit_timing` on `saguaro calibrate` records only (with their fast backups); several calibrations make
  one fit over all their records (`saguaro simulate --fit A B`: one before the runs and one after them average
  the machine's drift between them);
- acceptance and hits: an SD bench run's records on the same prompts at the same temperature (the variant at
  batch 1 with the largest K: α per position and the empirical hit model), as `saguaro validate engine`;
- the served strategy's settings (K, fan-out, backup) from the server's own round records (`server_rounds`);
  nothing else is read from them;
- SSD's joiners: the worker prefills their draft side while the target prefills them (the engine's Prefill
  message); `prefill_overlap=False` for servers that predate it.
Each point is simulated with `seeds` seeds (acceptance and hits are drawn) and the median of each statistic is
the prediction; with few requests per point a p99 is close to the slowest request.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from saguaro.bench.runfolder import RunDir
from saguaro.calibration.files import check_same_precision, fit_all
from simulator import ClosedLoop, Lengths, PerPositionAcceptance, Policy, Replayed, SimConfig, simulate
from simulator.hits import from_records
from simulator.link import LinkSpec
from simulator.records import parse_record, read_records
from theory.glossary import Backup
from theory.latency import statistics

log = logging.getLogger(__name__)

METRICS = ("ttft", "tpot")
STATS = ("p50", "p99")
TOLERANCE = 0.15  # a served figure is "within" when off by at most this share


@dataclass(frozen=True)
class ServedValidation:
    """One row per load point (`rows`, the JSON's), the served policy and the (leveled) timing it was
    predicted with."""

    rows: list[dict]
    policy: Policy
    timing: object

    def errors(self) -> list[float]:
        """Every point's relative error of every figure (TTFT and TPOT, p50 and p99)."""
        return [e for r in self.rows for e in r["error"].values()]

    def to_json(self) -> dict:
        return {
            "rows": self.rows,
            "policy": str(self.policy),
            "levels": self.timing.levels,
            "build_level": self.timing.build_level,
            "build_level_applied": bool(self.timing.build_scale),
        }


def client_points(path: Path) -> dict[str, list[dict]]:
    """point name -> the point's requests (those that completed), in arrival order."""
    points: dict[str, list[dict]] = defaultdict(list)
    requests = Path(path) / "requests.jsonl"
    if not requests.is_file():
        raise ValueError(f"{path} has no requests.jsonl: give the folder of a `saguaro bench --url` run")
    for line in requests.read_text(encoding="utf-8").splitlines():
        request = json.loads(line)
        if request.get("error") is None and request.get("ttft_s") is not None:
            points[request["point"]].append(request)
    for rows in points.values():
        for r in rows:  # a closed-loop point has no schedule: its requests arrive when sent
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
    keys = [k for k, rows in records.items() if rows[0].batch_size == 1 and settings[k]["temperature"] == temperature]
    if not keys:
        raise ValueError(
            f"{run} has no SD variant at batch 1 and temperature {temperature:g}: give an SD bench "
            "run of the served prompts, e.g. saguaro bench --systems sd -K 5"
        )
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
        raise ValueError(
            f"point {requests[0].get('point')!r} has neither a schedule nor a concurrency: "
            "give a `saguaro bench --url` run's folder"
        )
    return int(n)


def _stats(result) -> dict[str, float]:
    return {f"{m}_{s}": getattr(result, f"{m}_ms")[s] for m in METRICS for s in STATS}


def predict(
    timing,
    policy: Policy,
    acceptance,
    hits,
    requests: list[dict],
    max_num_seqs: int,
    seeds: int,
    prefill_overlap: bool = True,
) -> dict[str, float]:
    concurrency = closed_loop_concurrency(requests)
    prompts = tuple(int(r["prompt_tokens"]) for r in requests)
    outputs = tuple(int(r["new_tokens"]) for r in requests)

    def run(workload, seed: int, limit: int | None = None):
        return simulate(
            SimConfig(
                policy=policy,
                timing=timing,
                acceptance=acceptance,
                hits=hits if policy.strategy.value == "ssd" else None,
                workload=workload,
                link=LinkSpec(latency_ms=getattr(timing, "link_latency_ms", 0.0)),
                rounds=10**9,
                requests=limit,
                seed=seed,
                prefill_overlap=prefill_overlap,
            )
        )

    runs = []
    for seed in range(seeds):
        if concurrency == 1:  # one request at a time: each alone in the server, with its own lengths
            alone = [
                run(Replayed((0.0,), (p,), (o,), max_num_seqs), seed * len(requests) + i)
                for i, (p, o) in enumerate(zip(prompts, outputs, strict=True))
            ]
            got = {}
            for metric in METRICS:
                values = [v for a in alone if np.isfinite(v := getattr(a, f"{metric}_ms")["p50"])]
                stats = statistics(values, (50, 99))
                got.update({f"{metric}_{s}": stats[s] for s in STATS})
            runs.append(got)
        elif concurrency is not None:
            workload = ClosedLoop(
                min(concurrency, max_num_seqs), Lengths(min(prompts), max(prompts)), Lengths(min(outputs), max(outputs))
            )
            runs.append(_stats(run(workload, seed, limit=len(requests))))
        else:
            t0 = requests[0]["arrival_s"]
            workload = Replayed(tuple((r["arrival_s"] - t0) * 1e3 for r in requests), prompts, outputs, max_num_seqs)
            runs.append(_stats(run(workload, seed)))
    return {k: float(np.median([r[k] for r in runs])) for k in runs[0]}


def validate_served(
    client_runs: list[Path],
    calibrations: list[Path],
    sd_run: Path,
    server_rounds: Path,
    max_num_seqs: int,
    temperature: float = 0.0,
    seeds: int = 20,
    level: bool = True,
    prefill_overlap: bool = True,
    build_level: bool = False,
) -> ServedValidation:
    """Every load point of `client_runs` predicted; ValueError (what to do) on a calibration of another precision
    than the SD run, an SD run without a batch-1 SD variant at `temperature`, or server rounds that say no one
    policy. `build_level`: scale the fit's builds to the calibration's engine build rounds, an experiment."""
    if max_num_seqs < 1 or seeds < 1:
        raise ValueError(f"--max-num-seqs and --seeds must be at least 1, got {max_num_seqs} and {seeds}")
    calibrations = [Path(p) for p in calibrations]
    check_same_precision(calibrations, [Path(sd_run)])
    timing = fit_all([str(path) for path in calibrations])
    if build_level:
        timing = timing.with_build_level()
    sd_rows = reference_sd(Path(sd_run), temperature)
    if level:
        timing = timing.leveled(sd_rows)
        log.info("level from %s: %s", Path(sd_run).name, timing.level_text())
    hits = from_records(sd_rows)
    acceptance = PerPositionAcceptance(tuple(float(a) for a in hits.meta["alpha"]))
    policy = served_policy(Path(server_rounds))
    rows = []
    for run in client_runs:
        for point, requests in client_points(Path(run)).items():
            got = measured(requests)
            want = predict(timing, policy, acceptance, hits, requests, max_num_seqs, seeds, prefill_overlap)
            rows.append(
                {
                    "run": Path(run).name,
                    "point": point,
                    "requests": len(requests),
                    "measured": got,
                    "predicted": want,
                    "error": {k: want[k] / got[k] - 1 for k in got},
                }
            )
    return ServedValidation(rows=rows, policy=policy, timing=timing)

"""Drafter-invariant sampling against rejection sampling on one pair: the acceptance each coupling allows, beside
what `saguaro bench --sampling-mode standard invariant` measured.

For bench run folders (SD and SSD at T > 0 in both modes), each SD text the run emitted (prompt + continuation,
a sample of the target's p in either mode) is scored by target and draft in one forward each, loaded as the run
loaded them (its config.json: dtype, --draft-int8, ...). At every continuation position, with p and q warped as
the engine warps them at the run's temperature (engine.sampling.warp):

- 1 − TV(p, q): the acceptance probability of rejection sampling (standard α's expectation);
- (1 − TV)/(1 + TV): the floor on a shared-noise coupling's (Daliri, Musco & Suresh, arXiv 2408.07978);
- the race agreement: the probability that the draft's race winner is the target's (engine.invariant), over
  `--draws` keyed seeds, with the draft racing over its DRAFT_TOP most probable tokens as the engine does. The
  target races over its `TARGET_TOP` most probable tokens, q's racers and one more entry that stands for all
  the others (the least of independent exponentials of rates p_i is exponential of rate Σ p_i), so the
  agreement is the engine's in distribution, not an approximation of its tail.

Each is averaged over positions, pooled over the prompts, per run, temperature and mode (whose texts they were).
The measured columns come from the runs' summary.json (α as `saguaro report` estimates it, SSD's hit rate,
decode tokens/s and tokens/s with the prefill), with 90% intervals for invariant against standard: the prompts
resampled with replacement, in pairs. Decode tokens/s is the fair speed here: variants that share an engine
share its prompt-prefix cache, so in an interleaved run only the first of them to meet a prompt pays its prefill.
`--texts` lists, per run, temperature and mode, the prompts on which every system of the run emitted the same
tokens, and on how many SD's and SSD's agree (invariant: AR, SD and SSD all alike; standard at a fixed K: SD and
SSD alike, AR apart); it is printed in every case, and alone (no models loaded) with `--texts`.

    python -m benchmarks.coupling_bound RUN_DIR ... --json bound.json --markdown table.md
    python -m benchmarks.coupling_bound RUN_DIR --texts       # the same-text check only
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from engine import SamplingParams
from engine.invariant import DRAFT_TOP, race
from engine.keyed_random import token_uniforms
from engine.sampling import warp

TARGET_TOP = 1024  # the target's racers besides q's and the rest
BOOTSTRAP = 2000
LEVEL = 0.90
MODES = ("standard", "invariant")


def total_variation(p: Tensor, q: Tensor) -> Tensor:
    """½ Σ |p − q| over the last dim: [..., V] -> [...]."""
    return 0.5 * (p - q).abs().sum(-1)


def invariant_floor(tv: Tensor) -> Tensor:
    """(1 − TV)/(1 + TV): the least probability a shared-noise coupling gives to draft and target agreeing."""
    return (1 - tv) / (1 + tv)


def race_winners(
    p: Tensor, q: Tensor, positions: Tensor, draws: int, target_top: int = TARGET_TOP, draft_top: int = DRAFT_TOP
) -> tuple[Tensor, Tensor]:
    """The target's and the draft's race winners (engine.invariant) under keyed seeds 1..draws at each position:
    p, q [n, V], positions [n] (int64) -> (target [D, n], draft [D, n]). The draft races over its `draft_top`
    most probable tokens, as engine.invariant.draft_winners does; the target over its `target_top` most probable,
    the draft's racers and one entry for all other tokens (id V), whose race is exact in distribution."""
    n, V = p.shape
    q_mass, q_ids = torch.topk(q, min(draft_top, V), dim=-1)  # [n, Mq]
    marked = p.clone().scatter_(-1, q_ids, 2.0)  # q's racers first (2 > any probability), then p's most probable
    ids = torch.topk(marked, min(target_top + q_ids.shape[-1], V), dim=-1).indices  # [n, M]
    p_mass = p.gather(-1, ids)  # [n, M]
    rest = (1 - p_mass.sum(-1, keepdim=True)).clamp_min(0)  # [n, 1]: every other token as one racer
    if ids.shape[-1] == V:
        rest.zero_()  # nothing else is left: what 1 − Σ p shows is rounding
    p_ids = torch.cat([ids, torch.full((n, 1), V, dtype=ids.dtype)], -1)  # [n, M+1]; id V keys the rest's uniform
    p_mass = torch.cat([p_mass, rest], -1)  # [n, M+1]
    seeds = torch.arange(1, draws + 1, dtype=torch.int64)  # [D]
    at = positions[None, :].expand(draws, n)  # [D, n]
    u_p = token_uniforms(seeds, at, V, p_ids[None].expand(draws, -1, -1))  # [D, n, M+1]
    u_q = token_uniforms(seeds, at, V, q_ids[None].expand(draws, -1, -1))  # [D, n, Mq]
    target = p_ids.expand(draws, -1, -1).gather(-1, race(p_mass.expand(draws, -1, -1), u_p)[..., None])[..., 0]
    draft = q_ids.expand(draws, -1, -1).gather(-1, race(q_mass.expand(draws, -1, -1), u_q)[..., None])[..., 0]
    return target, draft


def race_agreement(p: Tensor, q: Tensor, positions: Tensor, draws: int) -> Tensor:
    """Per position, the share of `draws` keyed seeds under which the draft's race winner is the target's: [n]."""
    target, draft = race_winners(p, q, positions, draws)
    return (target == draft).double().mean(0)


@torch.inference_mode()
def position_stats(
    target, draft, prompt: list[int], continuation: list[int], temperature: float, draws: int
) -> dict[str, Tensor]:
    """1 − TV, the floor and the race agreement at each continuation position ([M] each), teacher-forced."""
    from benchmarks.lowbit_accuracy import continuation_logprobs

    params = SamplingParams(temperature=temperature)
    p = warp(continuation_logprobs(target, prompt, continuation), params)  # [M, V]
    q = warp(continuation_logprobs(draft, prompt, continuation), params)  # [M, V]
    V = min(p.shape[-1], q.shape[-1])  # a padded head's extra rows have no mass
    p, q = p[:, :V], q[:, :V]
    tv = total_variation(p, q)
    positions = torch.arange(len(prompt), len(prompt) + len(continuation), dtype=torch.int64)
    return {"accept": 1 - tv, "floor": invariant_floor(tv), "race": race_agreement(p, q, positions, draws)}


def _results(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines() if line.strip()]


def _mode(result: dict) -> str:
    return result["settings"].get("sampling_mode") or "standard"


def bound(runs: list[Path], draws: int, system: str = "sd", log=print) -> list[dict]:
    """One row per run, temperature and mode: positions and the means of 1 − TV, the floor and the agreement
    over the texts `system` emitted."""
    from engine.prompt_input import encode_text
    from saguaro.bench.config import BenchConfig
    from saguaro.bench.runfolder import RunDir
    from saguaro.bench.systems import Models

    rows, loaded = [], {}
    for run in runs:
        config = BenchConfig.from_dict(json.loads((run / "config.json").read_text()))
        recipe = (
            config.target,
            config.draft,
            config.dtype,
            config.draft_dtype,
            config.draft_int8,
            config.draft_quant,
            config.target_quant,
        )
        if recipe not in loaded:
            loaded.clear()
            loaded[recipe] = Models.load(config)
        models = loaded[recipe]
        prompts = {p.id: p for p in RunDir(run).prompts() or ()}
        stats: dict[tuple, dict[str, list[Tensor]]] = defaultdict(lambda: defaultdict(list))
        for r in _results(run):
            T = r["settings"]["temperature"]
            if r["system"] != system or r.get("error") or T == 0:
                continue
            ids = encode_text(models.tokenizer, prompts[r["prompt_id"]].text, True)
            if len(ids) != r["prompt_tokens"]:
                raise ValueError(
                    f"{run}: prompt {r['prompt_id']} encodes to {len(ids)} tokens, the run's to "
                    f"{r['prompt_tokens']}: a different tokenizer or chat template"
                )
            for name, values in position_stats(models.target, models.draft, ids, r["token_ids"], T, draws).items():
                stats[(T, _mode(r))][name].append(values)
            log(f"{run.name}: {r['key']} {r['prompt_id']} scored")
        for (T, mode), s in sorted(stats.items()):
            pooled = {name: torch.cat(v) for name, v in s.items()}
            rows.append(
                {
                    "run": run.name,
                    "prompts": config.prompts,
                    "temperature": T,
                    "mode": mode,
                    "positions": int(pooled["accept"].numel()),
                    **{f"mean_{name}": float(v.mean()) for name, v in pooled.items()},
                }
            )
    return rows


def _per_prompt(run: Path, key: str) -> dict[str, tuple[float, ...]]:
    """prompt id -> (accepted, rejections, decode tokens, decode s, tokens, wall s) of one variant (batch 1: a call
    is a prompt): α's counts as saguaro.reporting.analysis.rounds.alpha_rounds takes them, the decode rounds'
    tokens and time, and the call's."""
    from saguaro.reporting.analysis.load import load_run
    from saguaro.reporting.analysis.rounds import decode

    loaded = load_run(run)
    calls = {r["batch_index"]: r for r in loaded.results if r["key"] == key and not r.get("error")}
    out = {}
    for (k, index), rounds in loaded.rounds_by_unit().items():
        if k != key or index not in calls:
            continue
        accepted = rejections = tokens = ms = 0
        for rnd in decode(rounds):
            K = rnd.get("K") or 0
            for a in rnd["accepted"] if K else ():
                accepted += int(a)
                rejections += int(a) < K
            tokens += sum(rnd["emitted"])
            ms += rnd["round_ms"]
        r = calls[index]
        out[r["prompt_id"]] = (accepted, rejections, tokens, ms / 1e3, r["new_tokens"], r["wall_s"])
    return out


def paired(run: Path, standard: str, invariant: str, seed: int = 0) -> dict:
    """LEVEL intervals of α(invariant) − α(standard), and of invariant's decode tokens/s and tokens/s (with the
    prefill) over standard's, the prompts resampled with replacement in pairs."""
    s, i = _per_prompt(run, standard), _per_prompt(run, invariant)
    prompts = sorted(set(s) & set(i))
    a, b = np.array([s[p] for p in prompts], float), np.array([i[p] for p in prompts], float)  # [n, 6]
    picks = np.random.default_rng(seed).integers(0, len(prompts), size=(BOOTSTRAP, len(prompts)))
    A, B = a[picks].sum(1), b[picks].sum(1)  # [draws, 6]
    stats = {
        "d_alpha": B[:, 0] / (B[:, 0] + B[:, 1]) - A[:, 0] / (A[:, 0] + A[:, 1]),
        "decode_ratio": (B[:, 2] / B[:, 3]) / (A[:, 2] / A[:, 3]),
        "speed_ratio": (B[:, 4] / B[:, 5]) / (A[:, 4] / A[:, 5]),
    }
    tail = (1 - LEVEL) / 2
    out = {}
    for name, values in stats.items():
        out[f"{name}_low"], out[f"{name}_high"] = map(float, np.quantile(values, [tail, 1 - tail]))
    return out


def hit_rates_by_outcome(run: Path, key: str) -> dict:
    """SSD's hit rate after a round that accepted all K drafts (the bonus at K + 1) and after one that rejected one
    (the bonus where the draft was rejected), with their counts."""
    from saguaro.reporting.analysis.load import load_run
    from saguaro.reporting.analysis.rounds import lookups

    found = load_run(run).rounds_of(key)
    K = max((r.get("K") or 0 for call in found for r in call), default=0)
    out = {}
    for name, kind in (("all_accepted", lambda k: k == K), ("rejected", lambda k: k < K)):
        hits = [x.hit for x in lookups(found) if kind(x.k)]
        out[f"hit_rate_{name}"] = sum(hits) / len(hits) if hits else None
        out[f"lookups_{name}"] = len(hits)
    return out


def measured(runs: list[Path]) -> list[dict]:
    """One row per SD and SSD variant at T > 0 of each run: α, hit rate, decode tokens/s and tokens/s with the prefill
    (summary.json), the decode rounds' mean times (SD's draft_ms: drafting; SSD's: the wait for the worker), and
    for the invariant rows the paired intervals against the variant of the same settings in standard mode."""
    from saguaro.reporting.analysis.load import load_run
    from saguaro.reporting.analysis.rounds import timings

    rows = []
    for run in runs:
        variants = json.loads((run / "summary.json").read_text())["variants"]
        config = json.loads((run / "config.json").read_text())
        keys = {v["key"]: v for v in variants if v["system"] in ("sd", "ssd") and v.get("temperature")}
        for key, v in keys.items():
            mode = "invariant" if key.endswith(" invariant") else "standard"
            row = {
                "run": run.name,
                "prompts": config.get("prompts"),
                "system": v["system"],
                "temperature": v["temperature"],
                "mode": mode,
                "key": key,
                "n": v["prompts"],
                "alpha": v["alpha"],
                "hit_rate": v.get("hit_rate"),
                "tokens_per_round": v["tokens_per_round"],
                "decode_tokens_per_s": v["decode_tokens_per_s"],
                "tokens_per_s": v["tokens_per_s"],
                "disturbed": v.get("disturbed", 0),
            }
            t = timings(load_run(run).rounds_of(key))
            row.update(verify_ms=t.verify_ms, draft_ms=t.draft_ms, round_ms=t.round_ms, rounds=t.rounds)
            if v["system"] == "ssd":
                row.update(hit_rates_by_outcome(run, key))
            other = keys.get(key.removesuffix(" invariant"))  # the same settings, sampled the standard way
            if mode == "invariant" and other is not None:
                row["decode_ratio"] = v["decode_tokens_per_s"] / other["decode_tokens_per_s"]
                row["speed_ratio"] = v["tokens_per_s"] / other["tokens_per_s"]
                row.update(paired(run, other["key"], key))
            rows.append(row)
    return rows


def same_texts(runs: list[Path]) -> list[dict]:
    """Per run, temperature and mode: the systems, the prompts, and on how many every system's tokens agree."""
    rows = []
    for run in runs:
        texts: dict[tuple, dict[str, dict[str, tuple]]] = defaultdict(lambda: defaultdict(dict))
        for r in _results(run):
            if not r.get("error") and r["settings"]["temperature"] > 0:
                texts[(r["settings"]["temperature"], _mode(r))][r["prompt_id"]][r["system"]] = tuple(r["token_ids"])
        for (T, mode), prompts in sorted(texts.items()):
            systems = sorted({s for by in prompts.values() for s in by})
            alike = sum(1 for by in prompts.values() if len(by) == len(systems) and len(set(by.values())) == 1)
            speculative = [by for by in prompts.values() if "sd" in by and "ssd" in by]
            rows.append(
                {
                    "run": run.name,
                    "temperature": T,
                    "mode": mode,
                    "systems": systems,
                    "prompts": len(prompts),
                    "same_text": alike,
                    "sd_ssd_same_text": sum(by["sd"] == by["ssd"] for by in speculative) if speculative else None,
                }
            )
    return rows


def _f(x, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def markdown(bound_rows: list[dict], measured_rows: list[dict]) -> str:
    """Two tables: per prompt set, temperature and mode, the pair's bound beside SD's and SSD's measurements; per
    prompt set, temperature and system, invariant against standard with the paired 90% intervals."""
    floor = {(r["prompts"], r["temperature"], r["mode"]): r for r in bound_rows}
    cells: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for r in measured_rows:
        cells[(r["prompts"], r["temperature"], r["mode"])][r["system"]] = r
    lines = [
        "| prompts | T | mode | 1 − TV | (1 − TV)/(1 + TV) | race agreement | SD α | SSD α | SSD hit rate | "
        "SSD hits after K accepted / a rejection | SD decode tok/s | SSD decode tok/s | SD tok/s | SSD tok/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (prompts, T, mode), by in sorted(cells.items(), key=lambda c: (c[0][0], c[0][1], MODES.index(c[0][2]))):
        b, sd, ssd = floor.get((prompts, T, mode), {}), by.get("sd"), by.get("ssd")
        lines.append(
            f"| {prompts} | {T:g} | {mode} | {_f(b.get('mean_accept'))} | {_f(b.get('mean_floor'))} | "
            f"{_f(b.get('mean_race'))} | {_f(sd and sd['alpha'])} | {_f(ssd and ssd['alpha'])} | "
            f"{_f(ssd and ssd['hit_rate'], '.2f')} | {_f(ssd and ssd.get('hit_rate_all_accepted'), '.2f')} / "
            f"{_f(ssd and ssd.get('hit_rate_rejected'), '.2f')} | "
            f"{_f(sd and sd['decode_tokens_per_s'], '.2f')} | "
            f"{_f(ssd and ssd['decode_tokens_per_s'], '.2f')} | {_f(sd and sd['tokens_per_s'], '.2f')} | "
            f"{_f(ssd and ssd['tokens_per_s'], '.2f')} |"
        )
    lines += [
        "",
        "| prompts | T | system | α invariant − standard (90%) | decode tok/s invariant / standard (90%) | "
        "tok/s invariant / standard (90%) |",
        "|---|---|---|---|---|---|",
    ]
    standard = {(r["prompts"], r["temperature"], r["system"]): r for r in measured_rows if r["mode"] == "standard"}
    for r in sorted(measured_rows, key=lambda r: (r["prompts"], r["temperature"], r["system"])):
        s = standard.get((r["prompts"], r["temperature"], r["system"]))
        if r["mode"] != "invariant" or s is None or "speed_ratio" not in r:
            continue
        lines.append(
            f"| {r['prompts']} | {r['temperature']:g} | {r['system'].upper()} | "
            f"{r['alpha'] - s['alpha']:+.3f} ({r['d_alpha_low']:+.3f} to {r['d_alpha_high']:+.3f}) | "
            f"{r['decode_ratio']:.3f} ({r['decode_ratio_low']:.3f}-{r['decode_ratio_high']:.3f}) | "
            f"{r['speed_ratio']:.3f} ({r['speed_ratio_low']:.3f}-{r['speed_ratio_high']:.3f}) |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.coupling_bound", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR", help="saguaro bench run folders")
    parser.add_argument("--draws", type=int, default=64, help="keyed seeds per position for the race agreement")
    parser.add_argument("--texts", action="store_true", help="only the same-text check (no models loaded)")
    parser.add_argument("--json", type=Path, help="write every row here")
    parser.add_argument("--markdown", type=Path, help="write the summary table here")
    args = parser.parse_args(argv)
    missing = [str(r) for r in args.runs if not (r / "results.jsonl").is_file()]
    if missing or args.draws < 1:
        print(
            f"coupling_bound: {'give saguaro bench run folders: ' + missing[0] if missing else '--draws >= 1'}",
            file=sys.stderr,
        )
        return 2
    texts = same_texts(args.runs)
    out = {"same_text": texts}
    if not args.texts:
        out["bound"] = bound(args.runs, args.draws, log=lambda line: print(line, file=sys.stderr))
        out["measured"] = measured(args.runs)
        table = markdown(out["bound"], out["measured"])
        print(table)
        if args.markdown:
            args.markdown.write_text(table)
    for t in texts:
        both = "" if t["sd_ssd_same_text"] is None else f"; SD and SSD on {t['sd_ssd_same_text']}"
        print(
            f"{t['run']} T={t['temperature']:g} {t['mode']}: {' '.join(t['systems'])} emitted the same tokens on "
            f"{t['same_text']} of {t['prompts']} prompts{both}"
        )
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

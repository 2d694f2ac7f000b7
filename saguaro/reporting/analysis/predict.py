"""Measured vs simulated vs closed-form speedup over AR, for the same settings.

All three are decode-phase speedups over AR at the same temperature and batch size (prefill left out:
the closed forms have no prefill term):
- measured: Σ emitted / Σ round time of the variant's decode rounds, over the same for AR;
- closed form (theory): `sd_speedup` (Leviathan et al.) or `ssd_speedup` (Thm 7 / Cor. 16, per-row miss
  policy, as this engine does) evaluated with the run's own α, hit rate and mean per-round times (verify,
  draft, cache build, AR step; T_b is the target's mean wait in rounds with a miss, i.e. the backup plus the
  link, less the part of the cache build that outlasts the verify, which the per-row form already charges);
  they have no term for per-round overhead (sampling, bookkeeping), which is part of their error;
- simulated (simulator): the SimPy model with a timing model fitted (`simulator.fit_timing`) on all the
  run's round records, replaying each variant's accepted counts and hits (`simulator.validate.simulate_like`).
  The fit is in-sample: it measures how well the timing model's form explains these very runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from saguaro.reporting.analysis import rounds as R
from saguaro.reporting.analysis.load import Run
from theory import MissPolicy, expected_tokens, sd_speedup, ssd_over_sd_ceiling, ssd_speedup

SPECULATIVE_OURS = ("sd", "ssd")


@dataclass
class Predictions:
    rows: list[dict]
    notes: list[str] = field(default_factory=list)


def _closed_form(row: dict, t: R.Timings, ar: R.Timings) -> tuple[float | None, dict]:
    K, alpha = row["K"], row["alpha"]
    if alpha is None or not t.verify_ms or not ar.verify_ms:
        return None, {}
    T_v = t.verify_ms
    if row["system"] == "sd":
        T_d = (t.draft_ms or 0.0) / K
        inputs = {"alpha": alpha, "T_d_over_T_v": T_d / T_v, "T_ar_over_T_v": ar.verify_ms / T_v}
        return float(sd_speedup(alpha, K, T_d, T_v, ar.verify_ms)), inputs
    p_hit = row["hit_rate"]
    if p_hit is None or t.cache_build_ms is None:
        return None, {}
    a_hit = row["alpha_hit"] if row["alpha_hit"] is not None else alpha
    a_miss = row["alpha_miss"] if row["alpha_miss"] is not None else a_hit
    overrun_ms = max(0.0, t.cache_build_ms - T_v)  # in every round's wait, misses' included
    inputs = {
        "p_hit": p_hit,
        "alpha_hit": a_hit,
        "alpha_miss": a_miss,
        "T_p": t.cache_build_ms / T_v,
        "T_b": max(0.0, (t.miss_wait_ms or 0.0) - overrun_ms) / T_v,
        "T_ar_over_T_v": ar.verify_ms / T_v,
    }
    value = ssd_speedup(
        p_hit,
        expected_tokens(a_hit, K),
        expected_tokens(a_miss, K),
        inputs["T_p"],
        inputs["T_b"],
        row["batch"],
        inputs["T_ar_over_T_v"],
        miss_policy=MissPolicy.PER_ROW,
    )
    return float(value), inputs


class _Simulator:
    """The simulator fitted on one run's records; None predictions (with a note) when it cannot be."""

    def __init__(self, run: Run, notes: list[str]):
        self.run, self.notes, self.timing = run, notes, None
        try:
            from simulator.fit import fit_timing
            from simulator.records import parse_record

            self._parse = parse_record
            records = [parse_record(r, f"{run.name} rounds.jsonl") for r in run.rounds]
            self.timing = fit_timing(records)
        except (ImportError, ValueError) as err:
            notes.append(f"{run.name}: simulated column left out ({type(err).__name__}: {err})")

    def tokens_per_s(self, key: str) -> float | None:
        if self.timing is None:
            return None
        from simulator.validate import simulate_like

        segments = [[self._parse(r) for r in R.decode(call)] for call in self.run.rounds_of(key)]
        segments = [s for s in segments if s]
        if not segments:
            return None
        try:
            return simulate_like(self.timing, segments)
        except ValueError as err:
            self.notes.append(f"{self.run.name} {key}: not simulated ({err})")
            return None


def _error(predicted: float | None, measured: float | None) -> float | None:
    return predicted / measured - 1.0 if predicted is not None and measured else None


def predictions(runs: list[Run], rows: list[dict]) -> Predictions:
    """One row per speculative variant of ours that has an AR baseline with round records."""
    by_name = {run.name: run for run in runs}
    out = Predictions([])
    sims: dict[str, _Simulator] = {}
    for row in rows:
        if row["system"] not in SPECULATIVE_OURS or row.get("ar_key") is None:
            continue
        run, ar_run = by_name[row["run"]], by_name[row["ar_run"]]
        t, ar = R.timings(run.rounds_of(row["key"])), R.timings(ar_run.rounds_of(row["ar_key"]))
        if not t.rounds or not ar.rounds:
            continue
        closed, inputs = _closed_form(row, t, ar)
        for r in (run, ar_run):
            if r.name not in sims:
                sims[r.name] = _Simulator(r, out.notes)
        sim, sim_ar = sims[run.name].tokens_per_s(row["key"]), sims[ar_run.name].tokens_per_s(row["ar_key"])
        simulated = sim / sim_ar if sim and sim_ar else None
        measured = row["decode_speedup_vs_ar"]
        out.rows.append(
            {
                "run": row["run"],
                "key": row["key"],
                "system": row["system"],
                "K": row["K"],
                "temperature": row["temperature"],
                "batch": row["batch"],
                "C": row["C"],
                "budget": row["budget"],
                "backup": row["backup"],
                "disturbed": row.get("disturbed", 0),
                "measured": measured,
                "simulated": simulated,
                "closed_form": closed,
                "simulated_error": _error(simulated, measured),
                "closed_form_error": _error(closed, measured),
                **inputs,
            }
        )
    return out


def _k_label(key: str) -> str | None:
    return next((part for part in key.split() if part.startswith("K=")), None)


def _tokens_per_round(hist) -> float | None:
    n = sum(hist.values())
    return sum((k + 1) * c for k, c in hist.items()) / n if n else None


def ceiling_rows(runs: list[Run], rows: list[dict]) -> list[dict]:
    """Each SSD variant against Cor. 9's ceiling on SSD/SD, measured in the same run.

    The ceiling (1 + T_SD)·E_hit / E_SD is what SSD would gain over SD if every drafting were hidden:
    T_SD = SD's drafting time per round over SSD's verify time (the verify measured while the draft worker
    runs next to it, as SSD's rounds are), E_hit = tokens per sequence-round of SSD's cache hits, E_SD =
    tokens per SD round. The SD variant is the one with the same K (or both adaptive), temperature, batch
    and C. `share` = measured SSD/SD (decode tokens/s) over the ceiling."""
    by_name = {run.name: run for run in runs}
    out = []
    for row in rows:
        if row["system"] != "ssd":
            continue
        sd = next(
            (
                r
                for r in rows
                if r["system"] == "sd"
                and r["run"] == row["run"]
                and _k_label(r["key"]) == _k_label(row["key"])
                and all(r[s] == row[s] for s in ("temperature", "batch", "C"))
            ),
            None,
        )
        if sd is None or not row["decode_tokens_per_s"] or not sd["decode_tokens_per_s"]:
            continue
        run = by_name[row["run"]]
        ssd_calls, sd_calls = run.rounds_of(row["key"]), run.rounds_of(sd["key"])
        ssd_t, sd_t = R.timings(ssd_calls), R.timings(sd_calls)
        E_hit = _tokens_per_round(R.accepted_hist(ssd_calls, hit=True))
        E_sd = _tokens_per_round(R.accepted_hist(sd_calls))
        if not (E_hit and E_sd and ssd_t.verify_ms and sd_t.draft_ms is not None):
            continue
        T_sd = sd_t.draft_ms / ssd_t.verify_ms
        ceiling = float(ssd_over_sd_ceiling(E_hit, E_sd, T_sd))
        measured = row["decode_tokens_per_s"] / sd["decode_tokens_per_s"]
        out.append(
            {
                "run": row["run"],
                "key": row["key"],
                "sd_key": sd["key"],
                "disturbed": row.get("disturbed", 0),
                "measured_ssd_over_sd": measured,
                "ceiling": ceiling,
                "share": measured / ceiling,
                "T_sd": T_sd,
                "E_hit": E_hit,
                "E_sd": E_sd,
                "hit_rate": row["hit_rate"],
            }
        )
    return out

"""SSD cache hits: hit rate by position k, and the miss rate against fan-out with its fitted power law (Def. 11)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict

from saguaro.reporting.analysis import rounds as R
from saguaro.reporting.analysis.load import Run
from theory import fit_r

MIN_FIT_POINTS = 3  # two points fit a·F^(−r) exactly: no test of the form, no uncertainty


def hit_by_k(runs: list[Run], rows: list[dict]) -> list[dict]:
    """Per SSD variant and outcome k: lookups, hits, hit rate and the fan-out F_k the cache held."""
    by_name = {run.name: run for run in runs}
    out = []
    for row in rows:
        if row["system"] != "ssd":
            continue
        groups: dict[int, list[R.Lookup]] = defaultdict(list)
        for lookup in R.lookups(by_name[row["run"]].rounds_of(row["key"])):
            groups[lookup.k].append(lookup)
        for k in sorted(groups):
            ls = groups[k]
            hits = sum(x.hit for x in ls)
            out.append(
                {
                    "run": row["run"],
                    "key": row["key"],
                    "k": k,
                    "lookups": len(ls),
                    "hits": hits,
                    "hit_rate": hits / len(ls),
                    "fanout": round(sum(x.fanout for x in ls) / len(ls), 2),
                }
            )
    return out


def miss_vs_fanout(runs: list[Run], rows: list[dict]) -> list[dict]:
    """Lookups pooled by temperature and fan-out F (all SSD variants with C = 1): lookups, misses, miss rate."""
    by_name = {run.name: run for run in runs}
    groups: dict[tuple[float, int], list[bool]] = defaultdict(list)
    for row in rows:
        if row["system"] != "ssd" or (row["C"] or 1.0) != 1.0:
            continue  # Saguaro's C < 1 changes the hit rate at a given F: keep the power law to plain sampling
        for lookup in R.lookups(by_name[row["run"]].rounds_of(row["key"])):
            if lookup.fanout > 0:
                groups[(row["temperature"], lookup.fanout)].append(lookup.hit)
    return [
        {"temperature": T, "fanout": F, "lookups": len(h), "misses": len(h) - sum(h), "miss_rate": 1 - sum(h) / len(h)}
        for (T, F), h in sorted(groups.items())
    ]


def power_law_fits(points: list[dict]) -> list[dict]:
    """theory.fit_r per temperature on the points with a non-zero miss rate; a note where it cannot fit."""
    by_T: dict[float, list[dict]] = defaultdict(list)
    for p in points:
        if p["misses"] > 0:
            by_T[p["temperature"]].append(p)
    fits = []
    for T, ps in sorted(by_T.items()):
        F, miss = [p["fanout"] for p in ps], [p["miss_rate"] for p in ps]
        if len(ps) < MIN_FIT_POINTS:
            fits.append(
                {
                    "temperature": T,
                    "n_points": len(ps),
                    "note": f"not fitted: misses at {len(ps)} fan-out(s); a power law a·F^(−r) has two "
                    f"parameters, so testing it needs {MIN_FIT_POINTS} or more",
                }
            )
            continue
        try:
            fit = fit_r(F, miss)
        except ValueError as err:
            fits.append({"temperature": T, "note": str(err)})
            continue
        fits.append({"temperature": T, **asdict(fit)})
    return fits

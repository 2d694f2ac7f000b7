"""Where SSD loses against its Cor. 9 ceiling: the measured share split into factors, from the round records.

The ceiling (1 + T_SD)·E_hit / E_SD (saguaro.reporting.analysis.predict.ceiling_rows) is the ratio of two idealised
speeds: SSD with every round a cache hit lasting exactly one verify (E_hit tokens per SSD verify V̄), over SD
whose round is its drafting plus SSD's verify (E_SD tokens per D̄_SD + V̄). The measured ratio is Σ emitted /
Σ round time of SSD's decode rounds over the same for SD's. So

    measured / ceiling = misses_tokens · misses_backup · start · waits · shapes · interference · overhead
                         · rest

exactly (no residual), each factor 1 where there is no loss and < 1 where SSD loses (> 1: a gain):
- misses_tokens = (p·E_hit + (1 − p)·E_miss) / E_hit: the tokens per sequence-round of SSD, cache hits and
  misses together (p = the share of sequence-rounds whose speculation came from the cache), over E_hit;
- misses_backup = (T − B) / T: T = Σ SSD round time, B = Σ `backup_ms` of the rounds with a miss (the
  backup's own drafting on the critical path);
- start = (T − B − S) / (T − B): S = the first decode round's wait of each generate call beyond its backup
  (the worker taking in the prompt and building its first cache);
- waits = (T − B − S − W) / (T − B − S): W = the rest of the target's waits for the worker
  (Σ wait_ms − B − S), in every later round, hit or miss: the link, and the cache build outlasting the
  verify (T_p > 1); `link_ms` (the median wait beyond the backup in rounds whose cache was built within the
  previous verify) and `overrun_rounds` (the share of rounds whose cache build outlasted it) say which;
- shapes · interference = (D̄_SD + V̄_SD) / (D̄_SD + V̄_SSD): the ceiling prices SD's round with SSD's verify
  (measured while the worker runs next to it) but the measured SD runs with its own. Split at V̄_SD@SSD, SD's
  verify at SSD's shapes (each SSD round's (K, b) priced at SD's mean verify of that shape; a shape SD never
  ran is linear in K from SD's other shapes at that b, else priced at SSD's verify times SD/SSD over the
  matched rounds): shapes = (D̄_SD + V̄_SD) / (D̄_SD + V̄_SD@SSD) (1 at a constant K shared by both; < 1 where
  SSD verifies longer blocks), interference = (D̄_SD + V̄_SD@SSD) / (D̄_SD + V̄_SSD) (< 1 when the worker
  slows the verify of the same shapes);
- overhead = Σ V_SSD / (Σ V_SSD + O_SSD) · R̄_SD / (D̄_SD + V̄_SD): the part of each round outside verify,
  wait and drafting (sampling, bookkeeping; O_SSD = T − Σ V_SSD − Σ wait_ms), SSD's against SD's (the
  ceiling has no term for it);
- rest = the tokens cut at EOS or the length limit (Σ emitted / Σ (k + 1), SSD's over SD's) times the mean
  batch (sequence-rounds per round, SSD's over SD's; 1 at b = 1).

`p_hit_for_90` answers what hit rate would lift the share to 90% if everything else stayed as measured: the
other factors, E_miss / E_hit, and the backup time per missed round (rounds with a miss taken as 1 − p^b of
all, scaled to pass through today's count); `p_hit_misses_alone` the same with the other factors all 1.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from statistics import median

from saguaro.reporting.analysis import rounds as R
from saguaro.reporting.analysis.load import Run

TARGET_SHARE = 0.9
FACTORS = ("misses_tokens", "misses_backup", "start", "waits", "shapes", "interference", "overhead", "rest")


@dataclass(frozen=True)
class _Sums:
    """Totals over one variant's decode rounds (ms; tokens; counts)."""

    rounds: int
    seq_rounds: int
    emitted: int
    drafted: int  # Σ (k + 1): tokens before the cut at EOS or the length limit
    round_ms: float
    verify_ms: float
    draft_ms: float  # SD: drafting; SSD: the target's wait for the worker (wait_ms)


def _sums(rows: list[dict]) -> _Sums:
    return _Sums(
        rounds=len(rows),
        seq_rounds=sum(len(r["accepted"]) for r in rows),
        emitted=sum(sum(r["emitted"]) for r in rows),
        drafted=sum(int(k) + 1 for r in rows for k in r["accepted"]),
        round_ms=sum(r["round_ms"] for r in rows),
        verify_ms=sum(r["verify_ms"] for r in rows),
        draft_ms=sum(r["wait_ms"] if r.get("wait_ms") is not None else r["draft_ms"] for r in rows),
    )


def _wait_ms(r: dict) -> float:
    return r["wait_ms"] if r.get("wait_ms") is not None else r["draft_ms"]


def _backups_ms(rows: list[dict]) -> list[float | None]:
    """Per round, the backup's time on the critical path (None: every row hit, or no SSD round). Records
    without `backup_ms` (older engines) count their wait beyond the mean wait of all-hit rounds."""
    hit_waits = [r["wait_ms"] for r in rows if r.get("hit") and all(r["hit"]) and r.get("wait_ms") is not None]
    hit_wait = sum(hit_waits) / len(hit_waits) if hit_waits else 0.0
    out: list[float | None] = []
    for r in rows:
        if r.get("hit") is None or all(r["hit"]):
            out.append(None)
        elif r.get("backup_ms") is not None:
            out.append(r["backup_ms"])
        else:
            out.append(max(0.0, _wait_ms(r) - hit_wait))
    return out


@dataclass(frozen=True)
class _Waits:
    backup_ms: float  # B: Σ backup time of the rounds with a miss
    missed_rounds: int
    start_ms: float  # S: Σ over calls of the first decode round's wait beyond its backup
    rest_ms: float  # W: Σ of the other rounds' waits beyond their backup
    link_ms: float | None  # median wait beyond the backup in later rounds whose cache fit in the previous verify
    overrun_rounds: float | None  # share of later rounds whose cache build outlasted the previous verify


def _waits(calls: list[list[dict]]) -> _Waits:
    B = S = W = 0.0
    missed, fits, overruns = 0, [], 0
    for rows in calls:
        for i, (r, b) in enumerate(zip(rows, _backups_ms(rows), strict=True)):
            beyond = _wait_ms(r) - (b or 0.0)
            B, missed = B + (b or 0.0), missed + (b is not None)
            if i == 0:
                S += beyond
                continue
            W += beyond
            if r.get("cache_build_ms") is not None:
                if r["cache_build_ms"] > rows[i - 1]["verify_ms"]:  # built during the previous round's verify
                    overruns += 1
                else:
                    fits.append(beyond)
    later = len(fits) + overruns
    return _Waits(B, missed, S, W, median(fits) if fits else None, overruns / later if later else None)


def _verify_at_shapes(sd: list[dict], ssd: list[dict]) -> float:
    """SD's mean verify (ms) at SSD's shapes: each SSD round priced at SD's mean verify of its (K, b)."""
    by_shape: dict[tuple[int, int], list[float]] = defaultdict(list)
    for r in sd:
        by_shape[(r["K"], r["batch_size"])].append(r["verify_ms"])
    mean = {shape: sum(v) / len(v) for shape, v in by_shape.items()}
    priced: list[float | None] = []
    for r in ssd:
        K, b = r["K"], r["batch_size"]
        if (K, b) in mean:
            priced.append(mean[(K, b)])
            continue
        line = sorted((k, v) for (k, bb), v in mean.items() if bb == b)
        if len(line) >= 2:  # least squares on SD's shapes at this b, V = c0 + c1·K
            ks, vs = [k for k, _ in line], [v for _, v in line]
            k0, v0 = sum(ks) / len(ks), sum(vs) / len(vs)
            slope = sum((k - k0) * (v - v0) for k, v in line) / sum((k - k0) ** 2 for k in ks)
            priced.append(v0 + slope * (K - k0))
        else:
            priced.append(None)
    matched = [(p, r["verify_ms"]) for p, r in zip(priced, ssd, strict=True) if p is not None]
    ratio = sum(p for p, _ in matched) / sum(v for _, v in matched) if matched else 1.0
    return sum(p if p is not None else ratio * r["verify_ms"] for p, r in zip(priced, ssd, strict=True)) / len(ssd)


def _share_at(
    p: float, p_now: float, other: float, e_miss: float, base_ms: float, backup_ms: float, batch: float
) -> float:
    """The share at hit rate p with the other factors, E_miss/E_hit and the cost of a missed round as today."""
    missed_now = 1.0 - p_now**batch
    backup = backup_ms * (1.0 - p**batch) / missed_now
    return other * (p + (1.0 - p) * e_miss) * base_ms / (base_ms + backup)


def _hit_rate_for(
    target: float,
    p_now: float,
    other: float,
    e_miss: float,
    base_ms: float,
    backup_ms: float,
    batch: float,
    steps: int = 10_000,
) -> float | None:
    """The least hit rate on a 1e-4 grid whose share reaches `target`; None if none does (not even p = 1)."""
    for i in range(steps + 1):
        p = i / steps
        if _share_at(p, p_now, other, e_miss, base_ms, backup_ms, batch) >= target:
            return p
    return None


def decompose(ssd_calls: R.Calls, sd_calls: R.Calls, target: float = TARGET_SHARE) -> dict | None:
    """The factors of measured SSD/SD over Cor. 9's ceiling for one SSD variant and its SD (module doc);
    None when either has no decode rounds or SSD never hit the cache (no E_hit: no ceiling)."""
    ssd_by_call = [rows for rows in (R.decode(call) for call in ssd_calls) if rows]
    ssd = [r for rows in ssd_by_call for r in rows]
    sd = [r for call in sd_calls for r in R.decode(call)]
    if not ssd or not sd:
        return None
    s, d = _sums(ssd), _sums(sd)
    flags = [(int(k), bool(r.get("hit") and r["hit"][b])) for r in ssd for b, k in enumerate(r["accepted"])]
    hits = [k + 1 for k, h in flags if h]
    misses = [k + 1 for k, h in flags if not h]
    if not hits or not s.round_ms or not d.round_ms or not s.emitted or not d.emitted:
        return None
    p = len(hits) / len(flags)
    E_hit, E_sd = sum(hits) / len(hits), d.drafted / d.seq_rounds
    E_miss = sum(misses) / len(misses) if misses else None
    V_ssd, V_sd, D_sd = s.verify_ms / s.rounds, d.verify_ms / d.rounds, d.draft_ms / d.rounds
    T_sd = D_sd / V_ssd
    V_sd_at_ssd = _verify_at_shapes(sd, ssd)
    ceiling = (1.0 + T_sd) * E_hit / E_sd
    measured = (s.emitted / s.round_ms) / (d.emitted / d.round_ms)
    w = _waits(ssd_by_call)
    T, B = s.round_ms, w.backup_ms
    other_ssd = T - s.verify_ms - s.draft_ms  # = T − V − (B + S + W)
    factors = {
        "misses_tokens": (s.drafted / s.seq_rounds) / E_hit,
        "misses_backup": (T - B) / T,
        "start": (T - B - w.start_ms) / (T - B),
        "waits": (T - s.draft_ms) / (T - B - w.start_ms),
        "shapes": (D_sd + V_sd) / (D_sd + V_sd_at_ssd),
        "interference": (D_sd + V_sd_at_ssd) / (D_sd + V_ssd),
        "overhead": s.verify_ms / (s.verify_ms + other_ssd) * (d.round_ms / d.rounds) / (D_sd + V_sd),
        "rest": (s.emitted / s.drafted)
        / (d.emitted / d.drafted)
        * (s.seq_rounds / s.rounds)
        / (d.seq_rounds / d.rounds),
    }
    builds = [r["cache_build_ms"] for r in ssd if r.get("cache_build_ms") is not None]
    share = measured / ceiling
    other = share / (factors["misses_tokens"] * factors["misses_backup"])  # what the hit rate leaves alone
    needed = needed_alone = None
    if E_miss is not None and w.missed_rounds:
        cost = (E_miss / E_hit, T - B, B, s.seq_rounds / s.rounds)
        needed = _hit_rate_for(target, p, other, *cost)
        needed_alone = _hit_rate_for(target, p, 1.0, *cost)
    return {
        "measured_ssd_over_sd": measured,
        "ceiling": ceiling,
        "share": share,
        **factors,
        "p_hit": p,
        "E_hit": E_hit,
        "E_miss": E_miss,
        "E_miss_over_E_hit": E_miss / E_hit if E_miss else None,
        "backup_ms": B / w.missed_rounds if w.missed_rounds else None,
        "start_ms": w.start_ms / len(ssd_by_call),
        "link_ms": w.link_ms,
        "overrun_rounds": w.overrun_rounds,
        "T_p": (sum(builds) / len(builds)) / V_ssd if builds else None,
        "verify_ms": V_ssd,
        "sd_verify_ms": V_sd,
        "T_sd": T_sd,
        "share_at_all_hits": other,
        _needed_key(target): needed,
        "p_hit_misses_alone": needed_alone,
    }


def _needed_key(target: float) -> str:
    return f"p_hit_for_{round(target * 100)}"


def gap_rows(runs: list[Run], ceilings: list[dict], target: float = TARGET_SHARE) -> list[dict]:
    """One decomposition per row of `ceiling_rows` (same SSD and SD variants)."""
    by_name = {run.name: run for run in runs}
    out = []
    for c in ceilings:
        run = by_name[c["run"]]
        row = decompose(run.rounds_of(c["key"]), run.rounds_of(c["sd_key"]), target)
        if row is not None:
            out.append(
                {"run": c["run"], "key": c["key"], "sd_key": c["sd_key"], "disturbed": c.get("disturbed", 0), **row}
            )
    return out


def reading(row: dict, target: float = TARGET_SHARE) -> str:
    """One line a reader can act on: the hit rate a `target` share needs, or why no hit rate reaches it."""
    need = row.get(_needed_key(target))
    key = f"`{row['key']}`"
    if row["share"] >= target:
        return f"{key}: share {row['share']:.2f} already reaches {target:.0%}."
    if need is not None:
        return (
            f"{key}: a {target:.0%} share needs a cache hit rate of {need:.2f} (today {row['p_hit']:.2f}) at "
            f"today's miss cost ({row['backup_ms']:.0f} ms of backup per missed round, E_miss/E_hit "
            f"{row['E_miss_over_E_hit']:.2f})."
        )
    worst = min((f for f in FACTORS if not f.startswith("misses")), key=lambda f: row[f])
    line = (
        f"{key}: no hit rate reaches {target:.0%}: with every speculation a hit the other factors cap the "
        f"share at {row['share_at_all_hits']:.2f} (the largest loss: {worst} {row[worst]:.2f})"
    )
    if row["E_miss"] is None:
        return line + "; there are no misses."
    line += f"; the misses leave {row['misses_tokens'] * row['misses_backup']:.2f}"
    alone = row.get("p_hit_misses_alone")
    if alone is not None and alone > row["p_hit"]:
        line += (
            f", and with the other factors at 1 a {target:.0%} share would need a cache hit rate of "
            f"{alone:.2f} (today {row['p_hit']:.2f}) at today's {row['backup_ms']:.0f} ms of backup per "
            "missed round"
        )
    return line + "."

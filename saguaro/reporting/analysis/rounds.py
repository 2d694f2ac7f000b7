"""Statistics of per-round records (engine/metrics.py RoundRecord, as dicts), one generate call per list.

SSD records say, per sequence, whether the speculation verified in that round came from the cache
(`hit`), and describe the cache that was looked up for it (`fanout`, `cache_build_ms`, `branches`: built
during the previous round's verify). So the lookup of outcome k of round r is answered by `hit` of round
r+1, with F_k from round r+1's `fanout`: hit rates by position k pair consecutive rounds. When a sequence
finishes mid-batch the rows shift; such pairs (batch size changed) are skipped, unless the record
carries `outcome_hit` (the engine's own pairing, None for rows that finished). SSD's `wait_ms` is the
target's wait for the next speculation (link, and the backup on a miss).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from itertools import pairwise

Calls = list[list[dict]]


def decode(call: list[dict]) -> list[dict]:
    return [r for r in call if r.get("phase", "decode") == "decode"]


def alpha_mle(hist: dict[int, int], K: int | None) -> float | None:
    """α from accepted counts: accepted draws / (accepted draws + rejections) (i.i.d., truncated at K)."""
    if not K:
        return None
    accepted = sum(k * n for k, n in hist.items())
    rejections = sum(n for k, n in hist.items() if k < K)
    return accepted / (accepted + rejections) if accepted + rejections else None


def alpha_rounds(calls: Calls, hit: bool | None = None) -> float | None:
    """α from the round records, each truncated at its own round's K (adaptive speculation varies K per
    round, so a row that accepted all of a short round's drafts was not rejected); `hit` as accepted_hist."""
    accepted = rejections = 0
    for call in calls:
        for r in decode(call):
            K, flags = r.get("K") or 0, r.get("hit")
            for b, k in enumerate(r["accepted"]):
                if K and (hit is None or (flags is not None and flags[b] == hit)):
                    accepted += int(k)
                    rejections += int(k) < K
    return accepted / (accepted + rejections) if accepted + rejections else None


def accepted_hist(calls: Calls, hit: bool | None = None) -> Counter:
    """k -> sequence-rounds over decode rounds; `hit` True/False keeps only cache / backup speculations."""
    hist: Counter = Counter()
    for call in calls:
        for r in decode(call):
            flags = r.get("hit")
            for b, k in enumerate(r["accepted"]):
                if hit is None or (flags is not None and flags[b] == hit):
                    hist[int(k)] += 1
    return hist


@dataclass(frozen=True)
class Lookup:
    k: int  # draft tokens accepted in the round whose outcome was looked up
    fanout: int  # guesses the cache held for that outcome (F_k)
    hit: bool


def lookups(calls: Calls) -> list[Lookup]:
    out = []
    for call in calls:
        rounds = decode(call)
        for prev, cur in pairwise(rounds):
            fanout = cur.get("fanout") or prev.get("fanout")
            if fanout is None:
                continue
            if prev.get("outcome_hit") is not None:  # the engine pairs them itself (None: row finished)
                pairs = [(k, h) for k, h in zip(prev["accepted"], prev["outcome_hit"], strict=True) if h is not None]
            elif cur.get("hit") is not None and prev["batch_size"] == cur["batch_size"]:
                pairs = list(zip(prev["accepted"], cur["hit"], strict=True))
            else:
                continue
            out += [Lookup(int(k), int(fanout[k]), bool(h)) for k, h in pairs]
    return out


def hit_rate(calls: Calls) -> float | None:
    """The SSD hit rate as the engine's metrics and the simulator define it (simulator.metrics.HIT_RATE_DEFINITION):
    outcomes found in the cache over outcomes looked up (`lookups`), so each sequence's first round, which has no
    cache, is left out. (Counting every round's `hit` flag, first rounds as misses, read ~2-3 points lower on
    runs of 8 prompts × 128 tokens.)"""
    looked_up = lookups(calls)
    return sum(x.hit for x in looked_up) / len(looked_up) if looked_up else None


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


@dataclass(frozen=True)
class Timings:
    """Mean per-round times of a variant's decode rounds, ms (None where the records have none)."""

    verify_ms: float | None
    draft_ms: float | None  # SD: drafting on the critical path
    cache_build_ms: float | None  # SSD: building the cache (hidden behind the verify when it fits)
    miss_wait_ms: float | None  # SSD: the target's wait in rounds with a miss (the backup, plus the link)
    wait_ms: float | None  # SSD: target waiting for the next speculation
    round_ms: float | None
    rounds: int


def timings(calls: Calls) -> Timings:
    rows = [r for call in calls for r in decode(call)]
    missed = [
        r["wait_ms"] if r.get("wait_ms") is not None else r["draft_ms"]
        for r in rows
        if r.get("hit") is not None and not all(r["hit"])
    ]
    return Timings(
        verify_ms=_mean([r["verify_ms"] for r in rows]),
        draft_ms=_mean([r["draft_ms"] for r in rows]),
        cache_build_ms=_mean([r["cache_build_ms"] for r in rows if r.get("cache_build_ms") is not None]),
        miss_wait_ms=_mean(missed),
        wait_ms=_mean([r["wait_ms"] for r in rows if r.get("wait_ms") is not None]),
        round_ms=_mean([r["round_ms"] for r in rows]),
        rounds=len(rows),
    )


def decode_tokens_per_s(calls: Calls) -> float | None:
    """Σ tokens emitted by decode rounds / Σ their round time: decoding speed without prefill."""
    rows = [r for call in calls for r in decode(call)]
    ms = sum(r["round_ms"] for r in rows)
    return sum(sum(r["emitted"]) for r in rows) / ms * 1e3 if ms > 0 else None


PHASES = ("prefill", "verify", "draft", "other")


def phase_ms(calls: Calls) -> dict[str, float]:
    """Total ms per phase on the critical path, and the tokens they produced.

    prefill: whole prefill rounds; verify: target forwards of decode rounds; draft: SD's drafting, or
    SSD's wait for the next speculation (backup and link included); other: the rest of each round
    (sampling, bookkeeping). `hidden_cache_build` is SSD's cache build, which overlaps the verify.
    """
    out = dict.fromkeys(PHASES, 0.0) | {"hidden_cache_build": 0.0, "tokens": 0.0}
    for call in calls:
        for r in call:
            out["tokens"] += sum(r["emitted"])
            if r.get("phase", "decode") == "prefill":
                out["prefill"] += r["round_ms"]
                continue
            waited = r["wait_ms"] if r.get("wait_ms") is not None else r["draft_ms"]
            out["verify"] += r["verify_ms"]
            out["draft"] += waited
            out["other"] += max(0.0, r["round_ms"] - r["verify_ms"] - waited)
            out["hidden_cache_build"] += r.get("cache_build_ms") or 0.0
    return out

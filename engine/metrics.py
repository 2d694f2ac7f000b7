"""Metrics as data: per-round records (the simulator fits timings from them), per-request and
per-run summaries with histograms, not only means."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import median

from theory.latency import RequestLatency, request_latency, summarize


@dataclass
class RoundRecord:
    """One round of one strategy over a batch; the JSONL schema the simulator reads."""

    strategy: str
    round: int
    batch_size: int
    K: int
    context_len: int  # max tokens in the target cache (prompt included) before the round
    accepted: list[int]  # k per sequence
    emitted: list[int]  # tokens emitted per sequence (k + 1 before truncation at EOS/limit)
    draft_ms: float  # drafting on the critical path (0 for AR)
    verify_ms: float  # target forward (+ verification) of the round
    round_ms: float
    draft_forwards: int
    phase: str = "decode"  # or "prefill"
    tokens: int = 0  # prefill only: prompt tokens of the longest prompt
    backup_ms: float | None = None  # SSD: the backup's own drafting time on the critical path
    # SSD only
    hit: list[bool] | None = None
    cache_build_ms: float | None = None
    branches: int | None = None
    backup: str | None = None
    wait_ms: float | None = None
    fanout: list[int] | None = None
    outcome_hit: list[bool | None] | None = None  # was this round's outcome in the cache (None: row finished)
    # SD and SSD: the rank of each row's bonus t* among the draft's guesses for its outcome k (None: unknown);
    # a fan-out F_k would have held it iff rank < F_k
    outcome_rank: list[int | None] | None = None
    prompt_index: list[int] | None = None  # decode rounds: each row's prompt index in its generate() call

    def to_json(self) -> str:
        return json.dumps({k: v for k, v in asdict(self).items() if v is not None})


def ssd_summary(decode: list[RoundRecord]) -> dict:
    """SSD's own numbers: hit rate overall and by k, waiting, cache build vs verify (T_p), backup use."""
    ssd = [r for r in decode if r.hit is not None]
    if not ssd:
        return {}
    lookups: Counter = Counter()
    hits: Counter = Counter()
    for r in ssd:
        for k, hit in zip(r.accepted, r.outcome_hit or [None] * len(r.accepted), strict=True):
            if hit is not None:
                lookups[k] += 1
                hits[k] += hit
    n = sum(lookups.values())
    rows = sum(len(r.hit) for r in ssd)
    backup_rows: Counter = Counter()
    for r in ssd:
        for hit in r.hit:
            if not hit:
                backup_rows[r.backup or "?"] += 1
    builds = [r.cache_build_ms / r.verify_ms for r in ssd if r.cache_build_ms and r.verify_ms > 0]
    return {
        "hit_rate": sum(hits.values()) / n if n else 0.0,
        "hit_rate_by_k": {int(k): hits[k] / lookups[k] for k in sorted(lookups)},
        "speculations_from_cache": sum(sum(r.hit) for r in ssd) / rows if rows else 0.0,
        "mean_tokens_per_round": sum(sum(r.emitted) for r in ssd) / rows if rows else 0.0,
        "total_wait_ms": sum(r.wait_ms or 0.0 for r in ssd),
        "median_wait_ms": median(r.wait_ms or 0.0 for r in ssd),
        "median_T_p": median(builds) if builds else 0.0,
        "backup_rows": dict(backup_rows),
        "fallback_rounds": sum(1 for r in decode if r.strategy in ("sd", "ar")),
    }


@dataclass
class RequestMetrics:
    """Timings and counts of one request. Times are time.perf_counter() readings; the latencies follow
    theory.latency (TTFT from arrival, ITL between streamed chunks, TPOT, E2EL)."""

    prompt_tokens: int
    arrival_s: float = 0.0
    scheduled_s: float | None = None  # when it left the waiting queue for its prefill
    new_tokens: int = 0
    rounds: int = 0
    target_forwards: int = 0  # forwards of the target that included this sequence (prefill too)
    accepted_hist: Counter = field(default_factory=Counter)  # k -> rounds
    chunk_times_s: list[float] = field(default_factory=list)  # when each streamed chunk was emitted
    chunk_tokens: list[int] = field(default_factory=list)  # tokens in each chunk
    cached_prompt_tokens: int = 0  # prompt tokens whose KV came from the prefix cache (not prefilled)

    def add_chunk(self, now_s: float, tokens: int) -> None:
        self.new_tokens += tokens
        self.chunk_times_s.append(now_s)
        self.chunk_tokens.append(tokens)

    @property
    def latency(self) -> RequestLatency | None:
        if not self.chunk_times_s:
            return None
        return request_latency(self.arrival_s, self.chunk_times_s, self.chunk_tokens)

    @property
    def ttft_s(self) -> float | None:
        return self.latency.ttft_s if self.chunk_times_s else None

    @property
    def e2el_s(self) -> float | None:
        return self.latency.e2el_s if self.chunk_times_s else None

    @property
    def tpot_s(self) -> float | None:
        return self.latency.tpot_s if self.chunk_times_s else None

    @property
    def tokens_per_s(self) -> float:
        e2el = self.e2el_s
        return self.new_tokens / e2el if e2el else 0.0

    def summary(self) -> dict:
        lat = self.latency
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "new_tokens": self.new_tokens,
            "tokens_per_s": self.tokens_per_s,
            "ttft_s": lat.ttft_s if lat else None,
            "tpot_s": lat.tpot_s if lat else None,
            "e2el_s": lat.e2el_s if lat else None,
            "itl_s": list(lat.itl_s) if lat else [],
            "chunks": len(self.chunk_times_s),
            "rounds": self.rounds,
            "target_forwards": self.target_forwards,
            "accepted_hist": {int(k): v for k, v in sorted(self.accepted_hist.items())},
        }


@dataclass
class RunMetrics:
    """Aggregate of one generate() call."""

    strategy: str
    K: int
    wall_s: float
    requests: list[RequestMetrics]
    rounds: list[RoundRecord]

    @property
    def new_tokens(self) -> int:
        return sum(r.new_tokens for r in self.requests)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def accepted_hist(self) -> Counter:
        total: Counter = Counter()
        for r in self.requests:
            total.update(r.accepted_hist)
        return total

    @property
    def mean_accepted(self) -> float:
        """Mean draft tokens accepted per sequence-round (k)."""
        hist = self.accepted_hist
        n = sum(hist.values())
        return sum(k * c for k, c in hist.items()) / n if n else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Estimate of α from the accepted counts (MLE under i.i.d. acceptance, truncated at each round's K).

        Each sequence-round is a run of Bernoulli(α) trials stopped at the first rejection or after
        the round's K successes: α = accepted draws / (accepted draws + rejections). K is read from
        each round's record, since adaptive speculation (K="auto", a confidence stop) changes it from
        round to round; a row that accepted all of its round's K drafts was not rejected.
        """
        accepted = rejections = 0
        for r in self.rounds:
            if r.phase != "decode" or r.K == 0:
                continue
            accepted += sum(r.accepted)
            rejections += sum(k < r.K for k in r.accepted)
        return accepted / (accepted + rejections) if accepted + rejections else 0.0

    def summary(self) -> dict:
        decode = [r for r in self.rounds if r.phase == "decode"]
        return {
            "strategy": self.strategy,
            "K": self.K,
            "requests": len(self.requests),
            "new_tokens": self.new_tokens,
            "wall_s": self.wall_s,
            "tokens_per_s": self.tokens_per_s,
            **summarize([r.latency for r in self.requests if r.chunk_times_s]),
            "rounds": len(decode),
            "target_forwards": len(self.rounds),
            "mean_accepted": self.mean_accepted,
            "alpha": self.acceptance_rate,
            "accepted_hist": {int(k): v for k, v in sorted(self.accepted_hist.items())},
            "median_verify_ms": median(r.verify_ms for r in decode) if decode else 0.0,
            "median_draft_ms": median(r.draft_ms for r in decode) if decode else 0.0,
            **ssd_summary(decode),
        }

    def write_rounds(self, path: str | Path) -> None:
        """Write the per-round records as JSONL (one object per round)."""
        with open(path, "w", encoding="utf-8") as f:
            for record in self.rounds:
                f.write(record.to_json() + "\n")


@dataclass
class ServingStats:
    """Cumulative counters of an engine that serves requests (a snapshot; /metrics reads it)."""

    strategy: str  # the strategy in use now ("sd" or "ar" after an SSD worker fault)
    running: int = 0
    waiting: int = 0
    requests_finished: int = 0
    requests_aborted: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    rounds: int = 0  # decode rounds (steps with at least one running sequence)
    row_rounds: int = 0  # sequence-rounds
    row_tokens: int = 0  # tokens emitted in those sequence-rounds
    accepted: int = 0  # draft tokens accepted and emitted (a row cut short by a stop counts what it emitted)
    rejections: int = 0  # sequence-rounds that rejected a draft token (α = accepted / (accepted + rejections))
    drafts: int = 0  # sequence-rounds with a speculation (K > 0): vLLM's num_drafts
    draft_tokens: int = 0  # draft tokens proposed, K per sequence-round: vLLM's num_draft_tokens
    accepted_per_position: tuple[int, ...] = ()  # [i]: sequence-rounds whose draft token i + 1 was accepted
    ssd_lookups: int = 0
    ssd_hits: int = 0
    ssd_lookups_by_k: tuple[int, ...] = ()  # [k]: cache lookups for an outcome of k accepted tokens
    ssd_hits_by_k: tuple[int, ...] = ()
    backup_s: float = 0.0  # SSD: the backup's drafting time on the critical path (cache misses)
    fallbacks: int = 0  # SSD worker faults (each switches to the fallback for good)
    cached_tokens: int = 0  # tokens of the running sequences (prompt + output): what the target's KV cache holds
    cache_capacity_tokens: int | None = None  # max_num_seqs × the model's context (None: no limit known)
    # the target's block KV cache (engine.blocks): blocks rows hold, and the budget's blocks (None: no budget)
    kv_blocks_used: int = 0
    kv_blocks_total: int | None = None
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache (vLLM's prefix_cache_queries)
    prefix_cache_hits: int = 0  # of those, found cached (vLLM's prefix_cache_hits)

    @property
    def tokens_per_round(self) -> float:
        return self.row_tokens / self.row_rounds if self.row_rounds else 0.0

    @property
    def alpha(self) -> float:
        n = self.accepted + self.rejections
        return self.accepted / n if n else 0.0

    @property
    def hit_rate(self) -> float:
        return self.ssd_hits / self.ssd_lookups if self.ssd_lookups else 0.0

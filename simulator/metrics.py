"""What a simulation measures: a cheap `Recorder` the actors write to, and the `SimResult` it becomes.

Latency follows theory.latency (vLLM's serving benchmark): TTFT from arrival to the first token, ITL the gap
between successive emissions (chunks) of a request (a speculative round's tokens are one chunk: one gap),
TPOT (E2EL − TTFT) / (tokens − 1) and E2EL from arrival to the last token, per finished request.

The hit rate is HIT_RATE_DEFINITION; `batch_hit_rate` (JSON: `all_rows_hit_round_rate`) is the other figure
a batch gives: the fraction of SSD rounds in which every row's outcome was in the cache, where a new
sequence's first round (no cache yet) counts as a miss.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from theory.latency import statistics

PERCENTILES = (50, 90, 99)
HIT_RATE_DEFINITION = (
    "the fraction of SSD verification rounds, counted per sequence, whose outcome was in the "
    "speculation cache; each sequence's first round, which has no cache yet, is left out"
)


class Recorder:
    """Counters and samples, appended to by the processes. Plain attributes: a round costs a few adds."""

    def __init__(self, K: int, trace: bool) -> None:
        self.rounds = 0
        self.tokens = 0
        self.accepted_hist = [0] * (K + 1)  # sequence-rounds by k
        self.hits_by_k = [0] * (K + 1)  # cache lookups after a round that accepted k: hit
        self.misses_by_k = [0] * (K + 1)
        self.batch_lookups = 0
        self.batch_all_hit = 0
        self.occupancy_ms = 0.0  # ∫ sequences in the batch dt, over decode rounds
        self.ttft_ms: list[float] = []  # per started request: arrival → first token
        self.itl_ms: list[float] = []  # per emission after the first: gap since the request's previous emission
        self.tpot_ms: list[float] = []  # per finished request of two tokens or more
        self.e2el_ms: list[float] = []  # per finished request: arrival → last token
        self.completed = 0
        # time per actor and activity, ms
        self.target = {"verify": 0.0, "prefill": 0.0, "overhead": 0.0, "wait_draft": 0.0, "idle": 0.0}
        self.draft = {"draft": 0.0, "cache_build": 0.0, "backup": 0.0, "prefill": 0.0}
        self.spans: list[tuple[str, str, float, float]] | None = [] if trace else None

    def span(self, actor: str, what: str, start_ms: float, end_ms: float) -> None:
        if self.spans is not None and end_ms > start_ms:
            self.spans.append((actor, what, start_ms, end_ms))


def latency_stats(samples_ms: list[float]) -> dict[str, float]:
    """mean, p50, p90, p99 in ms (theory.latency.statistics); NaN when there is no sample."""
    stats = statistics(samples_ms, PERCENTILES)
    return {"mean": stats["mean"], **{f"p{p}": stats[f"p{p}"] for p in PERCENTILES}}


@dataclass(frozen=True)
class SimResult:
    """The figures of one simulated configuration. Times in ms, rates per second of simulated time."""

    strategy: str
    settings: dict
    sim_ms: float
    rounds: int
    tokens: int
    completed_requests: int
    tokens_per_s: float
    decode_tokens_per_s: float  # tokens after the first of each request, per second of decoding (no prefill, no idle)
    tokens_per_s_per_seq: float
    tokens_per_s_per_accelerator: float
    accelerators: int
    mean_batch: float
    # latency (theory.latency's definitions): mean, p50, p90, p99 in ms; NaN without a sample
    ttft_ms: dict
    itl_ms: dict
    tpot_ms: dict
    e2el_ms: dict
    hit_rate: float | None  # HIT_RATE_DEFINITION; None without SSD lookups
    batch_hit_rate: float | None  # rounds whose every row hit (a new sequence's first round: a miss)
    mean_accepted: float
    acceptance_rate: float  # α̂: accepted / (accepted + rejections), the i.i.d. maximum-likelihood estimate
    tokens_per_round: float
    accepted_hist: list[int]
    hits_by_k: list[int]
    misses_by_k: list[int]
    breakdown_ms: dict = field(default_factory=dict)
    # (actor, activity, start_ms, end_ms) spans, in the order they ended; only when tracing
    timeline: tuple | None = field(default=None, repr=False)

    def to_dict(self) -> dict:
        out = asdict(self)
        del out["timeline"]
        # one hit rate under its own name; the whole-batch figure under a name that says what it counts
        out["all_rows_hit_round_rate"] = out.pop("batch_hit_rate")
        return out

    def row(self) -> dict:
        """The headline figures, flat, for tables."""
        return {
            **self.settings,
            "tok/s": self.tokens_per_s,
            "tok/s/seq": self.tokens_per_s_per_seq,
            "tok/s/acc": self.tokens_per_s_per_accelerator,
            "ttft_p50_ms": self.ttft_ms["p50"],
            "ttft_p99_ms": self.ttft_ms["p99"],
            "itl_p50_ms": self.itl_ms["p50"],
            "itl_p99_ms": self.itl_ms["p99"],
            "tpot_p50_ms": self.tpot_ms["p50"],
            "tpot_p99_ms": self.tpot_ms["p99"],
            "e2el_p99_ms": self.e2el_ms["p99"],
            "hit": self.hit_rate,
            "tok/round": self.tokens_per_round,
        }


def summarize(
    rec: Recorder, strategy: str, settings: dict, sim_ms: float, accelerators: int, link_busy_ms: dict[str, float]
) -> SimResult:
    seconds = sim_ms / 1e3 if sim_ms > 0 else float("nan")
    tokens_per_s = rec.tokens / seconds
    mean_batch = rec.occupancy_ms / sim_ms if sim_ms > 0 else 0.0
    lookups = sum(rec.hits_by_k) + sum(rec.misses_by_k)
    seq_rounds = sum(rec.accepted_hist)
    accepted = sum(k * n for k, n in enumerate(rec.accepted_hist))
    mean_k = accepted / seq_rounds if seq_rounds else 0.0
    rejections = sum(rec.accepted_hist[:-1])  # every round that stopped before K
    decode_tokens = rec.tokens - len(rec.ttft_ms)  # the first token of each request comes from prefill
    decode_ms = sim_ms - rec.target["prefill"] - rec.target["idle"]
    return SimResult(
        strategy=strategy,
        settings=settings,
        sim_ms=sim_ms,
        rounds=rec.rounds,
        tokens=rec.tokens,
        completed_requests=rec.completed,
        tokens_per_s=tokens_per_s,
        decode_tokens_per_s=decode_tokens / decode_ms * 1e3 if decode_ms > 0 else 0.0,
        tokens_per_s_per_seq=tokens_per_s / mean_batch if mean_batch > 0 else 0.0,
        tokens_per_s_per_accelerator=tokens_per_s / accelerators,
        accelerators=accelerators,
        mean_batch=mean_batch,
        ttft_ms=latency_stats(rec.ttft_ms),
        itl_ms=latency_stats(rec.itl_ms),
        tpot_ms=latency_stats(rec.tpot_ms),
        e2el_ms=latency_stats(rec.e2el_ms),
        hit_rate=sum(rec.hits_by_k) / lookups if lookups else None,
        batch_hit_rate=rec.batch_all_hit / rec.batch_lookups if rec.batch_lookups else None,
        mean_accepted=mean_k,
        acceptance_rate=accepted / (accepted + rejections) if accepted + rejections else 0.0,
        tokens_per_round=decode_tokens / seq_rounds if seq_rounds else 0.0,
        accepted_hist=list(rec.accepted_hist),
        hits_by_k=list(rec.hits_by_k),
        misses_by_k=list(rec.misses_by_k),
        breakdown_ms={"target": dict(rec.target), "draft": dict(rec.draft), "link": dict(link_busy_ms)},
    )

"""What a soak (saguaro.bench.soak) records and reports: each request's kind and outcome, the server's memory
around the fault, the summary and its table (soak.json, soak.md)."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from statistics import median

import numpy as np

from saguaro.formatting import format_table

MAX_DURATION_S = 600.0
SETTLE_S = 15.0  # after the fault, the fallback loads what it needs (SD: the draft's weights in the server)


class Kind(str, Enum):
    STREAM = "stream"
    WHOLE = "whole"
    LEAVE = "leave mid-stream"
    BAD = "bad request"


class Outcome(str, Enum):
    OK = "ok"  # tokens equal the solo output (a stream left early: a prefix of it)
    REFUSED = "refused as expected"  # a bad request got its 4xx
    BUSY = "503"  # the server was full (counted, not a failure: it answered)
    MISMATCH = "tokens differ from solo"
    UNEXPECTED = "unexpected status"
    LOST = "lost"
    HUNG = "hung"


FAILURES = (Outcome.MISMATCH, Outcome.UNEXPECTED, Outcome.LOST, Outcome.HUNG)


@dataclass(frozen=True)
class SoakConfig:
    url: str  # the server's base URL, http://127.0.0.1:PORT (loopback only)
    model: str
    prompts: tuple[str | tuple[int, ...], ...]  # text or token ids, sent to /v1/completions
    duration_s: float = 60.0
    concurrency: int = 4
    max_tokens: int = 24
    seed: int = 0
    shares: tuple[float, float, float, float] = (0.45, 0.3, 0.15, 0.1)  # stream, whole, leave mid-stream, bad
    fault_at_s: float | None = None  # when to call the fault (seconds into the load)
    timeout_s: float = 120.0  # per request
    warmup_s: float | None = None  # seconds of load before the memory counts (None: a quarter of the time before
    # the fault, or of the whole load): new batch shapes and the allocator's pools settle in the first minutes

    def __post_init__(self) -> None:
        host = self.url.removeprefix("http://").split(":")[0].split("/")[0]
        if host not in ("127.0.0.1", "localhost", "[::1]"):
            raise ValueError(f"the soak talks to loopback only: give http://127.0.0.1:PORT, got {self.url!r}")
        if not 0 < self.duration_s <= MAX_DURATION_S:
            raise ValueError(f"duration must be in (0, {MAX_DURATION_S:g}] seconds, got {self.duration_s}")
        if not self.prompts or self.concurrency < 1 or self.max_tokens < 1:
            raise ValueError("give at least one prompt, concurrency >= 1 and max_tokens >= 1")
        if len(self.shares) != len(Kind) or abs(sum(self.shares) - 1) > 1e-9 or min(self.shares) < 0:
            raise ValueError(f"shares must be {len(Kind)} non-negative numbers summing to 1, got {self.shares}")
        if self.warmup_s is not None and not 0 <= self.warmup_s < (self.fault_at_s or self.duration_s):
            raise ValueError(f"the warm-up must end before the fault and the load's end, got {self.warmup_s} s")

    @property
    def warmup_end_s(self) -> float:
        if self.warmup_s is not None:
            return self.warmup_s
        return (self.fault_at_s if self.fault_at_s is not None else self.duration_s) / 4


@dataclass
class Sent:
    """One request of the soak."""

    kind: Kind
    prompt: int | None  # index into the prompts (bad requests: None)
    outcome: Outcome
    started_s: float  # after the load's start
    ttft_s: float | None = None
    status: int | None = None
    detail: str = ""


@dataclass
class SoakResult:
    config: SoakConfig
    solo: list[list[int]]
    requests: list[Sent] = field(default_factory=list)
    rss_at_start: int | None = None  # after the solo pass, before the load
    rss_end: int | None = None
    rss_samples: list[tuple[float, int]] = field(default_factory=list)  # (seconds into the load, bytes)
    fault_s: float | None = None  # when the fault was injected (None: no fault)
    healthy_at_end: bool = False
    running_at_end: float | None = None  # saguaro:num_requests_running (None: not read)

    @property
    def failures(self) -> int:
        return sum(r.outcome in FAILURES for r in self.requests)

    @property
    def passed(self) -> bool:
        return self.failures == 0 and self.healthy_at_end and not self.running_at_end

    @property
    def rss_after_warmup(self) -> int | None:
        """The first sample once the warm-up is over (None: none taken)."""
        return next((rss for t, rss in self.rss_samples if t >= self.config.warmup_end_s), None)

    def rss_slope(self, start_s: float, end_s: float) -> float | None:
        """The least-squares growth of the RSS from `start_s` up to (not including) `end_s` of the load, MiB per
        minute (None: fewer than two samples): a leak keeps a slope, a settling allocator flattens."""
        points = [(t, rss) for t, rss in self.rss_samples if start_s <= t < end_s]
        if len(points) < 2:
            return None
        t, rss = np.array(points, dtype=float).T
        return float(np.polyfit(t / 60.0, rss / 2**20, 1)[0])

    def rss_series(self, every_s: float = 5.0) -> list[tuple[float, float]]:
        """(seconds into the load, MiB), one sample each `every_s`."""
        out, next_t = [], 0.0
        for t, rss in self.rss_samples:
            if t >= next_t:
                out.append((round(t, 1), round(rss / 2**20, 1)))
                next_t = t + every_s
        return out

    def rss_around_fault(self) -> tuple[int | None, int | None]:
        """The server's RSS just before the fault, and once SETTLE_S have passed after it (None: no fault or no
        sample): the growth before and after those two is what the load itself adds, the step between them is
        the fallback's."""
        if self.fault_s is None:
            return None, None
        before = [rss for t, rss in self.rss_samples if t < self.fault_s]
        after = [rss for t, rss in self.rss_samples if t >= self.fault_s + SETTLE_S]
        return (before[-1] if before else None), (after[0] if after else None)

    def summary(self) -> dict:
        outcomes = Counter(r.outcome.value for r in self.requests)
        kinds = Counter(r.kind.value for r in self.requests)
        ttfts = sorted(r.ttft_s for r in self.requests if r.ttft_s is not None and r.outcome is Outcome.OK)
        before, after = self.rss_around_fault()
        warm, end = self.config.warmup_end_s, self.config.duration_s
        fault = self.fault_s if self.fault_s is not None else end
        return {
            "duration_s": self.config.duration_s,
            "concurrency": self.config.concurrency,
            "requests": len(self.requests),
            "by_kind": dict(kinds),
            "outcomes": dict(outcomes),
            "failures": self.failures,
            "fault_s": self.fault_s,
            "healthy_at_end": self.healthy_at_end,
            "running_at_end": self.running_at_end,
            "warmup_s": warm,
            "rss_at_start_mib": _mib(self.rss_at_start),
            "rss_after_warmup_mib": _mib(self.rss_after_warmup),
            "rss_before_fault_mib": _mib(before),
            "rss_after_fault_mib": _mib(after),
            "rss_end_mib": _mib(self.rss_end),
            "rss_growth_before_fault": _growth(self.rss_after_warmup, before),
            "rss_growth_after_fault": _growth(after, self.rss_end),
            "rss_slope_before_fault_mib_min": self.rss_slope((warm + fault) / 2, fault),
            "rss_slope_after_fault_mib_min": self.rss_slope(fault + SETTLE_S, end)
            if self.fault_s is not None
            else None,
            "p50_ttft_ms": 1e3 * median(ttfts) if ttfts else None,
            "p99_ttft_ms": 1e3 * float(np.percentile(ttfts, 99)) if ttfts else None,
            "passed": self.passed,
        }


def markdown(summary: dict) -> str:
    """The soak's table: one row per kind of request, then the totals and the server's memory."""
    rows = [{"what": f"requests: {kind}", "value": n} for kind, n in sorted(summary["by_kind"].items())]
    rows += [{"what": f"outcome: {outcome}", "value": n} for outcome, n in sorted(summary["outcomes"].items())]

    def number(value, unit="", digits=1):
        return "n/a" if value is None else f"{value:.{digits}f}{unit}"

    def percent(value):
        return number(None if value is None else 100 * value, " %", 2)

    warm = summary["warmup_s"]

    rows += [
        {"what": "requests in all", "value": summary["requests"]},
        {"what": "failures (lost, hung, mismatched, unexpected status)", "value": summary["failures"]},
        {"what": "draft worker killed at", "value": number(summary["fault_s"], " s")},
        {
            "what": "healthy, no request running at the end",
            "value": "yes" if summary["healthy_at_end"] and not summary["running_at_end"] else "no",
        },
        {
            "what": "server RSS at the start of the load (after the solo pass)",
            "value": number(summary["rss_at_start_mib"], " MiB"),
        },
        {
            "what": f"server RSS after warm-up ({warm:g} s of load)",
            "value": number(summary["rss_after_warmup_mib"], " MiB"),
        },
        {"what": "server RSS just before the fault", "value": number(summary["rss_before_fault_mib"], " MiB")},
        {"what": f"server RSS {SETTLE_S:g} s after the fault", "value": number(summary["rss_after_fault_mib"], " MiB")},
        {"what": "server RSS at the end", "value": number(summary["rss_end_mib"], " MiB")},
        {"what": "RSS growth, warm-up to the fault", "value": percent(summary["rss_growth_before_fault"])},
        {"what": "RSS growth, after the fault to the end", "value": percent(summary["rss_growth_after_fault"])},
        {
            "what": "RSS slope, second half of the time before the fault",
            "value": number(summary["rss_slope_before_fault_mib_min"], " MiB/min"),
        },
        {
            "what": f"RSS slope, {SETTLE_S:g} s after the fault to the end",
            "value": number(summary["rss_slope_after_fault_mib_min"], " MiB/min"),
        },
        {"what": "TTFT p50 (streams)", "value": number(summary["p50_ttft_ms"], " ms", 0)},
        {"what": "TTFT p99 (streams)", "value": number(summary["p99_ttft_ms"], " ms", 0)},
    ]
    return format_table(rows, ["what", "value"], markdown=True) + "\n"


def _mib(rss: int | None) -> float | None:
    return None if rss is None else rss / 2**20


def _growth(first: int | None, last: int | None) -> float | None:
    return last / first - 1 if first and last else None


def write(result: SoakResult, out_dir) -> dict:
    """soak.json (summary, config, every request) and soak.md (the table) into out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = result.summary()
    requests = [{**asdict(r), "kind": r.kind.value, "outcome": r.outcome.value} for r in result.requests]
    (out / "soak.json").write_text(
        json.dumps(
            {"summary": summary, "config": asdict(result.config), "rss_mib": result.rss_series(), "requests": requests},
            indent=1,
        )
        + "\n"
    )
    (out / "soak.md").write_text(markdown(summary))
    return summary

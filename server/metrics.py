"""Prometheus metrics of one server, in a registry of its own (never the process-global one).

Two sources: what the server measures itself (requests by endpoint and status; TTFT, TPOT, ITL and
E2EL as defined in theory/latency.py, from the request's arrival to each chunk the server gets from the
engine, which for a stream is when it sends that chunk), and the engine's own counters, read from
`stats()` at every scrape.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from server.engine_api import ServingStats
from theory.glossary import Strategy
from theory.latency import RequestLatency

TTFT_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
TOKEN_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
E2E_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator, NaN when nothing was counted (never a 0 that reads as a measurement)."""
    return numerator / denominator if denominator else float("nan")


class EngineCollector(Collector):
    """The engine's stats snapshot as Prometheus families, read at scrape time."""

    def __init__(self, stats: Callable[[], ServingStats]):
        self._stats = stats

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        s = self._stats()
        yield GaugeMetricFamily("saguaro_requests_running", "Requests decoding in the batch now", value=s.running)
        yield GaugeMetricFamily("saguaro_requests_waiting", "Requests queued for a batch row", value=s.waiting)
        counters = {
            "saguaro_requests_finished": ("Requests the engine finished", s.requests_finished),
            "saguaro_requests_aborted": ("Requests aborted (client gone, shutdown)", s.requests_aborted),
            "saguaro_prompt_tokens": ("Prompt tokens prefilled", s.prompt_tokens),
            "saguaro_generation_tokens": ("Tokens generated", s.generation_tokens),
            "saguaro_rounds": ("Decode rounds of the batch", s.rounds),
            "saguaro_row_rounds": ("Decode rounds summed over batch rows", s.row_rounds),
            "saguaro_row_tokens": ("Tokens emitted summed over batch rows", s.row_tokens),
            "saguaro_accepted_tokens": ("Draft tokens accepted by the target", s.accepted),
            "saguaro_rejections": ("Rounds ended by a rejected draft token", s.rejections),
            "saguaro_ssd_lookups": ("SSD speculation-cache lookups", s.ssd_lookups),
            "saguaro_ssd_hits": ("SSD speculation-cache hits", s.ssd_hits),
            "saguaro_fallbacks": ("Strategy fallbacks after an SSD worker fault", s.fallbacks),
        }
        for name, (doc, value) in counters.items():
            yield CounterMetricFamily(name, doc, value=value)
        yield GaugeMetricFamily(
            "saguaro_acceptance_rate", "alpha = accepted / (accepted + rejections) since start (NaN before any)",
            value=ratio(s.accepted, s.accepted + s.rejections),
        )
        yield GaugeMetricFamily("saguaro_tokens_per_round", "Tokens emitted per row-round since start",
                                value=ratio(s.row_tokens, s.row_rounds))
        yield GaugeMetricFamily("saguaro_ssd_hit_rate", "SSD cache hits / lookups since start",
                                value=ratio(s.ssd_hits, s.ssd_lookups))
        strategy = GaugeMetricFamily("saguaro_strategy", "1 for the strategy in use (ar, sd, ssd)", labels=["strategy"])
        for option in Strategy:
            strategy.add_metric([option.value], 1.0 if option.value == s.strategy else 0.0)
        yield strategy


class ServerMetrics:
    """Counters and histograms the server records, plus the engine's, in one registry."""

    def __init__(self, stats: Callable[[], ServingStats]):
        self.registry = CollectorRegistry()
        self.requests = Counter("saguaro_http_requests", "HTTP requests by endpoint and status code",
                                ["endpoint", "status"], registry=self.registry)
        self.ttft = Histogram("saguaro_time_to_first_token_seconds", "TTFT: arrival to the first token sent",
                              buckets=TTFT_BUCKETS_S, registry=self.registry)
        self.tpot = Histogram("saguaro_time_per_output_token_seconds",
                              "TPOT: (E2EL - TTFT) / (output tokens - 1), requests of 2+ tokens",
                              buckets=TOKEN_BUCKETS_S, registry=self.registry)
        self.itl = Histogram("saguaro_inter_token_latency_seconds", "ITL: gap between successive chunks sent",
                             buckets=TOKEN_BUCKETS_S, registry=self.registry)
        self.e2el = Histogram("saguaro_e2e_request_latency_seconds", "E2EL: arrival to the last token sent",
                              buckets=E2E_BUCKETS_S, registry=self.registry)
        self.registry.register(EngineCollector(stats))

    def observe(self, latency: RequestLatency) -> None:
        self.ttft.observe(latency.ttft_s)
        if latency.tpot_s is not None:
            self.tpot.observe(latency.tpot_s)
        for gap in latency.itl_s:
            self.itl.observe(gap)
        self.e2el.observe(latency.e2el_s)

    def exposition(self) -> bytes:
        """The registry in Prometheus' text format."""
        return generate_latest(self.registry)

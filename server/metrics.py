"""Prometheus metrics of one server, in a registry of its own (never the process-global one).

Names and meanings are vLLM's (docs/serving.md lists them) under the prefix `saguaro:`, every series labelled
with `model_name`, so a dashboard built for vLLM reads them once its `vllm:` is replaced; SSD's own counters
stand beside them (`saguaro:ssd_*`). Two sources: what the server measures itself (HTTP requests by endpoint and
status; per request TTFT, ITL, TPOT and E2EL as theory/latency.py defines them, from the request's arrival to each
chunk the server gets from the engine, which for a stream is when it sends that chunk; queue, prefill and decode
times; lengths and finish reasons), and the engine's counters and gauges, read from `stats()` at every scrape.
Rates over a window (acceptance rate = accepted / draft tokens, mean acceptance length = 1 + accepted / drafts,
SSD hit rate) are the dashboard's to compute from the counters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from server.engine_api import ServingStats
from theory.glossary import Strategy
from theory.latency import RequestLatency

PREFIX = "saguaro:"
TTFT_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
TOKEN_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
E2E_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)
LENGTH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)


def ratio(numerator: float, denominator: float | None) -> float:
    """numerator / denominator, NaN when nothing was counted (never a 0 that reads as a measurement)."""
    return numerator / denominator if denominator else float("nan")


@dataclass(frozen=True)
class FinishedRequest:
    """What the server saw of one request that reached the engine, once it ended."""

    latency: RequestLatency | None  # None: no token was sent
    finish_reason: str  # "stop", "length" or "abort" (the client left, or the server shut down)
    prompt_tokens: int | None
    output_tokens: int
    max_tokens: int
    arrival_s: float
    scheduled_s: float | None  # when the engine took it from its waiting queue (perf_counter)
    first_s: float | None  # when its first token reached the server
    last_s: float | None  # and its last


class EngineCollector(Collector):
    """The engine's stats snapshot as Prometheus families, read at scrape time."""

    def __init__(self, stats: Callable[[], ServingStats], model_name: str):
        self._stats = stats
        self._model = model_name

    def _family(self, kind, name: str, doc: str, value: float | None = None, labels: tuple[str, ...] = ()):
        family = kind(PREFIX + name, doc, labels=["model_name", *labels])
        if value is not None:
            family.add_metric([self._model], value)
        return family

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        s, gauge, counter = self._stats(), GaugeMetricFamily, CounterMetricFamily
        yield self._family(gauge, "num_requests_running", "Requests in the batch (prefilling or decoding)", s.running)
        yield self._family(gauge, "num_requests_waiting", "Requests waiting for a batch row", s.waiting)
        yield self._family(gauge, "kv_cache_usage_perc", "Tokens the target's KV cache holds over max_num_seqs x "
                           "the context (1 = full; NaN without a known capacity)",
                           ratio(s.cached_tokens, s.cache_capacity_tokens))
        yield self._family(counter, "prompt_tokens", "Prompt tokens prefilled", s.prompt_tokens)
        yield self._family(counter, "generation_tokens", "Tokens generated", s.generation_tokens)
        yield self._family(counter, "decode_rounds", "Decode rounds of the batch (one target forward each)", s.rounds)
        yield self._family(counter, "spec_decode_num_drafts", "Speculations verified: sequence-rounds with K > 0",
                           s.drafts)
        yield self._family(counter, "spec_decode_num_draft_tokens", "Draft tokens verified (K per speculation)",
                           s.draft_tokens)
        yield self._family(counter, "spec_decode_num_accepted_tokens", "Draft tokens accepted and emitted",
                           s.accepted)
        per_position = self._family(counter, "spec_decode_num_accepted_tokens_per_pos",
                                    "Speculations whose draft token at `position` (0 = the first) was accepted",
                                    labels=("position",))
        for position, count in enumerate(s.accepted_per_position):
            per_position.add_metric([self._model, str(position)], count)
        yield per_position
        lookups = self._family(counter, "ssd_cache_lookups", "SSD speculation-cache lookups, by the outcome's "
                               "accepted count k", labels=("k",))
        hits = self._family(counter, "ssd_cache_hits", "SSD speculation-cache hits, by the outcome's accepted "
                            "count k", labels=("k",))
        for k, (n, hit) in enumerate(zip(s.ssd_lookups_by_k, s.ssd_hits_by_k)):
            lookups.add_metric([self._model, str(k)], n)
            hits.add_metric([self._model, str(k)], hit)
        yield lookups
        yield hits
        yield self._family(counter, "ssd_backup_seconds", "SSD: the backup's drafting on the critical path (misses)",
                           s.backup_s)
        yield self._family(counter, "ssd_fallbacks", "Strategy fallbacks after an SSD draft worker fault", s.fallbacks)
        strategy = self._family(gauge, "strategy", "1 for the strategy in use (ar, sd, ssd)", labels=("strategy",))
        for option in Strategy:
            strategy.add_metric([self._model, option.value], 1.0 if option.value == s.strategy else 0.0)
        yield strategy


class ServerMetrics:
    """Counters and histograms the server records, plus the engine's, in one registry."""

    def __init__(self, stats: Callable[[], ServingStats], model_name: str):
        self.registry = CollectorRegistry()
        self.model_name = model_name

        def histogram(name: str, doc: str, buckets) -> Histogram:
            return Histogram(PREFIX + name, doc, ["model_name"], buckets=buckets, registry=self.registry)

        self.requests = Counter(PREFIX + "http_requests", "HTTP requests by endpoint and status code",
                                ["model_name", "endpoint", "status"], registry=self.registry)
        self.success = Counter(PREFIX + "request_success", "Requests ended, by finish reason (stop, length, abort)",
                               ["model_name", "finished_reason"], registry=self.registry)
        self.ttft = histogram("time_to_first_token_seconds", "TTFT: arrival to the first token sent", TTFT_BUCKETS_S)
        self.itl = histogram("inter_token_latency_seconds", "ITL: gap between successive chunks sent", TOKEN_BUCKETS_S)
        self.tpot = histogram("request_time_per_output_token_seconds",
                              "TPOT: (E2EL - TTFT) / (output tokens - 1), requests of 2+ tokens", TOKEN_BUCKETS_S)
        self.e2el = histogram("e2e_request_latency_seconds", "E2EL: arrival to the last token sent", E2E_BUCKETS_S)
        self.queue = histogram("request_queue_time_seconds", "Arrival to leaving the engine's waiting queue",
                               TTFT_BUCKETS_S)
        self.prefill = histogram("request_prefill_time_seconds", "Leaving the waiting queue to the first token",
                                 TTFT_BUCKETS_S)
        self.decode = histogram("request_decode_time_seconds", "First token to last token", E2E_BUCKETS_S)
        self.inference = histogram("request_inference_time_seconds", "Leaving the waiting queue to the last token",
                                   E2E_BUCKETS_S)
        self.prompt_tokens = histogram("request_prompt_tokens", "Prompt tokens per request", LENGTH_BUCKETS)
        self.generation_tokens = histogram("request_generation_tokens", "Tokens generated per request",
                                           LENGTH_BUCKETS)
        self.max_tokens = histogram("request_params_max_tokens", "max_tokens asked per request", LENGTH_BUCKETS)
        self.registry.register(EngineCollector(stats, model_name))

    def count_request(self, endpoint: str, status: int) -> None:
        self.requests.labels(self.model_name, endpoint, str(status)).inc()

    def observe(self, done: FinishedRequest) -> None:
        """One request that reached the engine has ended."""
        m = self.model_name
        self.success.labels(m, done.finish_reason).inc()
        self.max_tokens.labels(m).observe(done.max_tokens)
        self.generation_tokens.labels(m).observe(done.output_tokens)
        if done.prompt_tokens is not None:
            self.prompt_tokens.labels(m).observe(done.prompt_tokens)
        latency = done.latency
        if latency is not None:
            self.ttft.labels(m).observe(latency.ttft_s)
            if latency.tpot_s is not None:
                self.tpot.labels(m).observe(latency.tpot_s)
            for gap in latency.itl_s:
                self.itl.labels(m).observe(gap)
            self.e2el.labels(m).observe(latency.e2el_s)
        if done.scheduled_s is not None:
            self.queue.labels(m).observe(max(0.0, done.scheduled_s - done.arrival_s))
            if done.first_s is not None and done.last_s is not None:
                self.prefill.labels(m).observe(max(0.0, done.first_s - done.scheduled_s))
                self.decode.labels(m).observe(done.last_s - done.first_s)
                self.inference.labels(m).observe(max(0.0, done.last_s - done.scheduled_s))

    def exposition(self) -> bytes:
        """The registry in Prometheus' text format."""
        return generate_latest(self.registry)

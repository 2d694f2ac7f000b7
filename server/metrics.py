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

from collections.abc import Callable, Iterator, Mapping
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

    def __init__(
        self,
        stats: Callable[[], ServingStats],
        model_name: str,
        by_replica: Callable[[], Mapping[str, ServingStats]] | None = None,
    ):
        """by_replica: the stats of each engine replica by its id, when several serve (server.replicas): then
        every family has one series per replica, labelled `replica`."""
        self._stats = stats
        self._model = model_name
        self._by_replica = by_replica

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        if self._by_replica is None:
            snapshots = [((self._model,), self._stats())]
        else:
            snapshots = [((self._model, replica), s) for replica, s in self._by_replica().items()]
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
        for labels, stats in snapshots:
            for family in self._families(stats, labels):
                if family.name in families:
                    families[family.name].samples.extend(family.samples)
                else:
                    families[family.name] = family
        yield from families.values()  # none before the first replica reports

    def _families(self, z: ServingStats, labels: tuple[str, ...]):
        """The families of one engine's stats, each series labelled `labels`."""
        names = ["model_name"] if self._by_replica is None else ["model_name", "replica"]
        gauge, counter = GaugeMetricFamily, CounterMetricFamily

        def family(kind, name: str, doc: str, value=None, extra: tuple[str, ...] = ()):
            made = kind(PREFIX + name, doc, labels=[*names, *extra])
            if value is not None:
                made.add_metric(list(labels), value)
            return made

        def add(made, extra: tuple[str, ...], value: float) -> None:
            made.add_metric([*labels, *extra], value)

        yield family(gauge, "num_requests_running", "Requests in the batch (prefilling or decoding)", z.running)
        yield family(gauge, "num_requests_waiting", "Requests waiting for a batch row", z.waiting)
        yield family(
            gauge,
            "kv_cache_usage_perc",
            "Tokens the target's KV cache holds over max_num_seqs x "
            "the context (1 = full; NaN without a known capacity)",
            ratio(z.cached_tokens, z.cache_capacity_tokens),
        )
        yield family(
            gauge, "kv_cache_blocks_used", "Blocks of the target's KV cache that requests hold", z.kv_blocks_used
        )
        if z.kv_blocks_total is not None:
            yield family(gauge, "kv_cache_blocks_total", "Blocks the target's KV cache budget holds", z.kv_blocks_total)
        yield family(
            counter, "prefix_cache_queries", "Prompt tokens looked up in the prefix cache", z.prefix_cache_queries
        )
        yield family(
            counter,
            "prefix_cache_hits",
            "Prompt tokens found in the prefix cache (their prefill skipped)",
            z.prefix_cache_hits,
        )
        yield family(counter, "prompt_tokens", "Prompt tokens prefilled", z.prompt_tokens)
        yield family(counter, "generation_tokens", "Tokens generated", z.generation_tokens)
        yield family(counter, "decode_rounds", "Decode rounds of the batch (one target forward each)", z.rounds)
        yield family(counter, "spec_decode_num_drafts", "Speculations verified: sequence-rounds with K > 0", z.drafts)
        yield family(
            counter, "spec_decode_num_draft_tokens", "Draft tokens verified (K per speculation)", z.draft_tokens
        )
        yield family(counter, "spec_decode_num_accepted_tokens", "Draft tokens accepted and emitted", z.accepted)
        per_position = family(
            counter,
            "spec_decode_num_accepted_tokens_per_pos",
            "Speculations whose draft token at `position` (0 = the first) was accepted",
            extra=("position",),
        )
        for position, count in enumerate(z.accepted_per_position):
            add(per_position, (str(position),), count)
        yield per_position
        lookups = family(
            counter,
            "ssd_cache_lookups",
            "SSD speculation-cache lookups, by the outcome's accepted count k",
            extra=("k",),
        )
        hits = family(
            counter, "ssd_cache_hits", "SSD speculation-cache hits, by the outcome's accepted count k", extra=("k",)
        )
        for k, (n, hit) in enumerate(zip(z.ssd_lookups_by_k, z.ssd_hits_by_k, strict=True)):
            add(lookups, (str(k),), n)
            add(hits, (str(k),), hit)
        yield lookups
        yield hits
        yield family(
            counter, "ssd_backup_seconds", "SSD: the backup's drafting on the critical path (misses)", z.backup_s
        )
        yield family(counter, "ssd_fallbacks", "Strategy fallbacks after an SSD draft worker fault", z.fallbacks)
        strategy = family(gauge, "strategy", "1 for the strategy in use (ar, sd, ssd)", extra=("strategy",))
        for option in Strategy:
            add(strategy, (option.value,), 1.0 if option.value == z.strategy else 0.0)
        yield strategy


class ServerMetrics:
    """Counters and histograms the server records, plus the engine's, in one registry."""

    def __init__(
        self,
        stats: Callable[[], ServingStats],
        model_name: str,
        by_replica: Callable[[], Mapping[str, ServingStats]] | None = None,
    ):
        self.registry = CollectorRegistry()
        self.model_name = model_name

        def histogram(name: str, doc: str, buckets) -> Histogram:
            return Histogram(PREFIX + name, doc, ["model_name"], buckets=buckets, registry=self.registry)

        self.requests = Counter(
            PREFIX + "http_requests",
            "HTTP requests by endpoint and status code",
            ["model_name", "endpoint", "status"],
            registry=self.registry,
        )
        self.success = Counter(
            PREFIX + "request_success",
            "Requests ended, by finish reason (stop, length, abort)",
            ["model_name", "finished_reason"],
            registry=self.registry,
        )
        self.ttft = histogram("time_to_first_token_seconds", "TTFT: arrival to the first token sent", TTFT_BUCKETS_S)
        self.itl = histogram("inter_token_latency_seconds", "ITL: gap between successive chunks sent", TOKEN_BUCKETS_S)
        self.tpot = histogram(
            "request_time_per_output_token_seconds",
            "TPOT: (E2EL - TTFT) / (output tokens - 1), requests of 2+ tokens",
            TOKEN_BUCKETS_S,
        )
        self.e2el = histogram("e2e_request_latency_seconds", "E2EL: arrival to the last token sent", E2E_BUCKETS_S)
        self.queue = histogram(
            "request_queue_time_seconds", "Arrival to leaving the engine's waiting queue", TTFT_BUCKETS_S
        )
        self.prefill = histogram(
            "request_prefill_time_seconds", "Leaving the waiting queue to the first token", TTFT_BUCKETS_S
        )
        self.decode = histogram("request_decode_time_seconds", "First token to last token", E2E_BUCKETS_S)
        self.inference = histogram(
            "request_inference_time_seconds", "Leaving the waiting queue to the last token", E2E_BUCKETS_S
        )
        self.prompt_tokens = histogram("request_prompt_tokens", "Prompt tokens per request", LENGTH_BUCKETS)
        self.generation_tokens = histogram("request_generation_tokens", "Tokens generated per request", LENGTH_BUCKETS)
        self.max_tokens = histogram("request_params_max_tokens", "max_tokens asked per request", LENGTH_BUCKETS)
        self.registry.register(EngineCollector(stats, model_name, by_replica))

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

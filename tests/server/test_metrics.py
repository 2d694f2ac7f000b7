"""/metrics: Prometheus text of the server's own registry, the server's latencies and the engine's counters."""

from __future__ import annotations

import dataclasses
import logging

from prometheus_client.parser import text_string_to_metric_families

from server import ServerSettings, create_app
from tests.server.fake import FakeEngine, FakeModel

BODY = {"model": "fake-model", "prompt": "aa bbb", "max_tokens": 5}


def scrape(client) -> dict[str, list]:
    response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return {f.name: f.samples for f in text_string_to_metric_families(response.text)}


def value(samples, name: str, **labels) -> float:
    return next(s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def test_requests_are_counted_by_endpoint_and_status(client):
    client.post("/v1/completions", json=BODY)
    client.post("/v1/completions", json={**BODY, "n": 3})
    client.get("/v1/models")
    families = scrape(client)
    requests = families["saguaro_http_requests"]
    assert value(requests, "saguaro_http_requests_total", endpoint="/v1/completions", status="200") == 1
    assert value(requests, "saguaro_http_requests_total", endpoint="/v1/completions", status="400") == 1
    assert value(requests, "saguaro_http_requests_total", endpoint="/v1/models", status="200") == 1


def test_latency_histograms_count_each_finished_request(client):
    client.post("/v1/completions", json=BODY)
    client.post("/v1/completions", json={**BODY, "stream": True})
    families = scrape(client)
    assert value(families["saguaro_time_to_first_token_seconds"], "saguaro_time_to_first_token_seconds_count") == 2
    assert value(families["saguaro_time_per_output_token_seconds"], "saguaro_time_per_output_token_seconds_count") == 2
    # three chunks per request (2 + 2 + 1 tokens): two gaps each
    assert value(families["saguaro_inter_token_latency_seconds"], "saguaro_inter_token_latency_seconds_count") == 4
    assert value(families["saguaro_e2e_request_latency_seconds"], "saguaro_e2e_request_latency_seconds_count") == 2


def test_engine_counters_and_rates_come_from_its_stats(client, fake):
    fake.stats_now = dataclasses.replace(fake.stats_now, waiting=3, prompt_tokens=11, generation_tokens=40,
                                         row_rounds=10, row_tokens=25, accepted=30, rejections=10,
                                         ssd_lookups=8, ssd_hits=6, fallbacks=1, strategy="sd")
    families = scrape(client)
    assert value(families["saguaro_requests_waiting"], "saguaro_requests_waiting") == 3
    assert value(families["saguaro_prompt_tokens"], "saguaro_prompt_tokens_total") == 11
    assert value(families["saguaro_generation_tokens"], "saguaro_generation_tokens_total") == 40
    assert value(families["saguaro_acceptance_rate"], "saguaro_acceptance_rate") == 0.75
    assert value(families["saguaro_tokens_per_round"], "saguaro_tokens_per_round") == 2.5
    assert value(families["saguaro_ssd_hit_rate"], "saguaro_ssd_hit_rate") == 0.75
    assert value(families["saguaro_fallbacks"], "saguaro_fallbacks_total") == 1
    strategy = families["saguaro_strategy"]
    assert {s.labels["strategy"]: s.value for s in strategy} == {"ar": 0, "sd": 1, "ssd": 0}


def test_rates_are_nan_before_anything_was_counted(client):
    families = scrape(client)
    alpha = value(families["saguaro_acceptance_rate"], "saguaro_acceptance_rate")
    assert alpha != alpha  # NaN: no round yet, not a measured 0


def test_each_app_has_its_own_registry():
    first = create_app(FakeModel(), FakeEngine(), ServerSettings())
    second = create_app(FakeModel(), FakeEngine(), ServerSettings())
    assert first.state.ctx.metrics.registry is not second.state.ctx.metrics.registry


def test_a_fallback_is_logged_once(client, fake, caplog):
    fake.stats_now.fallbacks, fake.stats_now.strategy = 1, "sd"
    with caplog.at_level(logging.WARNING, logger="server"):
        client.post("/v1/completions", json=BODY)
        client.post("/v1/completions", json=BODY)
    assert [r.getMessage() for r in caplog.records if "fell back" in r.getMessage()] == [
        "engine fell back to strategy sd (fallback 1): see the engine's warning above"]

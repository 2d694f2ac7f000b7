"""/metrics: Prometheus text of the server's own registry, vLLM's names under `saguaro:` with a model_name label,
the server's per-request measurements and the engine's counters."""

from __future__ import annotations

import dataclasses
import logging
import math

from prometheus_client.parser import text_string_to_metric_families

from server import ServerSettings, create_app
from tests.server.fake import FakeEngine, FakeModel

BODY = {"model": "fake-model", "prompt": "aa bbb", "max_tokens": 5}
MODEL = {"model_name": "fake-model"}


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
    client.get("/v1/models/fake-model")
    requests = scrape(client)["saguaro:http_requests"]
    total = "saguaro:http_requests_total"
    assert value(requests, total, endpoint="/v1/completions", status="200", **MODEL) == 1
    assert value(requests, total, endpoint="/v1/completions", status="400", **MODEL) == 1
    assert value(requests, total, endpoint="/v1/models", status="200", **MODEL) == 1
    assert value(requests, total, endpoint="/v1/models/{model}", status="200", **MODEL) == 1


def test_latency_histograms_count_each_finished_request(client):
    client.post("/v1/completions", json=BODY)
    client.post("/v1/completions", json={**BODY, "stream": True})
    families = scrape(client)
    for name in (
        "time_to_first_token_seconds",
        "request_time_per_output_token_seconds",
        "e2e_request_latency_seconds",
        "request_queue_time_seconds",
        "request_prefill_time_seconds",
        "request_decode_time_seconds",
        "request_inference_time_seconds",
        "request_prompt_tokens",
        "request_generation_tokens",
        "request_params_max_tokens",
    ):
        assert value(families[f"saguaro:{name}"], f"saguaro:{name}_count", **MODEL) == 2, name
    # three chunks per request (2 + 2 + 1 tokens): two gaps each
    assert value(families["saguaro:inter_token_latency_seconds"], "saguaro:inter_token_latency_seconds_count") == 4
    assert value(families["saguaro:request_generation_tokens"], "saguaro:request_generation_tokens_sum") == 10


def test_finished_requests_are_counted_by_reason(client):
    client.post("/v1/completions", json=BODY)
    client.post("/v1/completions", json={**BODY, "stop": "w6"})
    success = scrape(client)["saguaro:request_success"]
    assert value(success, "saguaro:request_success_total", finished_reason="length", **MODEL) == 1
    assert value(success, "saguaro:request_success_total", finished_reason="stop", **MODEL) == 1


def test_speculative_counters_are_vllms_from_the_engines_stats(client, fake):
    fake.stats_now = dataclasses.replace(
        fake.stats_now,
        waiting=3,
        prompt_tokens=11,
        generation_tokens=40,
        drafts=10,
        draft_tokens=40,
        accepted=25,
        accepted_per_position=(9, 8, 5, 3),
        fallbacks=1,
        strategy="sd",
    )
    families = scrape(client)
    assert value(families["saguaro:num_requests_waiting"], "saguaro:num_requests_waiting", **MODEL) == 3
    assert value(families["saguaro:prompt_tokens"], "saguaro:prompt_tokens_total", **MODEL) == 11
    assert value(families["saguaro:generation_tokens"], "saguaro:generation_tokens_total", **MODEL) == 40
    assert value(families["saguaro:spec_decode_num_drafts"], "saguaro:spec_decode_num_drafts_total") == 10
    assert value(families["saguaro:spec_decode_num_draft_tokens"], "saguaro:spec_decode_num_draft_tokens_total") == 40
    accepted = families["saguaro:spec_decode_num_accepted_tokens"]
    assert value(accepted, "saguaro:spec_decode_num_accepted_tokens_total") == 25
    per_position = families["saguaro:spec_decode_num_accepted_tokens_per_pos"]
    assert {s.labels["position"]: s.value for s in per_position} == {"0": 9, "1": 8, "2": 5, "3": 3}
    assert value(families["saguaro:ssd_fallbacks"], "saguaro:ssd_fallbacks_total") == 1
    strategy = families["saguaro:strategy"]
    assert {s.labels["strategy"]: s.value for s in strategy} == {"ar": 0, "sd": 1, "ssd": 0}


def test_ssd_lookups_and_hits_are_counted_by_k(client, fake):
    fake.stats_now = dataclasses.replace(
        fake.stats_now, ssd_lookups_by_k=(4, 2, 0), ssd_hits_by_k=(3, 1, 0), backup_s=1.5
    )
    families = scrape(client)
    assert {s.labels["k"]: s.value for s in families["saguaro:ssd_cache_lookups"]} == {"0": 4, "1": 2, "2": 0}
    assert {s.labels["k"]: s.value for s in families["saguaro:ssd_cache_hits"]} == {"0": 3, "1": 1, "2": 0}
    assert value(families["saguaro:ssd_backup_seconds"], "saguaro:ssd_backup_seconds_total") == 1.5


def test_kv_cache_usage_is_the_share_of_the_capacity_in_use(client, fake):
    fake.stats_now = dataclasses.replace(fake.stats_now, cached_tokens=64, cache_capacity_tokens=256)
    assert value(scrape(client)["saguaro:kv_cache_usage_perc"], "saguaro:kv_cache_usage_perc") == 0.25


def test_kv_cache_usage_is_nan_without_a_known_capacity(client):
    assert math.isnan(value(scrape(client)["saguaro:kv_cache_usage_perc"], "saguaro:kv_cache_usage_perc"))


def test_every_series_carries_the_served_model_name(client):
    client.post("/v1/completions", json=BODY)
    samples = [s for family in scrape(client).values() for s in family]
    assert samples and all(s.labels.get("model_name") == "fake-model" for s in samples)


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
        "engine fell back to strategy sd (fallback 1): see the engine's warning above"
    ]

"""`sampling_mode`, `system_fingerprint` and `reproducible` against the fake engine (an SSD with K = 4 unless a test
gives the fake model other settings), and the fingerprint's rule on engine configs."""

from __future__ import annotations

import httpx
import pytest
from openai import OpenAI

from engine import SamplingParams, SpeculativeConfig
from engine.config import EngineConfig
from engine.reproducibility import unreproducible_reason
from engine.sampling_params import SamplingMode
from server.reproducibility import NO_SEED, reproducibility, system_fingerprint
from tests.server.conftest import running
from tests.server.fake import FakeEngine, FakeModel, fake_config
from tests.server.sse import DONE, stream

SEEDED = {"model": "fake-model", "prompt": "aa bbb", "max_tokens": 5, "temperature": 0.8, "seed": 7}
CHAT = {
    "model": "fake-model",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 3,
    "temperature": 0.8,
    "seed": 7,
}
FINAL_FIELDS = ("reproducible", "unreproducible_reason")


def served_with(config: EngineConfig):
    return running(FakeModel(config=config), FakeEngine())


def post(server, path: str, body: dict) -> httpx.Response:
    with httpx.Client(base_url=server.url, timeout=10) as client:
        return client.post(path, json=body)


# -- the request field --------------------------------------------------------------------------------------------
def test_sampling_mode_is_standard_unless_asked(client, fake):
    client.post("/v1/completions", json=SEEDED)
    assert fake.requests[0][2].sampling_mode is SamplingMode.STANDARD


def test_sampling_mode_invariant_reaches_the_engine_from_both_endpoints(client, fake):
    client.post("/v1/completions", json={**SEEDED, "sampling_mode": "invariant"})
    client.post("/v1/chat/completions", json={**CHAT, "sampling_mode": "invariant", "stream": True})
    assert [r[2].sampling_mode for r in fake.requests] == [SamplingMode.INVARIANT] * 2


@pytest.mark.parametrize("value", ["bogus", "INVARIANT", None, 1, ["invariant"]])
def test_a_bad_sampling_mode_is_a_400_naming_the_field(client, fake, value):
    response = client.post("/v1/completions", json={**SEEDED, "sampling_mode": value})
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == "sampling_mode"
    assert error["type"] == "invalid_request_error" and "standard, invariant" in error["message"]
    assert fake.requests == []


# -- what the responses say ---------------------------------------------------------------------------------------
def test_a_seeded_response_on_fixed_settings_is_reproducible_and_names_them(client):
    body = client.post("/v1/completions", json=SEEDED).json()
    assert body["system_fingerprint"] == system_fingerprint(fake_config(), SamplingMode.STANDARD)
    assert body["system_fingerprint"].split(":")[2] == "ssd,K=4,backup=neural,C=1"
    assert (body["reproducible"], body["unreproducible_reason"]) == (True, None)


def test_adaptive_K_makes_a_standard_response_unreproducible_with_the_engines_reason():
    config = fake_config(K="auto")
    with served_with(config) as server:
        body = post(server, "/v1/completions", SEEDED).json()
    reason = unreproducible_reason(config.strategy, config.speculative, SamplingParams(temperature=0.8, seed=7))
    assert body["reproducible"] is False and body["unreproducible_reason"] == reason
    assert "adaptive K" in reason and ":ssd,K=auto(1..8)," in body["system_fingerprint"]


def test_adaptive_K_with_invariant_sampling_is_reproducible():
    with served_with(fake_config(K="auto")) as server:
        body = post(server, "/v1/completions", {**SEEDED, "sampling_mode": "invariant"}).json()
    assert (body["reproducible"], body["unreproducible_reason"]) == (True, None)


def test_a_request_without_a_seed_is_unreproducible_unless_greedy(client):
    sampled = client.post("/v1/completions", json={**SEEDED, "seed": None}).json()
    greedy = client.post("/v1/completions", json={**SEEDED, "seed": None, "temperature": 0}).json()
    assert (sampled["reproducible"], sampled["unreproducible_reason"]) == (False, NO_SEED)
    assert (greedy["reproducible"], greedy["unreproducible_reason"]) == (True, None)


def test_a_chat_response_carries_the_same_fields(client):
    body = client.post("/v1/chat/completions", json={**CHAT, "sampling_mode": "invariant"}).json()
    assert body["system_fingerprint"] == system_fingerprint(fake_config(), SamplingMode.INVARIANT)
    assert body["reproducible"] is True and body["unreproducible_reason"] is None


@pytest.mark.parametrize("path, body", [("/v1/completions", SEEDED), ("/v1/chat/completions", CHAT)])
def test_every_chunk_has_the_fingerprint_and_only_the_last_says_reproducible(client, path, body):
    events = stream(client, path, {**body, "seed": None})
    chunks = events[:-1]
    assert events[-1] == DONE and len(chunks) >= 2
    assert {c["system_fingerprint"] for c in chunks} == {system_fingerprint(fake_config(), SamplingMode.STANDARD)}
    assert all(not set(FINAL_FIELDS) & set(c) for c in chunks[:-1])
    assert (chunks[-1]["reproducible"], chunks[-1]["unreproducible_reason"]) == (False, NO_SEED)


def test_with_usage_the_finishing_chunk_and_the_usage_chunk_both_say_reproducible(client):
    events = stream(client, "/v1/completions", {**SEEDED, "stream_options": {"include_usage": True}})
    finishing, usage = events[-3], events[-2]
    assert finishing["choices"][0]["finish_reason"] == "length" and usage["choices"] == []
    assert finishing["reproducible"] is usage["reproducible"] is True


# -- the official client ------------------------------------------------------------------------------------------
def test_the_openai_client_reads_the_fingerprint_and_the_extra_fields():
    with served_with(fake_config(K="auto")) as server:
        client = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=10)
        completion = client.completions.create(model="fake-model", prompt="aa bbb", max_tokens=3, seed=7)
        chat = client.chat.completions.create(
            model="fake-model",
            messages=CHAT["messages"],
            max_tokens=3,
            seed=7,
            extra_body={"sampling_mode": "invariant"},
        )
        chunks = list(
            client.chat.completions.create(
                model="fake-model", messages=CHAT["messages"], max_tokens=3, seed=7, stream=True
            )
        )
    standard = system_fingerprint(fake_config(K="auto"), SamplingMode.STANDARD)
    assert completion.system_fingerprint == chunks[-1].system_fingerprint == standard
    assert (
        completion.model_extra["reproducible"] is False
        and "adaptive K" in completion.model_extra["unreproducible_reason"]
    )
    assert chat.system_fingerprint == system_fingerprint(fake_config(K="auto"), SamplingMode.INVARIANT)
    assert chat.model_extra["reproducible"] is True
    assert chunks[-1].model_extra["reproducible"] is False and "reproducible" not in chunks[0].model_extra


# -- the fingerprint's rule ---------------------------------------------------------------------------------------
def config(strategy: str = "ssd", **kw) -> EngineConfig:
    speculative = SpeculativeConfig(**{"K": 4, **kw.pop("speculative", {})})
    return EngineConfig(
        **{"target": "t", "draft": "d", "strategy": strategy, "dtype": "float32", "speculative": speculative, **kw}
    )


def test_invariant_fingerprints_ignore_the_strategy_and_the_draft():
    invariant = {
        system_fingerprint(c, SamplingMode.INVARIANT)
        for c in (
            config("ar", draft=None),
            config("sd"),
            config(speculative={"K": "auto"}, draft="other"),
            config(speculative={"backup": "random", "C": 0.5}),
        )
    }
    assert len(invariant) == 1


@pytest.mark.parametrize(
    "change",
    [
        {"strategy": "sd"},
        {"strategy": "ar", "draft": None},
        {"speculative": {"K": 3}},
        {"speculative": {"backup": "random"}},
        {"speculative": {"C": 0.5}},
        {"draft": "other"},
        {"draft_dtype": "bfloat16"},
        {"target": "other"},
        {"dtype": "bfloat16"},
        {"target_quant": "int8"},
        {"draft_quant": "int8-dynamic"},
    ],
)
def test_a_standard_fingerprint_changes_with_each_setting_that_decides_the_text(change):
    assert system_fingerprint(config(**change), SamplingMode.STANDARD) != system_fingerprint(
        config(), SamplingMode.STANDARD
    )


@pytest.mark.parametrize("change", [{"target": "other"}, {"dtype": "bfloat16"}, {"device": "cuda"}])
def test_an_invariant_fingerprint_changes_with_the_target(change):
    assert system_fingerprint(config(**change), SamplingMode.INVARIANT) != system_fingerprint(
        config(), SamplingMode.INVARIANT
    )


def test_a_fingerprint_names_the_version_the_mode_and_the_settings():
    from saguaro import version

    fingerprint = system_fingerprint(config("sd", speculative={"confidence_stop": 0.5}), SamplingMode.STANDARD)
    assert fingerprint.split(":")[:3] == [f"saguaro-{version()}", "standard", "sd,K=4,confidence_stop=0.5"]


def test_a_confidence_stop_makes_standard_sd_unreproducible():
    sd = config("sd", speculative={"confidence_stop": 0.5})
    params = SamplingParams(temperature=0.8, seed=1)
    assert "confidence stop" in reproducibility(sd, params).unreproducible  # engine.reproducibility's reason
    assert reproducibility(sd, SamplingParams(temperature=0.8, seed=1, sampling_mode="invariant")).reproducible
    assert reproducibility(sd, SamplingParams(temperature=0, seed=1)).reproducible

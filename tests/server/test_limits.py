"""What keeps one request from stalling or misleading the server: body size, tokenizing off the event loop,
a prompt measured before it is tokenized whole, 503s that say when to retry, fields the server cannot honour."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from server import ServerSettings
from tests.server.conftest import running
from tests.server.fake import FakeEngine, FakeModel, queue_full

COMPLETION = {"model": "fake-model", "prompt": "aa bbb", "max_tokens": 5}
CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
LIMIT = 4096


@pytest.fixture
def small_bodies():
    with running(FakeModel(), FakeEngine(), ServerSettings(max_request_bytes=LIMIT)) as s:
        yield s


def test_a_body_over_the_limit_is_a_413_the_client_reads(small_bodies):
    response = httpx.post(
        small_bodies.url + "/v1/completions", json={**COMPLETION, "prompt": "a " * 100_000}, timeout=10
    )
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"


def test_a_chunked_body_over_the_limit_is_the_same_413(small_bodies):
    def chunks():
        yield b'{"model": "fake-model", "prompt": "'
        for _ in range(100):
            yield b"a " * 100
        yield b'"}'

    response = httpx.post(
        small_bodies.url + "/v1/completions", content=chunks(), headers={"content-type": "application/json"}, timeout=10
    )
    assert "content-length" not in response.request.headers  # sent chunked: the limit is found while reading
    error = response.json()["error"]
    assert response.status_code == 413 and (error["type"], error["code"]) == (
        "invalid_request_error",
        "request_too_large",
    )


def test_a_body_within_the_limit_is_served(small_bodies):
    assert httpx.post(small_bodies.url + "/v1/completions", json=COMPLETION, timeout=10).status_code == 200


def test_tokenizing_a_prompt_does_not_hold_the_event_loop():
    model = FakeModel(encode_s=2.0)  # a slow tokenizer
    with running(model, FakeEngine()) as server:
        slow = threading.Thread(target=lambda: httpx.post(server.url + "/v1/completions", json=COMPLETION, timeout=10))
        slow.start()
        while not model.encoded_chars:
            time.sleep(0.01)
        start = time.perf_counter()
        health = httpx.get(server.url + "/health", timeout=10)
        waited = time.perf_counter() - start
        slow.join(10)
    assert health.status_code == 200 and waited < 1.0


def test_a_huge_prompt_is_refused_after_tokenizing_about_a_context_of_it(client, model):
    prompt = "aa " * 300_000  # 900,000 characters, 300,000 tokens; the context is 64
    response = client.post("/v1/completions", json={**COMPLETION, "prompt": prompt})
    error = response.json()["error"]
    assert response.status_code == 400 and error["code"] == "context_length_exceeded" and error["param"] == "prompt"
    assert "at least" in error["message"] and max(model.encoded_chars) < 2_000


def test_huge_chat_messages_are_refused_before_the_template(client, model):
    messages = [{"role": "user", "content": "aa " * 300_000}]
    response = client.post("/v1/chat/completions", json={**CHAT, "messages": messages})
    assert response.json()["error"]["code"] == "context_length_exceeded" and max(model.encoded_chars) < 2_000
    assert model.chats == []


def test_a_full_queue_is_a_503_with_retry_after(client, fake):
    fake.refuse = queue_full()
    response = client.post("/v1/completions", json=COMPLETION)
    assert response.status_code == 503 and response.headers["retry-after"] == "1"


def test_a_draining_server_says_when_to_retry(server, client):
    server.ctx.draining = True
    response = client.post("/v1/completions", json=COMPLETION)
    server.ctx.draining = False
    assert response.status_code == 503 and response.headers["retry-after"].isdigit()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("response_format", {"type": "json_object"}),
        ("response_format", {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}),
        ("tool_choice", "auto"),
        ("functions", [{"name": "f"}]),
        ("function_call", "auto"),
        ("audio", {"voice": "alloy", "format": "wav"}),
        ("modalities", ["text", "audio"]),
        ("prediction", {"type": "content", "content": "x"}),
        ("guided_json", {"type": "object"}),
        ("use_beam_search", True),
        ("repetition_penalty", 1.2),
        ("min_p", 0.1),
    ],
)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_field_the_server_cannot_honour_is_a_400_naming_it(client, fake, path, field, value):
    body = CHAT if path.endswith("chat/completions") else COMPLETION
    response = client.post(path, json={**body, field: value})
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == field and error["message"].startswith(f"{field}: ")
    assert fake.requests == []


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("response_format", {"type": "text"}),
        ("tool_choice", "none"),
        ("modalities", ["text"]),
        ("repetition_penalty", 1.0),
        ("audio", None),
    ],
)
def test_a_neutral_value_of_such_a_field_is_accepted(client, field, value):
    assert client.post("/v1/chat/completions", json={**CHAT, field: value}).status_code == 200


def test_min_tokens_stop_token_ids_and_logprobs_mode_reach_the_engine(client, fake):
    client.post(
        "/v1/completions",
        json={**COMPLETION, "min_tokens": 3, "stop_token_ids": [7], "logprobs_mode": "processed_logprobs"},
    )
    params = fake.requests[0][2]
    assert (params.min_tokens, params.stop_token_ids, params.logprobs_mode.value) == (3, (7,), "processed_logprobs")


def test_min_tokens_over_a_chats_default_max_tokens_is_a_400_naming_min_tokens(client):
    body = {key: value for key, value in CHAT.items() if key != "max_tokens"}
    response = client.post("/v1/chat/completions", json={**body, "min_tokens": 100})
    assert response.status_code == 400 and response.json()["error"]["param"] == "min_tokens"


def test_one_model_is_found_by_its_id_and_another_is_a_404(client):
    assert client.get("/v1/models/fake-model").json()["id"] == "fake-model"
    response = client.get("/v1/models/gpt-9")
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"

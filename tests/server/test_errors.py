"""Every error is OpenAI's error JSON with the right status; a user's mistake logs one line, no traceback."""

from __future__ import annotations

import json
import logging

import pytest

from engine import EngineStopped
from server import ServerSettings
from tests.server.conftest import running
from tests.server.fake import FakeEngine, FakeModel, queue_full
from tests.server.sse import stream

COMPLETION = {"model": "fake-model", "prompt": "aa bbb", "max_tokens": 5}
CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


def post_json(client, path: str, body: dict):
    """POST `body` as JSON as Python writes it: NaN and Infinity included, which httpx's json= refuses."""
    return client.post(path, content=json.dumps(body), headers={"content-type": "application/json"})


def error_of(response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": 2.5}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": "5"}, "max_tokens"),
        ({"top_p": 0}, "top_p"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**63}, "seed"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": float("inf")}, "top_p"),
        ({"logprobs": 6}, "logprobs"),
        ({"n": 2}, "n"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stop": 3}, "stop"),
        ({"stream": "yes"}, "stream"),
        ({"echo": True}, "echo"),
        ({"best_of": 3}, "best_of"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"prompt": ["one", "two"]}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": [1, "x"]}, "prompt"),
        ({"prompt": None}, "prompt"),
        ({"model": None}, "model"),
    ],
)
def test_a_bad_completion_parameter_is_a_400_naming_it(client, change, param):
    error = error_of(post_json(client, "/v1/completions", {**COMPLETION, **change}), 400)
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert error["message"].startswith(f"{param}: ")


@pytest.mark.parametrize(
    ("change", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages.0.role"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            "messages.0.content",
        ),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 9}, "top_logprobs"),
        ({"max_completion_tokens": 0}, "max_completion_tokens"),
        ({"tools": [{"type": "function"}]}, "tools"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
    ],
)
def test_a_bad_chat_parameter_is_a_400_naming_it(client, change, param):
    error = error_of(client.post("/v1/chat/completions", json={**CHAT, **change}), 400)
    assert error["param"] == param


def test_temperature_nan_is_refused_as_not_a_number(client):
    error = error_of(post_json(client, "/v1/completions", {**COMPLETION, "temperature": float("nan")}), 400)
    assert error["message"] == "temperature: must be a number, not NaN"


def test_a_seed_beyond_int64_says_to_take_it_modulo(client):
    error = error_of(client.post("/v1/completions", json={**COMPLETION, "seed": 2**64}), 400)
    assert error["param"] == "seed" and "modulo 2**63" in error["message"]


def test_n_above_one_says_it_is_not_supported(client):
    reply = client.post("/v1/completions", json={**COMPLETION, "n": 2})
    assert "n=2 is not supported" in error_of(reply, 400)["message"]


def test_several_prompts_are_refused_saying_so(client):
    message = error_of(client.post("/v1/completions", json={**COMPLETION, "prompt": ["a", "b"]}), 400)["message"]
    assert "only one prompt per request" in message


def test_a_body_that_is_not_json_is_a_400(client):
    response = client.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert error_of(response, 400)["message"] == "the request body is not valid JSON"


def test_a_body_that_is_not_a_json_object_says_how_to_send_one(client):
    for response in (
        client.post("/v1/completions", content=b'{"model": "fake-model"}'),  # no content type
        client.post("/v1/completions", json=[1, 2]),
        client.post("/v1/completions"),
    ):
        assert "must be a JSON object" in error_of(response, 400)["message"]


def test_the_engines_value_error_is_passed_through_as_a_400(client, fake):
    fake.refuse = ValueError("prompt token ids must be in [0, 64)")
    reply = client.post("/v1/completions", json=COMPLETION)
    assert error_of(reply, 400)["message"] == "prompt token ids must be in [0, 64)"


def test_a_request_over_the_context_is_openais_context_length_exceeded(client):
    error = error_of(client.post("/v1/completions", json={**COMPLETION, "max_tokens": 63}), 400)
    assert error["code"] == "context_length_exceeded" and error["param"] == "prompt"
    assert error["message"].startswith(
        "This model's maximum context length is 64 tokens. However, you requested "
        "65 tokens (2 in the prompt, 63 in the completion)."
    )


def test_chat_messages_over_the_context_name_the_messages(client):
    error = error_of(client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 63}), 400)
    assert error["code"] == "context_length_exceeded" and error["param"] == "messages"


def test_an_empty_text_prompt_is_a_400_naming_the_prompt(client):
    error = error_of(client.post("/v1/completions", json={**COMPLETION, "prompt": " "}), 400)
    assert "empty prompt" in error["message"] and error["param"] == "prompt"


def test_prompt_ids_outside_the_vocabulary_are_a_400_naming_the_prompt(client, fake):
    error = error_of(client.post("/v1/completions", json={**COMPLETION, "prompt": [1, 50]}), 400)
    assert error["param"] == "prompt" and "[0, 50)" in error["message"]
    assert fake.requests == []


def test_min_tokens_over_max_tokens_is_a_400_naming_min_tokens(client):
    error = error_of(client.post("/v1/completions", json={**COMPLETION, "min_tokens": 6}), 400)
    assert error["param"] == "min_tokens" and "max_tokens (5)" in error["message"]


def test_a_wrong_method_is_a_405_that_says_which_are_allowed(client):
    response = client.get("/v1/completions")
    assert error_of(response, 405)["type"] == "invalid_request_error"
    assert response.headers["allow"] == "POST"


def test_an_unknown_model_is_a_404(client):
    error = error_of(client.post("/v1/completions", json={**COMPLETION, "model": "gpt-9"}), 404)
    assert error["code"] == "model_not_found" and error["param"] == "model" and "gpt-9" in error["message"]


def test_an_unknown_path_is_a_404_in_openai_shape(client):
    error_of(client.get("/v1/nothing"), 404)


def test_a_full_queue_is_a_503_that_says_retry_later_once(client, fake):
    fake.refuse = queue_full()  # the engine's message says "retry later" itself
    error = error_of(client.post("/v1/completions", json=COMPLETION), 503)
    assert error["code"] == "queue_full" and error["message"].count("retry later") == 1


def test_a_full_queue_is_a_503_for_a_stream_too(client, fake):
    fake.refuse = queue_full()
    error_of(client.post("/v1/completions", json={**COMPLETION, "stream": True}), 503)


def test_a_stopped_engine_is_a_503(client, fake):
    fake.refuse = EngineStopped("the engine is shutting down")
    error_of(client.post("/v1/chat/completions", json=CHAT), 503)


def test_a_draining_server_answers_503(server, client):
    server.ctx.draining = True
    assert error_of(client.post("/v1/completions", json=COMPLETION), 503)["code"] == "shutting_down"
    assert client.get("/health").status_code == 503
    server.ctx.draining = False


def test_an_engine_failure_is_a_500(client, fake, caplog):
    fake.fail_after = 1
    with caplog.at_level(logging.ERROR, logger="server"):
        error = error_of(client.post("/v1/completions", json=COMPLETION), 500)
    assert error["type"] == "server_error" and "the fake engine broke" in error["message"]
    assert any(r.exc_info for r in caplog.records)  # a failure keeps its traceback


def test_an_engine_failure_mid_stream_ends_the_stream_with_an_error_event(client, fake):
    fake.fail_after = 1
    events = stream(client, "/v1/completions", COMPLETION)
    assert events[-1] == "[DONE]" and events[-2]["error"]["type"] == "server_error"
    assert events[0]["choices"][0]["token_ids"] == [4, 5]


def test_a_users_mistake_logs_one_line_without_traceback(client, caplog):
    with caplog.at_level(logging.INFO, logger="server"):
        client.post("/v1/completions", json={**COMPLETION, "n": 2})
        client.post("/v1/completions", json={**COMPLETION, "model": "x"})
        client.post("/v1/completions", json={**COMPLETION, "max_tokens": 63})
    lines = [r for r in caplog.records if r.name == "server"]
    assert len(lines) == 3 and not any(r.exc_info for r in lines)
    assert all("\n" not in r.getMessage() for r in lines)


@pytest.fixture
def keyed():
    with running(FakeModel(), FakeEngine(), ServerSettings(api_key="sekret")) as s:
        yield s


@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekret"}, {"Authorization": "Basic sekret"}]
)
def test_a_missing_or_bad_key_is_a_401(keyed, headers):
    import httpx

    for path in ("/v1/models",):
        error = error_of(httpx.get(keyed.url + path, headers=headers), 401)
        assert error["type"] == "authentication_error" and error["code"] == "invalid_api_key"
    error_of(httpx.post(keyed.url + "/v1/completions", json=COMPLETION, headers=headers), 401)


def test_the_right_key_is_let_in_and_health_stays_open(keyed):
    import httpx

    assert httpx.get(keyed.url + "/v1/models", headers={"Authorization": "Bearer sekret"}).status_code == 200
    assert httpx.get(keyed.url + "/health").status_code == 200
    assert httpx.get(keyed.url + "/metrics").status_code == 200

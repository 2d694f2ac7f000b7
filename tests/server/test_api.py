"""The happy paths of the OpenAI endpoints against the fake engine: shapes, usage, streaming."""

from __future__ import annotations

from tests.server.fake import word
from tests.server.sse import DONE, stream

COMPLETION = {"model": "fake-model", "prompt": "aa bbb", "max_tokens": 5, "temperature": 0}


def expected_text(last_prompt_id: int, n: int) -> str:
    return "".join(word(last_prompt_id + 1 + i) for i in range(n))


def test_models_lists_the_engines_model_name(client):
    body = client.get("/v1/models").json()
    assert [m["id"] for m in body["data"]] == ["fake-model"]
    assert body["data"][0]["max_model_len"] == 64


def test_health_is_ok_and_names_the_strategy(client):
    assert client.get("/health").json() == {"status": "ok", "strategy": "ssd"}


def test_completion_returns_the_text_and_usage(client, fake):
    body = client.post("/v1/completions", json=COMPLETION).json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["choices"][0]["text"] == expected_text(3, 5)  # "bbb" is id 3
    assert body["choices"][0]["token_ids"] == [4, 5, 6, 7, 8]
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7}
    request_id, prompt_ids, params = fake.requests[0]
    assert request_id == body["id"] and prompt_ids == [2, 3]
    assert (params.temperature, params.max_new_tokens, params.seed) == (0, 5, None)


def test_sampling_parameters_reach_the_engine(client, fake):
    client.post(
        "/v1/completions",
        json={
            **COMPLETION,
            "temperature": 0.7,
            "top_p": 0.9,
            "top_k": 20,
            "seed": 3,
            "stop": "w9",
            "ignore_eos": True,
            "unknown_field": 1,
        },
    )
    params = fake.requests[0][2]
    assert (params.temperature, params.top_p, params.top_k, params.seed) == (0.7, 0.9, 20, 3)
    assert params.stop == ("w9",) and params.stop_on_eos is False


def test_completion_max_tokens_defaults_to_16_as_openais(client, fake):
    client.post("/v1/completions", json={"model": "fake-model", "prompt": "aa"})
    client.post("/v1/completions", json={"model": "fake-model", "prompt": "aa", "max_tokens": None})
    assert [r[2].max_new_tokens for r in fake.requests] == [16, 16]


def test_top_k_minus_one_and_top_p_one_mean_off(client, fake):
    client.post("/v1/completions", json={**COMPLETION, "top_k": -1, "top_p": 1.0})
    params = fake.requests[0][2]
    assert params.top_k is None and params.top_p is None


def test_a_token_id_prompt_is_passed_as_is(client, fake):
    body = client.post("/v1/completions", json={**COMPLETION, "prompt": [7, 8, 9]}).json()
    assert fake.requests[0][1] == [7, 8, 9]
    assert body["choices"][0]["text"] == expected_text(9, 5)


def test_a_list_holding_one_prompt_is_that_prompt(client, fake):
    client.post("/v1/completions", json={**COMPLETION, "prompt": [[7, 8]]})
    client.post("/v1/completions", json={**COMPLETION, "prompt": ["aa bbb"]})
    assert [r[1] for r in fake.requests] == [[7, 8], [2, 3]]


def test_a_stop_string_ends_the_text_before_it(client):
    body = client.post("/v1/completions", json={**COMPLETION, "stop": ["w6"]}).json()
    assert body["choices"][0]["text"] == " w4 w5 " and body["choices"][0]["finish_reason"] == "stop"


def test_stream_sends_one_event_per_chunk_with_its_token_ids_then_done(client):
    events = stream(client, "/v1/completions", COMPLETION)
    assert events[-1] == DONE
    chunks = events[:-1]
    assert [c["choices"][0]["token_ids"] for c in chunks] == [[4, 5], [6, 7], [8]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == expected_text(3, 5)
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, "length"]
    assert len({c["id"] for c in chunks}) == 1
    assert all("usage" not in c for c in chunks)


def test_stream_ends_with_a_usage_chunk_when_asked(client):
    events = stream(client, "/v1/completions", {**COMPLETION, "stream_options": {"include_usage": True}})
    *chunks, usage, done = events
    assert done == DONE and usage["choices"] == []
    assert usage["usage"] == {"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7}
    assert all(c["usage"] is None for c in chunks)


def test_chat_messages_go_through_the_chat_template_system_prompt_included(client, model, fake):
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "developer", "content": "really"},
        {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]},
    ]
    body = client.post(
        "/v1/chat/completions", json={"model": "fake-model", "messages": messages, "max_completion_tokens": 3}
    ).json()
    assert model.chats == [
        [
            {"role": "system", "content": "be brief"},
            {"role": "system", "content": "really"},
            {"role": "user", "content": "hi there"},
        ]
    ]
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["choices"][0]["message"] == {"role": "assistant", "content": body["choices"][0]["message"]["content"]}
    assert body["usage"]["completion_tokens"] == 3 and fake.requests[0][2].max_new_tokens == 3


def test_chat_without_max_tokens_gets_the_rest_of_the_context(client, fake):
    client.post("/v1/chat/completions", json={"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]})
    prompt_ids, params = fake.requests[0][1:]
    assert params.max_new_tokens == 64 - len(prompt_ids)


def test_chat_stream_puts_the_role_on_the_first_chunk(client):
    events = stream(
        client,
        "/v1/chat/completions",
        {"model": "fake-model", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
    )
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all("role" not in c["choices"][0]["delta"] for c in chunks[1:])
    assert sum(len(c["choices"][0]["token_ids"]) for c in chunks) == 4


def test_completion_logprobs_are_parallel_lists_with_minus_infinity_as_minus_9999(client, fake):
    body = client.post("/v1/completions", json={**COMPLETION, "max_tokens": 2, "logprobs": 2}).json()
    logprobs = body["choices"][0]["logprobs"]
    assert fake.requests[0][2].logprobs == 2
    assert logprobs["tokens"] == [" w4", " w5"]
    assert logprobs["token_logprobs"] == [-0.5, -9999.0]
    assert logprobs["top_logprobs"] == [{" w4": -1.0, " w5": -2.0}, {" w5": -1.0, " w6": -2.0}]
    assert logprobs["text_offset"] == [0, 3]


def test_chat_logprobs_are_entries_with_top_logprobs(client, fake):
    body = client.post(
        "/v1/chat/completions",
        json={
            "model": "fake-model",
            "max_tokens": 1,
            "logprobs": True,
            "top_logprobs": 1,
            "messages": [{"role": "user", "content": "hi"}],
        },
    ).json()
    entry = body["choices"][0]["logprobs"]["content"][0]
    assert entry["token"] == body["choices"][0]["message"]["content"]
    assert entry["bytes"] == list(entry["token"].encode())
    assert len(entry["top_logprobs"]) == 1 and fake.requests[0][2].logprobs == 1


def test_chat_logprobs_true_without_top_logprobs_asks_for_the_chosen_token_only(client, fake):
    client.post(
        "/v1/chat/completions",
        json={
            "model": "fake-model",
            "max_tokens": 1,
            "logprobs": True,
            "messages": [{"role": "user", "content": "hi"}],
        },
    )
    assert fake.requests[0][2].logprobs == 0


def test_the_openai_client_reads_streamed_and_whole_completions(server):
    from openai import OpenAI

    client = OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=10)
    whole = client.completions.create(model="fake-model", prompt="aa bbb", max_tokens=5, temperature=0)
    parts = client.completions.create(model="fake-model", prompt="aa bbb", max_tokens=5, temperature=0, stream=True)
    assert "".join(p.choices[0].text for p in parts) == whole.choices[0].text == expected_text(3, 5)
    chat = client.chat.completions.create(
        model="fake-model", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert chat.choices[0].message.content and chat.usage.completion_tokens == 2

"""The server over SmolLM2-135M (a real tokenizer and chat template), AR and SSD, checked against `LLM.generate`.

The references are computed with the same LLM before it is served (an LLM being served takes requests
only through its AsyncLLM).
"""

from __future__ import annotations

import pytest
from openai import OpenAI

from engine import LLM, AsyncLLM, SamplingParams, SpeculativeConfig
from server import ServerSettings
from tests.server.conftest import running

NAME = "smollm2"
MESSAGES = [
    {"role": "system", "content": "You answer in one short sentence."},
    {"role": "user", "content": "What colour is the sky on a clear day?"},
]
PROMPT = "The three primary colours are"
MAX_NEW = 20


@pytest.fixture(scope="module", params=["ar", "ssd"])
def served(request):
    draft = None if request.param == "ar" else "smollm2-135m"  # SmolLM2 as its own draft
    llm = LLM(
        "smollm2-135m",
        draft,
        strategy=request.param,
        speculative=SpeculativeConfig(K=2),
        dtype="float32",
        max_num_seqs=4,
    )
    greedy = SamplingParams(temperature=0, max_new_tokens=MAX_NEW)
    chat_ids = llm.encode_chat(MESSAGES)
    expected = {
        "chat_prompt": chat_ids,
        "chat": llm.generate([chat_ids], greedy)[0],
        "completion": llm.generate([llm.encode(PROMPT, chat=False)], greedy)[0],
    }
    settings = ServerSettings(served_model_name=NAME, disconnect_poll_s=0.02)
    with running(llm, AsyncLLM(llm, max_waiting=4), settings) as server:
        yield OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120), expected


def test_chat_goes_through_the_chat_template_system_prompt_included(served):
    client, expected = served
    answer = client.chat.completions.create(model=NAME, messages=MESSAGES, max_tokens=MAX_NEW, temperature=0)
    assert answer.usage.prompt_tokens == len(expected["chat_prompt"])
    assert answer.choices[0].model_extra["token_ids"] == expected["chat"].token_ids
    assert answer.choices[0].message.content == expected["chat"].text


def test_streamed_chat_is_the_whole_chat(served):
    client, expected = served
    parts = list(
        client.chat.completions.create(
            model=NAME,
            messages=MESSAGES,
            max_tokens=MAX_NEW,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices) == expected["chat"].text
    assert parts[-1].usage.completion_tokens == len(expected["chat"].token_ids)


def test_a_completion_is_the_raw_prompts_continuation(served):
    client, expected = served
    answer = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=MAX_NEW, temperature=0)
    assert answer.choices[0].text == expected["completion"].text


def test_a_stop_string_cuts_the_text_before_it(served):
    client, expected = served
    text = expected["completion"].text
    stop = text.split()[2]  # a word from the middle of the greedy continuation
    answer = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=MAX_NEW, temperature=0, stop=[stop])
    assert answer.choices[0].finish_reason == "stop"
    assert answer.choices[0].text == text[: text.index(stop)]


def test_logprobs_come_with_token_strings(served):
    client, expected = served
    answer = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=3, temperature=0, logprobs=2)
    logprobs = answer.choices[0].logprobs
    assert "".join(logprobs.tokens) == answer.choices[0].text
    # The model's own log-probabilities: greedy picks the most probable, which is not certain.
    for chosen, top in zip(logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        assert chosen < 0 and chosen == pytest.approx(max(top.values()), abs=1e-5)


def test_chat_logprob_bytes_join_into_the_answers_utf8(served):
    client, expected = served
    answer = client.chat.completions.create(
        model=NAME, messages=MESSAGES, max_tokens=MAX_NEW, temperature=0, logprobs=True
    )
    entries = answer.choices[0].logprobs.content
    if answer.choices[0].finish_reason == "stop":
        entries = entries[:-1]  # the end-of-sequence token, which the text leaves out
    joined = b"".join(bytes(entry.bytes) for entry in entries)
    assert joined.decode("utf-8") == answer.choices[0].message.content == expected["chat"].text

"""The server over the real engine on tiny in-memory models (token-id prompts): AR, SD and SSD.

Greedy SD and SSD emit the AR tokens, so every answer is checked against `LLM.generate` on AR; so do sampled
requests under drafter-invariant sampling, checked against an AR server beside them.
One server per strategy for the module (SSD's worker takes ~5 s to start).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from contextlib import contextmanager
from itertools import pairwise

import httpx
import psutil
import pytest
from openai import OpenAI

from engine import LLM, AsyncLLM, SamplingParams, SpeculativeConfig
from engine.config import DraftPlacement, WorkerFaults
from engine.loading.tiny import tiny_pair
from server import ServerSettings
from tests.server.conftest import running
from tests.server.sse import parse, tokens

NAME = "tiny"
PROMPTS = [[1, 2, 3], [5, 9, 4, 7, 2], [11], [30, 31, 32, 33]]
SHORT, LONG = 16, 300  # new tokens; a long request keeps the batch busy while others join
WAIT_S = 10.0
TEMPERATURE = 0.8
SEEDS = (11, 12, 13, 14)


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_new_tokens=n, stop_on_eos=False)


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(vocab_size=64, logit_scale=4.0)


@pytest.fixture(scope="module")
def ar(pair):
    """An AR engine that is never served: the reference."""
    with LLM(pair[0]) as llm:
        yield llm


@pytest.fixture(scope="module")
def expected(ar):
    return {
        "short": [o.token_ids for o in (ar.generate([p], greedy(SHORT))[0] for p in PROMPTS)],
        "long": ar.generate([PROMPTS[0]], greedy(LONG))[0].token_ids,
    }


@contextmanager
def serving(llm: LLM, max_waiting: int = 8, shutdown_timeout_s: float = 5.0):
    aengine = AsyncLLM(llm, max_waiting=max_waiting)
    settings = ServerSettings(served_model_name=NAME, disconnect_poll_s=0.02)
    with running(llm, aengine, settings, shutdown_timeout_s=shutdown_timeout_s) as server:
        yield server, aengine


def engine(pair, strategy: str, **kw) -> LLM:
    target, draft = pair
    return LLM(
        target,
        None if strategy == "ar" else draft,
        strategy=strategy,
        speculative=kw.pop("speculative", SpeculativeConfig(K=3)),
        max_num_seqs=4,
        **kw,
    )


@pytest.fixture(scope="module", params=["ar", "sd", "ssd"])
def live(request, pair):
    with serving(engine(pair, request.param)) as (server, aengine):
        yield server, aengine


@pytest.fixture(scope="module")
def ar_server(pair):
    """An AR server beside `live`: the text drafter-invariant sampling must give on every strategy."""
    with serving(engine(pair, "ar")) as (server, _):
        yield server


def openai_client(server) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


def wait_for(condition, timeout_s: float = WAIT_S) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def test_streamed_equals_whole_equals_the_ar_engines_greedy_tokens(live, expected):
    server, _ = live
    client = openai_client(server)
    args = dict(model=NAME, prompt=PROMPTS[1], max_tokens=SHORT, temperature=0, extra_body={"ignore_eos": True})
    whole = client.completions.create(**args)
    parts = list(client.completions.create(**args, stream=True))
    streamed = [t for p in parts for t in p.choices[0].model_extra["token_ids"]]
    assert whole.choices[0].model_extra["token_ids"] == streamed == expected["short"][1]
    assert whole.usage.completion_tokens == SHORT and whole.choices[0].finish_reason == "length"
    assert parts[-1].choices[0].finish_reason == "length"


def sampled(server, seed: int, mode: str = "standard"):
    """A seeded completion at TEMPERATURE through the openai client."""
    return openai_client(server).completions.create(
        model=NAME,
        prompt=PROMPTS[1],
        max_tokens=SHORT,
        temperature=TEMPERATURE,
        seed=seed,
        extra_body={"ignore_eos": True, "sampling_mode": mode},
    )


def token_ids(completion) -> list[int]:
    return completion.choices[0].model_extra["token_ids"]


def test_a_seed_gives_the_same_text_twice_and_says_so(live):
    server, _ = live
    first, again, other = sampled(server, SEEDS[0]), sampled(server, SEEDS[0]), sampled(server, SEEDS[1])
    assert token_ids(first) == token_ids(again) and len(token_ids(first)) == SHORT
    assert token_ids(other) != token_ids(first)  # the seed decides the text
    assert first.system_fingerprint == again.system_fingerprint
    assert first.model_extra["reproducible"] is True and first.model_extra["unreproducible_reason"] is None


def test_invariant_sampling_gives_the_ar_servers_text_and_fingerprint(live, ar_server):
    server, _ = live
    for seed in SEEDS:
        served, reference = sampled(server, seed, "invariant"), sampled(ar_server, seed, "invariant")
        assert token_ids(served) == token_ids(reference), seed
        assert served.system_fingerprint == reference.system_fingerprint
        assert served.model_extra["reproducible"] is True


def test_standard_sampling_on_sd_and_ssd_is_not_the_ar_servers_text(live, ar_server):
    # The negative control of the test above: rejection sampling draws SD's and SSD's tokens from the draft.
    server, _ = live
    if server.ctx.model.config.strategy.value == "ar":
        pytest.skip("the AR server's standard text is the reference's")
    served = [token_ids(sampled(server, seed)) for seed in SEEDS]
    reference = [token_ids(sampled(ar_server, seed)) for seed in SEEDS]
    assert served != reference
    assert sampled(server, SEEDS[0]).system_fingerprint != sampled(ar_server, SEEDS[0]).system_fingerprint


def test_requests_joining_a_running_batch_get_their_solo_outputs(live, expected):
    server, aengine = live
    before = aengine.stats()
    results: dict[int, list[int]] = {}

    def run(i: int, n: int) -> None:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            body = {"model": NAME, "prompt": PROMPTS[i], "max_tokens": n, "temperature": 0, "ignore_eos": True}
            results[i] = client.post("/v1/completions", json=body).json()["choices"][0]["token_ids"]

    with httpx.Client(base_url=server.url, timeout=60) as client:
        body = {
            "model": NAME,
            "prompt": PROMPTS[0],
            "max_tokens": LONG,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }
        with client.stream("POST", "/v1/completions", json=body) as response:
            lines = response.iter_lines()
            first = next(lines)  # the long request is running: the others join its batch
            threads = [threading.Thread(target=run, args=(i, SHORT)) for i in range(1, len(PROMPTS))]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            events = parse([first, *lines])
    assert tokens(events) == expected["long"]
    assert [results[i] for i in range(1, len(PROMPTS))] == expected["short"][1:]
    after = aengine.stats()
    assert after.row_rounds - before.row_rounds > after.rounds - before.rounds  # rows really shared rounds


def test_logprobs_are_the_targets(live, ar):
    server, _ = live
    n, temperature = 6, 0.8
    body = {
        "model": NAME,
        "prompt": PROMPTS[3],
        "max_tokens": n,
        "temperature": temperature,
        "seed": 7,
        "logprobs": 3,
        "ignore_eos": True,
    }
    with httpx.Client(base_url=server.url, timeout=60) as client:
        choice = client.post("/v1/completions", json=body).json()["choices"][0]
    tokens, logprobs = choice["token_ids"], choice["logprobs"]
    # The target's warped distribution after each prefix, from the AR engine (top 5, to find the chosen token).
    params = SamplingParams(temperature=temperature, max_new_tokens=1, logprobs=5, stop_on_eos=False, seed=0)
    for i, (token, chosen) in enumerate(zip(tokens, logprobs["token_logprobs"], strict=True)):
        top = ar.generate([PROMPTS[3] + tokens[:i]], params)[0].logprobs[0].top
        served = logprobs["top_logprobs"][i]
        assert [f"token_id:{t}" for t, _ in top[:3]] == list(served)
        assert all(math.isclose(served[f"token_id:{t}"], v, abs_tol=1e-4) for t, v in top[:3])
        reference = dict(top).get(token)
        if reference is not None:
            assert math.isclose(chosen, reference, abs_tol=1e-4)


def test_the_engines_own_checks_are_400s(live):
    server, _ = live
    with httpx.Client(base_url=server.url, timeout=60) as client:
        outside = client.post("/v1/completions", json={"model": NAME, "prompt": [1, 64], "max_tokens": 2})
        too_long = client.post("/v1/completions", json={"model": NAME, "prompt": PROMPTS[0], "max_tokens": 600})
    assert outside.status_code == 400 and "token ids must be in [0, 64)" in outside.json()["error"]["message"]
    assert too_long.status_code == 400 and too_long.json()["error"]["code"] == "context_length_exceeded"


def test_the_advertised_context_is_what_prompt_and_max_tokens_may_fill(live):
    server, _ = live
    with httpx.Client(base_url=server.url, timeout=60) as client:
        card = client.get(f"/v1/models/{NAME}").json()
        fill = {
            "model": NAME,
            "prompt": PROMPTS[2],
            "max_tokens": card["max_model_len"] - len(PROMPTS[2]),
            "temperature": 0,
            "ignore_eos": True,
        }
        fits = client.post("/v1/completions", json=fill)
        over = client.post("/v1/completions", json={**fill, "max_tokens": fill["max_tokens"] + 1})
    assert card["id"] == NAME and card["max_model_len"] == server.ctx.model.room([])
    assert fits.status_code == 200 and fits.json()["usage"]["total_tokens"] == card["max_model_len"]
    assert over.status_code == 400 and over.json()["error"]["code"] == "context_length_exceeded"


def test_closing_a_stream_frees_its_row(live):
    server, aengine = live
    aborted = aengine.stats().requests_aborted
    body = {
        "model": NAME,
        "prompt": PROMPTS[0],
        "max_tokens": LONG + 100,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.Client(base_url=server.url, timeout=60) as client:
        with client.stream("POST", "/v1/completions", json=body) as response:
            lines = response.iter_lines()  # held: dropping it would close the connection
            next(lines)
            assert aengine.stats().running == 1
    assert wait_for(lambda: aengine.stats().running == 0)
    assert wait_for(lambda: aengine.stats().requests_aborted == aborted + 1)


def test_a_full_queue_is_a_503(pair):
    # One row, one waiting place: a running stream and a waiting one fill the engine.
    llm = LLM(pair[0], max_num_seqs=1)
    with serving(llm, max_waiting=1, shutdown_timeout_s=0) as (server, aengine):
        body = {
            "model": NAME,
            "prompt": PROMPTS[0],
            "max_tokens": 480,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }
        with httpx.Client(base_url=server.url, timeout=60) as client:
            with client.stream("POST", "/v1/completions", json=body) as running_one:
                lines = running_one.iter_lines()  # held: dropping it would close the connection
                next(lines)
                waiting = threading.Thread(
                    target=lambda: httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
                )
                waiting.start()
                assert wait_for(lambda: aengine.stats().waiting == 1)
                refused = client.post("/v1/completions", json={**body, "stream": False})
        waiting.join(60)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "queue_full"
    assert refused.json()["error"]["message"].count("retry later") == 1


def test_a_killed_ssd_worker_mid_stream_still_gives_the_ar_tokens(pair, expected, caplog):
    # The worker hangs on its second round (a test hook) with a long deadline: only the kill ends the wait.
    spec = SpeculativeConfig(K=3, placement=DraftPlacement(deadline_s=120.0, faults=WorkerFaults(hang_at_round=2)))
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    with caplog.at_level(logging.WARNING), serving(engine(pair, "ssd", speculative=spec)) as (server, aengine):
        workers = [
            c
            for c in psutil.Process().children(recursive=True)
            if c.pid not in before and "spawn_main" in " ".join(c.cmdline())
        ]
        assert len(workers) == 1
        body = {
            "model": NAME,
            "prompt": PROMPTS[0],
            "max_tokens": LONG,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }
        with httpx.Client(base_url=server.url, timeout=60) as client:
            with client.stream("POST", "/v1/completions", json=body) as response:
                lines = response.iter_lines()
                first = next(lines)
                workers[0].kill()
                events = parse([first, *lines])
        assert aengine.stats().fallbacks == 1
        assert server.ctx.model.strategy_in_use in ("sd", "ar")
    assert events[-1] == "[DONE]" and tokens(events) == expected["long"]
    assert "fell back" in caplog.text
    assert not workers[0].is_running()


def test_a_stopped_ssd_worker_stalls_the_stream_about_its_deadline_then_the_ar_tokens_go_on(pair, expected):
    deadline_s = 2.0
    spec = SpeculativeConfig(K=3, placement=DraftPlacement(deadline_s=deadline_s))
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    with serving(engine(pair, "ssd", speculative=spec)) as (server, aengine):
        worker = next(
            c
            for c in psutil.Process().children(recursive=True)
            if c.pid not in before and "spawn_main" in " ".join(c.cmdline())
        )
        body = {
            "model": NAME,
            "prompt": PROMPTS[0],
            "max_tokens": LONG,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }
        arrivals = []
        with httpx.Client(base_url=server.url, timeout=60) as client:
            with client.stream("POST", "/v1/completions", json=body) as response:
                lines = []
                for line in response.iter_lines():
                    lines.append(line)
                    arrivals.append(time.perf_counter())
                    if len(lines) == 4:
                        worker.suspend()  # SIGSTOP: alive, silent
        assert aengine.stats().fallbacks == 1
    gaps = [b - a for a, b in pairwise(arrivals)]
    assert tokens(parse(lines)) == expected["long"]
    assert deadline_s <= max(gaps) < deadline_s + 5.0  # the deadline, the reap (1.5 s), SD goes on (was 12.9 s)
    assert not worker.is_running()

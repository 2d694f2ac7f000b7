"""Shutdown: new requests get 503, those in flight finish within the deadline, the rest are aborted."""

from __future__ import annotations

import threading
import time

import httpx

from tests.server.conftest import running
from tests.server.fake import FakeEngine, FakeModel
from tests.server.sse import read_events

BODY = {"model": "fake-model", "prompt": "aa bbb", "max_tokens": 10}


def stream_in_thread(url: str, body: dict) -> tuple[threading.Thread, list]:
    out: list = []

    def go():
        with httpx.Client(timeout=20) as client:
            out.append(client.post(f"{url}/v1/completions", json={**body, "stream": True}))

    thread = threading.Thread(target=go)
    thread.start()
    return thread, out


def test_a_request_in_flight_finishes_while_new_ones_get_503():
    fake = FakeEngine(delay_s=0.1)  # five chunks: about half a second
    with running(FakeModel(), fake, shutdown_timeout_s=10) as server:
        thread, out = stream_in_thread(server.url, BODY)
        end = time.monotonic() + 5
        while not fake.requests and time.monotonic() < end:
            time.sleep(0.01)
        server.shutdown()
        end = time.monotonic() + 5
        while not server.ctx.draining and time.monotonic() < end:
            time.sleep(0.01)
        refused = httpx.post(f"{server.url}/v1/completions", json=BODY, timeout=5)
        thread.join(10)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
    events = read_events(out[0])
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert sum(len(e["choices"][0]["token_ids"]) for e in events[:-1]) == 10
    assert fake.shutdown_calls == [10]


def test_a_request_past_the_deadline_is_aborted_with_an_error_event():
    fake = FakeEngine(delay_s=0.2)
    with running(FakeModel(), fake, shutdown_timeout_s=0.3) as server:
        thread, out = stream_in_thread(server.url, {**BODY, "max_tokens": 40})
        end = time.monotonic() + 5
        while not fake.requests and time.monotonic() < end:
            time.sleep(0.01)
        server.shutdown()
        thread.join(10)
    events = read_events(out[0])
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "shutting_down"

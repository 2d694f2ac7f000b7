"""A client that goes away aborts its request in the engine, streamed or not."""

from __future__ import annotations

import json
import socket
import time

import httpx

from tests.server.conftest import running
from tests.server.fake import FakeEngine, FakeModel

WAIT_S = 5.0
BODY = {"model": "fake-model", "prompt": "aa bbb", "max_tokens": 40}


def wait_for(condition, timeout_s: float = WAIT_S) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def test_closing_a_stream_aborts_its_request():
    fake = FakeEngine(delay_s=0.05)
    with running(FakeModel(), fake) as server, httpx.Client(base_url=server.url, timeout=10) as client:
        with client.stream("POST", "/v1/completions", json={**BODY, "stream": True}) as response:
            lines = response.iter_lines()  # held: dropping it would close the connection
            first = next(lines)
            assert first.startswith("data: ")
            request_id = json.loads(first.removeprefix("data: "))["id"]
        assert wait_for(lambda: fake.aborted == [request_id])
        assert wait_for(lambda: fake.stats_now.running == 0)


def test_leaving_before_a_whole_response_aborts_its_request():
    fake = FakeEngine(delay_s=0.05)
    with running(FakeModel(), fake) as server:
        host, port = server.url.removeprefix("http://").split(":")
        body = json.dumps(BODY).encode()
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            assert wait_for(lambda: fake.requests)
        assert wait_for(lambda: fake.aborted == [fake.requests[0][0]])
        assert wait_for(lambda: fake.stats_now.running == 0)


def test_a_request_that_finishes_is_not_aborted(client, fake):
    client.post("/v1/completions", json={**BODY, "max_tokens": 4})
    client.post("/v1/completions", json={**BODY, "max_tokens": 4, "stream": True})
    assert fake.aborted == [] and fake.stats_now.running == 0

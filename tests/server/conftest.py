"""A server on 127.0.0.1 and a free port, in a thread of the test process, stopped after each test."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from server import HTTPServer, ServerSettings, bind, create_app
from tests.server.fake import FakeEngine, FakeModel

START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 30.0


@contextmanager
def running(
    model, engine, settings: ServerSettings | None = None, shutdown_timeout_s: float = 5.0
) -> Iterator[HTTPServer]:
    """Serve (model, engine) until the block ends, then drain and join the server's thread."""
    app = create_app(model, engine, settings or ServerSettings(disconnect_poll_s=0.02))
    server = HTTPServer(app, bind("127.0.0.1", 0), shutdown_timeout_s=shutdown_timeout_s)
    thread = threading.Thread(target=server.run, name="test-server", daemon=True)
    thread.start()
    try:
        if not server.ready.wait(START_TIMEOUT_S):
            raise RuntimeError("the test server did not start")
        yield server
    finally:
        if server.ready.is_set():
            server.shutdown()
        thread.join(STOP_TIMEOUT_S)
        if thread.is_alive():
            raise RuntimeError("the test server did not stop")


@pytest.fixture
def fake() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def model() -> FakeModel:
    return FakeModel()


@pytest.fixture
def server(model, fake) -> Iterator[HTTPServer]:
    with running(model, fake) as s:
        yield s


@pytest.fixture
def client(server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=10.0) as c:
        yield c

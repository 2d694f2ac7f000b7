"""uvicorn around one app, with a graceful shutdown of the engine behind it.

The socket is bound up front (port 0 = a free port), so the URL is known before serving starts.
SIGTERM / SIGINT (or `shutdown()` from another thread) starts the drain: new requests get 503,
the engine's `shutdown(deadline)` lets in-flight requests finish within the deadline and aborts the
rest (stopping the SSD draft worker), the last responses are flushed, then uvicorn stops. The signal
is not re-raised afterwards, so the process exits with status 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
from collections.abc import Callable, Iterator

import uvicorn
from fastapi import FastAPI

from server.context import ServingContext

logger = logging.getLogger("server")

DRAIN_SIGNALS = (signal.SIGINT, signal.SIGTERM)
FLUSH_TIMEOUT_S = 5.0  # after the engine stopped: time for the last chunks to reach their clients
POLL_S = 0.02


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (0 = a free port); ValueError if the address is taken."""
    if not 0 <= port <= 65535:
        raise ValueError(f"--port must be in 0..65535 (0 = a free port), got {port}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise ValueError(
            f"cannot listen on {host}:{port} ({err.strerror}): choose another --host/--port (--port 0 = a free one)"
        ) from err
    sock.setblocking(False)
    return sock


class _Uvicorn(uvicorn.Server):
    """uvicorn whose signals start our drain instead of its own shutdown, and which says when it is up."""

    def __init__(self, config: uvicorn.Config, on_started: Callable[[], None], on_signal: Callable[[int], None]):
        super().__init__(config)
        self._on_started = on_started
        self._on_signal = on_signal

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self._on_started()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield  # signals reach only the main thread: a server in a thread stops via shutdown()
            return
        originals = {sig: signal.signal(sig, lambda sig, _frame: self._on_signal(sig)) for sig in DRAIN_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in originals.items():
                signal.signal(sig, handler)


class HTTPServer:
    """Serve `app` (made by `create_app`) on `sock` (from `bind`) until a signal or `shutdown()`, then drain."""

    def __init__(
        self,
        app: FastAPI,
        sock: socket.socket,
        *,
        shutdown_timeout_s: float = 30.0,
        on_ready: Callable[[str], None] | None = None,
    ):
        if not shutdown_timeout_s >= 0:
            raise ValueError(f"--shutdown-timeout must be >= 0 seconds, got {shutdown_timeout_s}")
        self.ctx: ServingContext = app.state.ctx
        self.shutdown_timeout_s = shutdown_timeout_s
        self._socket = sock
        host, port = sock.getsockname()[:2]
        self.url = f"http://[{host}]:{port}" if sock.family == socket.AF_INET6 else f"http://{host}:{port}"
        self.ready = threading.Event()
        self.clean_exit = True  # False when the engine's shutdown failed
        self._on_ready = on_ready
        config = uvicorn.Config(
            app, lifespan="off", log_config=None, access_log=False, timeout_graceful_shutdown=int(FLUSH_TIMEOUT_S)
        )
        self._uvicorn = _Uvicorn(config, self._started, self._signalled)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain: asyncio.Task | None = None
        self._engine_stopped = False

    def run(self) -> None:
        """Serve until drained (blocking). In the main thread, SIGTERM and SIGINT start the drain."""
        asyncio.run(self.serve())

    async def serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        try:
            await self._uvicorn.serve(sockets=[self._socket])
        finally:
            self._socket.close()
            if not self._engine_stopped:  # uvicorn stopped by itself: still stop the engine
                await self._stop_engine()
            self.ctx.close()

    def shutdown(self) -> None:
        """Start the drain (thread-safe; a second call only says it is already under way)."""
        if self._loop is None:
            raise RuntimeError("the server is not running")
        self._loop.call_soon_threadsafe(self._start_drain)

    # -- inside the event loop --------------------------------------------------------------------
    def _started(self) -> None:
        self.ready.set()
        if self._on_ready is not None:
            self._on_ready(self.url)

    def _signalled(self, sig: int) -> None:
        logger.info("got %s", signal.Signals(sig).name)
        self.shutdown()

    def _start_drain(self) -> None:
        if self._drain is not None:
            logger.warning("already shutting down (up to %.0f s for requests in flight)", self.shutdown_timeout_s)
            return
        self.ctx.draining = True
        logger.warning("shutting down: no new requests; %.0f s for those in flight", self.shutdown_timeout_s)
        self._drain = asyncio.get_running_loop().create_task(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        await self._stop_engine()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + FLUSH_TIMEOUT_S
        while self.ctx.in_flight and loop.time() < deadline:
            await asyncio.sleep(POLL_S)
        self._uvicorn.should_exit = True

    async def _stop_engine(self) -> None:
        self._engine_stopped = True
        try:
            await asyncio.to_thread(self.ctx.engine.shutdown, self.shutdown_timeout_s)
        except Exception:
            self.clean_exit = False
            logger.exception("the engine's shutdown failed")

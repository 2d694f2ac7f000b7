"""What one running server holds: the engine, its settings, its metrics and whether it still admits."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from server.engine_api import AsyncEngine, ServedModel
from server.metrics import ServerMetrics

logger = logging.getLogger("server")
T = TypeVar("T")
DEFAULT_MAX_REQUEST_BYTES = 2 * 2**20  # a full context of text or token ids is well under 1 MiB of JSON


@dataclass(frozen=True)
class ServerSettings:
    """How the HTTP layer behaves (the engine's own settings are the engine's).

    served_model_name  the name /v1/models lists and requests must ask for (default: the engine's)
    api_key            when set, /v1/* needs `Authorization: Bearer <api_key>`; /health and /metrics stay open
    disconnect_poll_s  how often a non-streamed request checks that its client is still there
    max_request_bytes  the largest request body taken; a larger one is answered 413 before it is read whole
    """

    served_model_name: str | None = None
    api_key: str | None = None
    disconnect_poll_s: float = 0.1
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES

    def __post_init__(self) -> None:
        if self.served_model_name is not None and not self.served_model_name.strip():
            raise ValueError("--served-model-name must not be empty")
        if self.api_key is not None and not self.api_key:
            raise ValueError("the API key must not be empty (leave it out to serve without a key)")
        if not self.disconnect_poll_s > 0:
            raise ValueError(f"disconnect_poll_s must be > 0, got {self.disconnect_poll_s}")
        if not isinstance(self.max_request_bytes, int) or self.max_request_bytes < 1:
            raise ValueError(f"--max-request-bytes must be an integer >= 1, got {self.max_request_bytes!r}")


@dataclass
class ServingContext:
    """The state of one server. `draining` turns new requests away (503) during shutdown."""

    model: ServedModel
    engine: AsyncEngine
    settings: ServerSettings
    metrics: ServerMetrics
    draining: bool = False
    in_flight: int = 0  # HTTP requests not yet answered in full
    _fallbacks_seen: int = field(default=0, repr=False)
    # Tokenizing and other CPU-heavy request steps run here, one at a time, never on the event loop.
    _worker: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=1, thread_name_prefix="saguaro-requests"), repr=False
    )

    @property
    def model_name(self) -> str:
        return self.settings.served_model_name or self.model.model_name

    async def off_loop(self, fn: Callable[..., T], *args) -> T:
        """fn(*args) on the request worker thread, so that the event loop keeps serving meanwhile."""
        return await asyncio.get_running_loop().run_in_executor(self._worker, functools.partial(fn, *args))

    def close(self) -> None:
        """Stop the request worker thread (what it runs now finishes; nothing queued starts)."""
        self._worker.shutdown(wait=False, cancel_futures=True)

    def note_fallbacks(self) -> None:
        """Log once each time the engine has fallen back (SSD worker fault -> SD -> AR)."""
        stats = self.engine.stats()
        if stats.fallbacks > self._fallbacks_seen:
            self._fallbacks_seen = stats.fallbacks
            logger.warning(
                "engine fell back to strategy %s (fallback %d): %s",
                stats.strategy,
                stats.fallbacks,
                self.model.fault or "see the engine's warning above",
            )

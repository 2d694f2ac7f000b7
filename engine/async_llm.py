"""Serving: the decode loop on a thread of its own, requests submitted and streamed from asyncio.

    aengine = AsyncLLM(llm)
    stream = aengine.generate(prompt_ids, params, "req-1")   # ValueError / QueueFull / EngineStopped here
    async for chunk in stream: ...                           # one Chunk per round that emitted tokens
    await stream.aclose()                                    # leaving early aborts the request, freeing its row

The loop thread steps while there is work and sleeps otherwise; chunks reach each request's asyncio
queue through its event loop (call_soon_threadsafe). Torch releases the GIL in its kernels, so the event
loop stays responsive while a round runs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from pathlib import Path

from engine.decode_loop import QueueFull
from engine.llm import LLM
from engine.metrics import ServingStats
from engine.outputs import Chunk
from engine.sampling_params import SamplingParams

log = logging.getLogger(__name__)
IDLE_WAIT_S = 0.05

__all__ = ["AsyncLLM", "EngineFailed", "EngineStopped", "QueueFull", "RequestStream"]


class EngineStopped(RuntimeError):
    """The engine is shutting down or has failed: it takes no new request."""


class EngineFailed(EngineStopped):
    """The decode loop failed (a bug or a device error): every request in flight ends with this."""


class RequestStream:
    """The chunks of one request, as an async iterator; closing it early aborts the request."""

    def __init__(self, engine: AsyncLLM, request_id: str, queue: asyncio.Queue):
        self.engine = engine
        self.request_id = request_id
        self.queue = queue
        self.done = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> Chunk:
        if self.done:
            raise StopAsyncIteration
        try:
            item = await self.queue.get()
        except BaseException:  # cancelled (the client left): free the row
            await self.aclose()
            raise
        if isinstance(item, BaseException):
            await self.aclose()
            raise EngineFailed(f"the engine failed: {item}") from item
        if item.finished:
            self._finish()
        return item

    def _finish(self) -> None:
        self.done = True
        self.engine._queues.pop(self.request_id, None)

    async def aclose(self) -> None:
        if not self.done:
            self._finish()
            self.engine.abort(self.request_id)

    def __del__(self) -> None:
        if not self.done:
            self.engine.abort(self.request_id)


class AsyncLLM:
    def __init__(self, llm: LLM, *, max_waiting: int | None = 64, rounds_path: str | Path | None = None):
        """rounds_path: append every round record (JSONL, the schema the simulator fits and validates on)."""
        if llm.loop is None:
            raise ValueError("this LLM is closed: build a new one")
        if max_waiting is not None and max_waiting < 1:
            raise ValueError(f"max_waiting must be >= 1 (or None for no limit), got {max_waiting}")
        self.llm = llm
        self.loop = llm.loop
        if max_waiting is not None:
            self.loop.scheduler.config = dataclasses.replace(self.loop.scheduler.config, max_waiting=max_waiting)
        llm.serving = True
        self._rounds_file = open(rounds_path, "a", encoding="utf-8") if rounds_path is not None else None
        if self._rounds_file is not None:
            self.loop.recorder.on_record = self._write_round
        self._queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._accepting = True
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="saguaro-decode-loop", daemon=True)
        self._thread.start()

    # -- requests -----------------------------------------------------------------------------
    def generate(self, prompt_ids: list[int], params: SamplingParams, request_id: str) -> RequestStream:
        """Submit a request; its chunks arrive through the returned stream. Call from the event loop."""
        if self.failure is not None:
            raise EngineFailed(f"the engine failed: {self.failure}") from self.failure
        if not self._accepting:
            raise EngineStopped("the engine is shutting down")
        if request_id in self._queues:
            raise ValueError(f"request id {request_id!r} is already in flight")
        seq = self.llm.make_sequence(self.llm.encode(prompt_ids), params, request_id=request_id)
        queue: asyncio.Queue = asyncio.Queue()
        self._queues[request_id] = (asyncio.get_running_loop(), queue)
        try:
            self.loop.submit(seq)
        except QueueFull:
            self._queues.pop(request_id, None)
            raise
        self._wake.set()
        return RequestStream(self, request_id, queue)

    def abort(self, request_id: str) -> None:
        self.loop.abort(request_id)
        self._wake.set()

    def stats(self) -> ServingStats:
        return dataclasses.replace(self.loop.stats)

    @property
    def accepting(self) -> bool:
        return self._accepting and self.failure is None

    # -- the loop thread ----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if not self.loop.has_work:
                    self._wake.wait(IDLE_WAIT_S)
                    self._wake.clear()
                    continue
                for chunk in self.loop.step():
                    self._deliver(chunk.request_id, chunk)
        except BaseException as err:  # a bug or a device error: fail every request, take no more
            log.exception("the decode loop failed")
            self.failure = err
            for request_id in list(self._queues):
                self._deliver(request_id, err)

    def _write_round(self, record) -> None:
        if self._rounds_file is None:  # closed: the engine is shutting down
            return
        self._rounds_file.write(record.to_json() + "\n")
        self._rounds_file.flush()

    def _deliver(self, request_id: str, item) -> None:
        target = self._queues.get(request_id)
        if target is None:
            return  # the client left; its abort is on its way
        event_loop, queue = target
        try:
            event_loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # that event loop is closed
            self._queues.pop(request_id, None)

    def shutdown(self, deadline_s: float = 30.0) -> None:
        """Stop admitting, let in-flight requests finish within the deadline, abort the rest, stop the loop
        thread and close the LLM (which stops SSD's draft worker). Blocking; safe to call twice."""
        self._accepting = False
        end = time.monotonic() + max(deadline_s, 0.0)
        while self._thread.is_alive() and self.loop.has_work and time.monotonic() < end:
            time.sleep(0.02)
        if self._thread.is_alive() and self.loop.has_work:
            for request_id in list(self._queues):
                self.loop.abort(request_id)
            self._wake.set()
            end = time.monotonic() + 10.0
            while self._thread.is_alive() and self.loop.has_work and time.monotonic() < end:
                time.sleep(0.02)
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=60.0)
        self.llm.serving = False
        if self._rounds_file is not None:
            self.loop.recorder.release()
            self.loop.recorder.on_record = None
            self._rounds_file.close()
            self._rounds_file = None
        if self.llm.loop is not None:
            self.llm.close()

"""Load shapes for the bench client: open-loop Poisson arrivals at a rate, or a fixed concurrency (closed loop).

Open loop: request i is sent at its planned time whatever the server is doing (a Poisson process of `rate`
requests per second drawn from a numpy Generator; an infinite rate sends everything at once), so queues grow
when the server falls behind. Closed loop: `concurrency` users, each sending its next request when its last one
ends, so at most `concurrency` requests are ever in flight. Both stop sending at the deadline.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np

from saguaro.bench.client import Streamed

Send = Callable[[int], Awaitable[Streamed]]  # sends request i and returns what came back


def poisson_offsets_s(n: int, rate_per_s: float, rng: np.random.Generator) -> np.ndarray:
    """Planned send times, in seconds after the start, of n requests arriving as a Poisson process.

    The first request goes at 0 and the gaps are exponential with mean 1 / rate; at an infinite rate all go at 0.
    """
    if n < 1:
        raise ValueError(f"a load point sends at least one request; got {n}")
    if not rate_per_s > 0:
        raise ValueError(f"the request rate must be > 0 per second (or inf); got {rate_per_s}")
    if math.isinf(rate_per_s):
        return np.zeros(n)
    return np.concatenate([[0.0], np.cumsum(rng.exponential(1.0 / rate_per_s, size=n - 1))])


@dataclass(frozen=True)
class Sent:
    index: int  # request i of the point (prompt i modulo the prompt set)
    scheduled_s: float | None  # open loop: planned send time after the point's start
    record: Streamed


class InFlight:
    """Counts requests in flight around a sender and keeps the peak."""

    def __init__(self, send: Send):
        self._send = send
        self.now = 0
        self.peak = 0

    async def __call__(self, index: int) -> Streamed:
        self.now += 1
        self.peak = max(self.peak, self.now)
        try:
            return await self._send(index)
        finally:
            self.now -= 1


async def open_loop(send: Send, offsets_s: np.ndarray, deadline_s: float) -> list[Sent]:
    """Send request i at start + offsets_s[i] (perf_counter seconds) unless that is past the deadline; wait for
    all that were sent."""
    start = time.perf_counter()
    pending = []
    for i, offset in enumerate(offsets_s):
        at = start + float(offset)
        if at >= deadline_s:
            break
        delay = at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        pending.append((i, float(offset), asyncio.create_task(send(i))))
    return [Sent(i, offset, await task) for i, offset, task in pending]


async def closed_loop(send: Send, n: int, concurrency: int, deadline_s: float) -> list[Sent]:
    """n requests by `concurrency` users, each sending the next when its last ends; none sent after the deadline."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1; got {concurrency}")
    indices = iter(range(n))  # shared by the users: the event loop runs one at a time
    done: list[Sent] = []

    async def user() -> None:
        for i in indices:
            if time.perf_counter() >= deadline_s:
                return
            done.append(Sent(i, None, await send(i)))

    await asyncio.gather(*(user() for _ in range(min(concurrency, n))))
    return sorted(done, key=lambda s: s.index)

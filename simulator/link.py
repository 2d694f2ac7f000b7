"""The link between the target and the draft: a one-way channel with latency and bandwidth.

As in SimPy's "cable" example, the sender puts a message on the cable and carries on; the cable holds it
for `latency + bytes / bandwidth` and then delivers it to the receiver's channel. Messages sent back to back
(SSD's Prefill, then the round after it) queue for the bandwidth only: the latency is the trip, not a
turn on the wire, so both arrive `latency` after they have been put on it. The example runs one
small process per message (a timeout, then a put); here that process is reduced to its timeout, whose
callback delivers: the same events in time, at half the cost of a simulated round. With no delay the
message goes straight to the receiver's channel.

`Channel` is an unbounded SimPy Store cut to what a channel needs (FIFO `put`, `get` event, `items`):
the stock Store creates and triggers a put event and a get event per message, which costs more than the
rest of a simulated round; the simulator must run 50,000 rounds per second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

import simpy


class Channel:
    """FIFO message channel with simpy.Store's interface: `put(item)` (never blocks) and `get()` (an event)."""

    __slots__ = ("env", "items", "_getters")

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.items: list[Any] = []
        self._getters: list[simpy.Event] = []

    def put(self, item: Any) -> None:
        if self._getters:
            self._getters.pop(0).succeed(item)
        else:
            self.items.append(item)

    def get(self) -> simpy.Event:
        event = self.env.event()
        if self.items:
            event.succeed(self.items.pop(0))
        else:
            self._getters.append(event)
        return event


@dataclass(frozen=True)
class LinkSpec:
    latency_ms: float = 0.0
    bandwidth_gb_s: float = math.inf

    def __post_init__(self) -> None:
        if not self.latency_ms >= 0:
            raise ValueError(f"link latency_ms must be >= 0; got {self.latency_ms!r}")
        if not self.bandwidth_gb_s > 0:
            raise ValueError(f"link bandwidth_gb_s must be > 0 (math.inf for no limit); got {self.bandwidth_gb_s!r}")

    @property
    def instant(self) -> bool:
        return self.latency_ms == 0 and math.isinf(self.bandwidth_gb_s)

    def delay_ms(self, nbytes: float) -> float:
        return self.latency_ms + nbytes / (self.bandwidth_gb_s * 1e6)  # 1 GB/s = 1e6 bytes per ms


class Link:
    """One direction of the cable. `send(message, nbytes)` never blocks; `receive()` is a channel get event.

    Messages go on the wire one at a time (FIFO): a message waits for the one before it to be put on, takes
    `bytes / bandwidth` to be put on, and arrives `latency` later.
    """

    def __init__(self, env: simpy.Environment, spec: LinkSpec, name: str, spans: list | None = None) -> None:
        self.env = env
        self.spec = spec
        self.name = name
        self.inbox = Channel(env)  # delivered messages, read by the receiver
        self.busy_ms = 0.0
        self._spans = spans
        self._free_at_ms = 0.0  # when the last message has been put on the wire

    def send(self, message: Any, nbytes: float) -> None:
        if self.spec.instant:
            self.inbox.put(message)
            return
        env = self.env
        start_ms = max(env.now, self._free_at_ms)
        arrive_ms = start_ms + self.spec.delay_ms(nbytes)
        self._free_at_ms = arrive_ms - self.spec.latency_ms
        env.timeout(arrive_ms - env.now, (message, start_ms)).callbacks.append(self._deliver)

    def _deliver(self, carried: simpy.events.Timeout) -> None:
        message, start_ms = cast(tuple[Any, float], carried.value)  # what `send` scheduled
        now = self.env.now
        self.busy_ms += now - start_ms
        if self._spans is not None:
            self._spans.append((self.name, "transfer", start_ms, now))
        self.inbox.put(message)

    def receive(self) -> simpy.events.Event:
        return self.inbox.get()

"""The link between the target and the draft: a one-way channel with latency and bandwidth.

As in SimPy's "cable" example, the delay lives in its own small process: the sender puts a message on
the wire and carries on; `cable` holds it for `latency + bytes / bandwidth` and delivers it to the
receiving channel. With no delay the message goes straight to the receiving channel (no process at all).

`Channel` is an unbounded SimPy Store cut to what a channel needs (FIFO `put`, `get` event, `items`):
the stock Store creates and triggers a put event and a get event per message, which costs more than the
rest of a simulated round; the simulator must run 50,000 rounds per second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

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
    """One direction. `send(message, nbytes)` never blocks; `receive()` is a Store get event."""

    def __init__(self, env: simpy.Environment, spec: LinkSpec, name: str, spans: list | None = None) -> None:
        self.env = env
        self.spec = spec
        self.name = name
        self.inbox = Channel(env)  # delivered messages, read by the receiver
        self.busy_ms = 0.0
        self._spans = spans
        self._wire: Channel | None = None
        if not spec.instant:
            self._wire = Channel(env)
            env.process(cable(env, self))

    def send(self, message: Any, nbytes: float) -> None:
        if self._wire is None:
            self.inbox.put(message)
        else:
            self._wire.put((message, nbytes))

    def receive(self) -> simpy.events.Event:
        return self.inbox.get()

    def transferred(self, start_ms: float) -> None:
        self.busy_ms += self.env.now - start_ms
        if self._spans is not None:
            self._spans.append((self.name, "transfer", start_ms, self.env.now))


def cable(env: simpy.Environment, link: Link):
    """Carry messages one at a time, each held for the link's delay."""
    while True:
        message, nbytes = yield link._wire.get()
        start_ms = env.now
        yield env.timeout(link.spec.delay_ms(nbytes))
        link.inbox.put(message)
        link.transferred(start_ms)

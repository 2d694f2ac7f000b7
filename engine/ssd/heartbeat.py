"""The draft worker's heartbeat: how the target tells a worker whose process has stopped from one that is busy.

A worker process that stops (SIGSTOP, a frozen VM or container, a host swapping) keeps its sockets open, so the
link does not break: the target would wait out `DraftPlacement.deadline_s` (30 s by default, often set far
longer for slow CPU drafts) on every such fault. So the worker counts up a key in the rendezvous store from a
thread of its own every BEAT_S (`beat`), whatever its main loop is doing; the target watches the count
(`HeartbeatWatch`) and, when it has not moved for LOST_S, declares the worker lost: it kills a worker it started
(the kill breaks the link at once, and the exchange under way fails over to the fallback exactly as a worker
that died would), so a stopped worker is detected within LOST_S + BEAT_S of its last beat, 5.5 s.

A worker whose process runs but whose loop is stuck still beats; its deadline catches it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import torch.distributed as dist

log = logging.getLogger(__name__)
BEAT_KEY = "saguaro/worker_beat"
BEAT_S = 0.5  # the worker counts up this often
LOST_S = 5.0  # no count for this long: the worker's process has stopped


def beat(store: dist.Store, every_s: float = BEAT_S) -> threading.Event:
    """In the worker: count up BEAT_KEY in `store` every `every_s` seconds from a daemon thread (on a client of its
    own), until the returned event is set or the store goes away."""
    stop = threading.Event()
    client = store.clone()

    def run() -> None:
        while True:
            try:
                client.add(BEAT_KEY, 1)
            except RuntimeError:  # the target, hence its store, is gone: the worker is ending anyway
                return
            if stop.wait(every_s):
                return

    threading.Thread(target=run, name="saguaro-heartbeat", daemon=True).start()
    return stop


class HeartbeatWatch:
    """In the target: read the worker's count every `every_s` seconds from a daemon thread; once it has not moved
    for `lost_s`, call `on_lost(reason)` once and stop watching."""

    def __init__(
        self, store: dist.Store, on_lost: Callable[[str], None], every_s: float = BEAT_S, lost_s: float = LOST_S
    ):
        self.client = store.clone()
        self.on_lost = on_lost
        self.every_s, self.lost_s = every_s, lost_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="saguaro-heartbeat-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        count, moved = None, time.monotonic()
        while not self._stop.wait(self.every_s):
            try:
                now_count = self.client.add(BEAT_KEY, 0)  # reads the count
            except RuntimeError:  # the store is being torn down with the engine
                return
            now = time.monotonic()
            if now_count != count:
                count, moved = now_count, now
            elif now - moved >= self.lost_s:
                self.on_lost(f"the draft worker stopped: no heartbeat for {now - moved:.1f} s")
                return

    def stop(self) -> None:
        """Stop watching (waits for the watch thread, at most one period)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(self.every_s + 1.0)

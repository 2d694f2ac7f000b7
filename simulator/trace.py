"""The simulated timeline as a Chrome trace (chrome://tracing, ui.perfetto.dev): one row per actor."""

from __future__ import annotations

import json
from pathlib import Path

ACTORS = ("target", "draft", "link_to_draft", "link_to_target")


def chrome_trace(timeline: tuple | list) -> dict:
    """Trace Event Format: a complete ("X") event per (actor, activity, start_ms, end_ms) span, times in µs."""
    actors = list(ACTORS) + sorted({a for a, *_ in timeline} - set(ACTORS))
    tid = {actor: i for i, actor in enumerate(actors)}
    events = [{"name": "thread_name", "ph": "M", "pid": 1, "tid": tid[a], "args": {"name": a}} for a in actors]
    for actor, what, start_ms, end_ms in sorted(timeline, key=lambda span: (span[2], tid[span[0]])):
        events.append(
            {
                "name": what,
                "cat": actor,
                "ph": "X",
                "pid": 1,
                "tid": tid[actor],
                "ts": round(start_ms * 1e3, 3),
                "dur": round((end_ms - start_ms) * 1e3, 3),
            }
        )
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(timeline: tuple | list, path: str | Path) -> Path:
    if not timeline:
        raise ValueError("no timeline to write: simulate with trace=True")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(chrome_trace(timeline)), encoding="utf-8")
    return path

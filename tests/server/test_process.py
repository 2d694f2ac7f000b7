"""`saguaro serve` as its own process: it prints its URL, drains on SIGTERM and exits 0 with no child left."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest

START_TIMEOUT_S = 120.0  # imports, SmolLM2 and SSD's worker process on two cores
EXIT_TIMEOUT_S = 60.0
LISTENING = re.compile(r"^saguaro serve: listening on (http://127\.0\.0\.1:\d+)$")
SAGUARO = [sys.executable, "-c", "import sys; from saguaro.cli import main; sys.exit(main())"]


def first_line(stream, timeout_s: float) -> str | None:
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: lines.put(stream.readline()), daemon=True).start()
    try:
        return lines.get(timeout=timeout_s)
    except queue.Empty:
        return None


@pytest.fixture
def serve_process(tmp_path: Path):
    """`saguaro serve` with SSD on SmolLM2 as its own draft; killed (with its children) if a test leaves it."""
    log = (tmp_path / "stderr.txt").open("w")
    proc = subprocess.Popen(
        [
            *SAGUARO,
            "serve",
            "--target",
            "smollm2-135m",
            "--draft",
            "smollm2-135m",
            "--strategy",
            "ssd",
            "-K",
            "2",
            "--dtype",
            "float32",
            "--threads",
            "1",
            "--port",
            "0",
            "--served-model-name",
            "smol",
            "--shutdown-timeout",
            "60",
            "--rounds-out",
            str(tmp_path / "rounds.jsonl"),
        ],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    try:
        line = first_line(proc.stdout, START_TIMEOUT_S)
        match = LISTENING.match((line or "").strip())
        assert match, f"no 'listening' line, got {line!r}; stderr: {(tmp_path / 'stderr.txt').read_text()[-2000:]}"
        yield proc, match.group(1), tmp_path / "rounds.jsonl"
    finally:
        if proc.poll() is None:
            for child in psutil.Process(proc.pid).children(recursive=True):
                child.kill()
            proc.kill()
        proc.wait(EXIT_TIMEOUT_S)
        log.close()


def test_sigterm_lets_the_request_in_flight_finish_refuses_new_ones_and_exits_0(serve_process):
    proc, url, rounds = serve_process
    children = psutil.Process(proc.pid).children(recursive=True)
    assert any("spawn_main" in " ".join(c.cmdline()) for c in children)  # SSD's draft worker
    body = {
        "model": "smol",
        "prompt": "Once upon a time",
        "max_tokens": 48,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    events: list = []
    started = threading.Event()

    def stream() -> None:
        with httpx.Client(timeout=120) as client, client.stream("POST", f"{url}/v1/completions", json=body) as r:
            for line in r.iter_lines():
                if line:
                    events.append(line.removeprefix("data: "))
                    started.set()

    reader = threading.Thread(target=stream)
    reader.start()
    assert started.wait(60)
    os.kill(proc.pid, signal.SIGTERM)
    refused = None
    end = time.monotonic() + 10
    while refused is None and time.monotonic() < end:
        response = httpx.get(f"{url}/health", timeout=10)
        refused = response if response.status_code == 503 else None
    reader.join(120)
    assert proc.wait(EXIT_TIMEOUT_S) == 0
    assert refused is not None  # while draining: 503
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert sum(len(c["choices"][0]["token_ids"]) for c in chunks) == 48
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert alive == []
    records = [json.loads(line) for line in rounds.read_text().splitlines()]  # --rounds-out: the simulator's input
    assert {r["phase"] for r in records} == {"prefill", "decode"} and {r["strategy"] for r in records} == {"ssd"}

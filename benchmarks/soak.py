"""A bounded soak of `saguaro serve` on loopback (saguaro.bench.soak): mixed streamed and whole requests, clients
leaving mid-stream, bad requests and one SSD draft-worker kill, for --duration seconds (at most 600).

It starts `saguaro serve` (SSD, SmolLM2-135M as target and draft, float32, one thread each) on 127.0.0.1 and a
free port, sends each prompt alone for its solo output, runs the load, kills the draft worker at --kill-at
seconds, then stops the server with SIGTERM and checks that it exits 0 with no child left. Writes soak.json and
soak.md (the table of the serving report) into --out. Exit 0 when nothing was lost, hung or mismatched.

    python -m benchmarks.soak --duration 480 --out reports/2026-12-cpu-serving-hardening/soak
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import psutil

from saguaro.bench.prompts import load_prompts
from saguaro.bench.soak import Soak, SoakConfig, write

LISTENING = re.compile(r"^saguaro serve: listening on (http://127\.0\.0\.1:\d+)$")
START_S = 300.0
STOP_S = 60.0
NAME = "smol"


def serve_command(args) -> list[str]:
    return [
        sys.executable,
        "-m",
        "saguaro.cli",
        "serve",
        "--target",
        args.model,
        "--draft",
        args.model,
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
        NAME,
        "--batch",
        str(args.batch),
        "--max-waiting",
        "32",
        "--draft-deadline",
        str(args.draft_deadline),
        "--shutdown-timeout",
        "30",
    ]


def start(args, log: Path) -> tuple[subprocess.Popen, str]:
    """`saguaro serve` in its own process; its URL once it prints it (it is killed if it does not)."""
    proc = subprocess.Popen(serve_command(args), stdout=subprocess.PIPE, stderr=log.open("w"), text=True)
    url: list[str] = []
    reader = threading.Thread(target=lambda: url.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(START_S)
    match = LISTENING.match(url[0].strip()) if url else None
    if match is None:
        stop(proc)
        raise RuntimeError(f"saguaro serve did not start within {START_S:g} s: see {log}")
    return proc, match.group(1)


def draft_worker(server: psutil.Process) -> psutil.Process:
    return next(c for c in server.children(recursive=True) if "spawn_main" in " ".join(c.cmdline()))


def stop(proc: subprocess.Popen) -> tuple[int, int]:
    """SIGTERM, then wait; returns the exit status and the children still alive (killed if any)."""
    children = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
    try:
        code = proc.wait(STOP_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    _, alive = psutil.wait_procs(children, timeout=10)
    for child in alive:
        child.kill()
    return code, len(alive)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=480.0, help="seconds of load (at most 600)")
    parser.add_argument("--kill-at", type=float, default=None, help="seconds into the load (default: a third)")
    parser.add_argument(
        "--warmup",
        type=float,
        default=None,
        help="seconds of load before the memory counts (default: a quarter of the time before the kill)",
    )
    parser.add_argument("--concurrency", type=int, default=6)
    parser.add_argument("--batch", type=int, default=4, help="the server's batch rows")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--prompts", type=int, default=8, help="Spec-Bench prompts, each with its solo output")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--draft-deadline", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    prompts = tuple(p.text for p in load_prompts("spec_bench", args.prompts))
    log = Path(tempfile.gettempdir()) / f"saguaro-soak-serve-{os.getpid()}.log"  # the server's stderr
    proc, url = start(args, log)
    try:
        server = psutil.Process(proc.pid)
        worker = draft_worker(server)
        config = SoakConfig(
            url=url,
            model=NAME,
            prompts=prompts,
            duration_s=args.duration,
            concurrency=args.concurrency,
            max_tokens=args.max_tokens,
            seed=args.seed,
            fault_at_s=args.duration / 3 if args.kill_at is None else args.kill_at,
            warmup_s=args.warmup,
        )
        result = Soak(config, fault=worker.kill, rss=lambda: server.memory_info().rss).run()
    finally:
        code, left = stop(proc)
    summary = write(result, args.out)
    print((args.out / "soak.md").read_text())
    print(f"server exit status {code}; children left {left}; its log: {log}")
    return 0 if summary["passed"] and code == 0 and left == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())

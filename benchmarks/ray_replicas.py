"""The plain server against 1 and 2 engine replicas on Ray Serve, at the same Poisson rates, beside the
simulator's prediction (what `saguaro plan` checks a replica count with: Poisson arrivals at rate / replicas).

    python -m benchmarks.ray_replicas --out runs/ray-replicas --rates 0.5 1 2 -n 24 --tokens 64

Each system is `saguaro serve --strategy ar --threads 1` on the smoke model (SmolLM2-135M), started on a free
loopback port, warmed up, loaded by `saguaro bench --url` at each rate and stopped with SIGTERM. The plain server
also writes its round records (--rounds-out): the simulator's timing is fitted on them alone (`simulate --fit`),
and predicts every system's TTFT and TPOT at rate / replicas per replica. summary.json and summary.md land in
--out beside the run folders.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

START_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 60.0
WARMUP_REQUESTS = 8  # enough that both replicas have run a batch before the clock starts
MODEL = "smollm2-135m"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "saguaro.cli", *args]


def start(replicas: int | None, port: int, batch: int, rounds: Path | None, log: Path) -> subprocess.Popen:
    command = cli(
        "serve",
        "--target",
        MODEL,
        "--strategy",
        "ar",
        "--threads",
        "1",
        "--batch",
        str(batch),
        "--port",
        str(port),
        "--shutdown-timeout",
        "10",
    )
    if replicas is not None:
        command += ["--replicas", str(replicas), "--ray-cpus", str(os.cpu_count())]
    if rounds is not None:
        command += ["--rounds-out", str(rounds)]
    out = open(log, "w")
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=out, text=True)
    ready = threading.Event()

    def read() -> None:
        for line in process.stdout:
            out.write(line)
            out.flush()
            if "listening on" in line:
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(START_TIMEOUT_S):
        process.kill()
        raise RuntimeError(f"the server did not start: see {log}")
    return process


def stop(process: subprocess.Popen) -> float:
    """SIGTERM, then the seconds it took to exit (status 0 expected)."""
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    status = process.wait(STOP_TIMEOUT_S)
    if status != 0:
        raise RuntimeError(f"the server exited with status {status}")
    return time.monotonic() - started


def warm_up(url: str, tokens: int) -> None:
    body = {"model": MODEL, "prompt": "Write a short story about a cat.", "max_tokens": tokens, "temperature": 0}
    threads = [
        threading.Thread(target=lambda: httpx.post(f"{url}/v1/completions", json=body, timeout=300))
        for _ in range(WARMUP_REQUESTS)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def bench(url: str, label: str, args, out: Path) -> Path:
    command = cli(
        "bench",
        "--url",
        f"{url}/v1",
        "--label",
        label,
        "--rate",
        *map(str, args.rates),
        "-n",
        str(args.num_prompts),
        "--max-new-tokens",
        str(args.tokens),
        "--ignore-eos",
        "--prompts",
        "spec_bench",
        "--temperature",
        "0",
        "--out",
        str(out),
        "--name",
        label,
        "--no-progress",
    )
    subprocess.run(command, check=True)
    return max((p for p in out.glob(f"*-{label}") if p.is_dir()), key=lambda p: p.stat().st_mtime)


def points(run: Path) -> list[dict]:
    return json.loads((run / "summary.json").read_text())["points"]


def prompt_tokens(run: Path) -> float:
    lines = [json.loads(line) for line in (run / "requests.jsonl").read_text().splitlines() if line.strip()]
    counts = [line["prompt_tokens"] for line in lines if line.get("prompt_tokens")]
    return sum(counts) / len(counts)


def predict(rounds: Path, rate: float, replicas: int, prompt_len: int, args, out: Path) -> dict:
    """The simulator's open loop at rate / replicas for one replica (plan's check of a replica count)."""
    path = out / f"predicted-{replicas}x-{rate:g}.json"
    subprocess.run(
        cli(
            "simulate",
            "--fit",
            str(rounds),
            "--strategy",
            "ar",
            "--batch",
            str(args.batch),
            "--rate",
            str(rate / replicas),
            "--prompt-len",
            str(prompt_len),
            "--output-len",
            str(args.tokens),
            "--json",
            str(path),
        ),
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return json.loads(path.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rates", type=float, nargs="+", default=[0.5, 1.0, 2.0])
    parser.add_argument("-n", "--num-prompts", type=int, default=24)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--systems", nargs="+", default=["plain", "ray1", "ray2"])
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rounds = args.out / "plain-rounds.jsonl"
    replicas_of = {"plain": None, "ray1": 1, "ray2": 2}
    runs, stops = {}, {}
    for system in args.systems:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        process = start(
            replicas_of[system],
            port,
            args.batch,
            rounds if system == "plain" else None,
            args.out / f"{system}-server.log",
        )
        try:
            warm_up(url, args.tokens)
            runs[system] = bench(url, system, args, args.out)
        finally:
            stops[system] = stop(process) if process.poll() is None else None
    summary = {
        "rates": args.rates,
        "tokens": args.tokens,
        "batch": args.batch,
        "stop_s": stops,
        "runs": {system: str(run) for system, run in runs.items()},
        "measured": {system: points(run) for system, run in runs.items()},
    }
    if rounds.exists():
        prompt_len = round(prompt_tokens(next(iter(runs.values()))))
        summary["prompt_len"] = prompt_len
        summary["predicted"] = {
            system: {
                str(rate): predict(rounds, rate, replicas_of[system] or 1, prompt_len, args, args.out)
                for rate in args.rates
            }
            for system in runs
        }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    (args.out / "summary.md").write_text(table(summary))
    print(table(summary))
    print(f"wrote {args.out / 'summary.json'} and summary.md")


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def table(summary: dict) -> str:
    """One row per system and rate: measured throughput, TTFT and TPOT p50/p99, and the prediction beside them
    (ms; "overloaded" where the simulator finds the rate beyond the replicas' capacity)."""
    rows = [
        "| system | rate (req/s) | output tok/s | TTFT p50 / p99 | predicted | TPOT p50 / p99 | predicted |",
        "|---|---|---|---|---|---|---|",
    ]
    for system, measured in summary["measured"].items():
        for point in measured:
            rate = point["rate"]
            predicted = summary.get("predicted", {}).get(system, {}).get(str(float(rate)))
            result = predicted["results"][0] if predicted else None
            if result is None:
                ttft = tpot = "-"
            elif result["settings"].get("overloaded"):
                ttft = tpot = f"overloaded (capacity {result['settings']['capacity_rps']:.2f}/s)"
            else:
                ttft = f"{_ms(result['ttft_ms']['p50'])} / {_ms(result['ttft_ms']['p99'])}"
                tpot = f"{_ms(result['tpot_ms']['p50'])} / {_ms(result['tpot_ms']['p99'])}"
            rows.append(
                f"| {system} | {rate:g} | {point['output_tokens_per_s']:.1f} | "
                f"{_ms(point['p50_ttft_ms'])} / {_ms(point['p99_ttft_ms'])} | {ttft} | "
                f"{_ms(point['p50_tpot_ms'])} / {_ms(point['p99_tpot_ms'])} | {tpot} |"
            )
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    main()

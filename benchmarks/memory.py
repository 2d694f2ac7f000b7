"""Peak resident memory of the target process and of the SSD draft worker against batch size and budget.

A thread polls RSS every 20 ms (psutil) while one SSD generate() runs; the worker is the child process that
grows most. Prints a Markdown table and the worker's up-front estimate (engine.ssd.memory) for comparison.

    python -m benchmarks.memory --target smollm2-135m --draft smollm2-135m --batch 1 8 32 --budget 6 12 24
"""

from __future__ import annotations

import argparse
import threading
import time

import psutil


def _poll(stop: threading.Event, peaks: dict) -> None:
    me = psutil.Process()
    while not stop.is_set():
        try:
            peaks["target"] = max(peaks.get("target", 0), me.memory_info().rss)
            for child in me.children(recursive=True):
                rss = child.memory_info().rss
                peaks["worker"] = max(peaks.get("worker", 0), rss)
        except psutil.Error:
            pass
        time.sleep(0.02)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--draft", default="smollm2-135m")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--budget", type=int, nargs="+", default=[6, 12, 24])
    p.add_argument("-K", type=int, default=4)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=None)
    args = p.parse_args(argv)

    from engine import LLM, SamplingParams, SpeculativeConfig
    from engine.ssd.memory import worker_bytes_per_sequence

    prompt = "Write a short story about a robot who learns to paint, in three sentences."
    params = SamplingParams(temperature=args.temperature, top_k=args.top_k, max_new_tokens=args.tokens,
                            stop_on_eos=False, seed=0)
    print("| batch | budget | target peak MiB | worker peak MiB | estimate for the cache MiB |")
    print("|---|---|---|---|---|")
    for budget in args.budget:
        spec = SpeculativeConfig(K=args.K, budget=budget)
        with LLM(args.target, args.draft, strategy="ssd", speculative=spec, dtype=args.dtype) as llm:
            for batch in args.batch:
                peaks: dict = {}
                stop = threading.Event()
                poller = threading.Thread(target=_poll, args=(stop, peaks), daemon=True)
                poller.start()
                out = llm.generate([prompt] * batch, params)
                stop.set()
                poller.join()
                context = max(len(o.token_ids) for o in out) + len(llm.encode(prompt))
                estimate = batch * worker_bytes_per_sequence(llm.draft, args.K, budget, context)
                print(f"| {batch} | {budget} | {peaks.get('target', 0) / 2**20:.0f} | "
                      f"{peaks.get('worker', 0) / 2**20:.0f} | {estimate / 2**20:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

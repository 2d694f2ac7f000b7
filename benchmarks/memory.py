"""Peak resident memory of the target process and of the SSD draft worker against batch size and budget.

A thread polls RSS every 20 ms (psutil) while one SSD generate() runs; the worker is the child process that
grows most. Prints a Markdown table and the worker's up-front estimate (engine.ssd.memory) for comparison.

    python -m benchmarks.memory --target smollm2-135m --draft smollm2-135m --batch 1 8 32 --budget 6 12 24
    python -m benchmarks.memory --batch 32 --budget 12 --prompt-len 256 1024 --json runs/memory.jsonl

Without --prompt-len every row gets the same short sentence. With it, each row gets its own prompt of that many
random token ids (seeded by row), so no two rows share a prefix (a prefix cache shares nothing), and each
(budget, prompt length) gets a fresh engine and worker, warmed up on one short prompt; the table then also
gives the worker's resident memory before the batch (the model and the runtime), its growth to the peak, and
the target's KV for the same rows, 2 · layers · kv_heads · head_dim · element bytes · (prompt + new tokens) ·
rows from the target's config (engine.ssd.memory.kv_bytes_per_token), and the rows that ran at once (the
scheduler's memory limit may admit fewer than the batch).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

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


def _worker_rss() -> int:
    """The largest child's resident bytes now (0 before the worker starts)."""
    sizes = []
    for child in psutil.Process().children(recursive=True):
        try:
            sizes.append(child.memory_info().rss)
        except psutil.Error:
            pass
    return max(sizes, default=0)


def _measure(llm, prompts: list, params) -> dict:
    """Peaks (bytes) of one generate() over `prompts`, the worker's RSS before it and the rows run at once."""
    before = _worker_rss()
    peaks: dict = {}
    stop = threading.Event()
    poller = threading.Thread(target=_poll, args=(stop, peaks), daemon=True)
    poller.start()
    try:
        out = llm.generate(prompts, params)
    finally:
        stop.set()
        poller.join()
    decode = [r for r in out.metrics.rounds if r.phase == "decode"]
    return {
        "target": peaks.get("target", 0),
        "worker": peaks.get("worker", 0),
        "worker_before": before,
        "rows_at_once": max((r.batch_size for r in decode), default=0),
        "new_tokens": max(len(o.token_ids) for o in out),
    }


def _random_prompts(rows: int, length: int, vocab: int) -> list[list[int]]:
    import torch

    prompts = []
    for row in range(rows):
        gen = torch.Generator().manual_seed(1000 + row)
        prompts.append(torch.randint(100, vocab, (length,), generator=gen).tolist())
    return prompts


def _sentence_table(args, llm_kwargs: dict) -> None:
    from engine import LLM, SamplingParams, SpeculativeConfig
    from engine.ssd.memory import worker_bytes_per_sequence

    prompt = "Write a short story about a robot who learns to paint, in three sentences."
    params = SamplingParams(
        temperature=args.temperature, top_k=args.top_k, max_new_tokens=args.tokens, stop_on_eos=False, seed=0
    )
    print("| batch | budget | target peak MiB | worker peak MiB | estimate for the cache MiB |")
    print("|---|---|---|---|---|")
    for budget in args.budget:
        spec = SpeculativeConfig(K=args.K, budget=budget)
        with LLM(args.target, args.draft, strategy="ssd", speculative=spec, **llm_kwargs) as llm:
            for batch in args.batch:
                m = _measure(llm, [prompt] * batch, params)
                context = m["new_tokens"] + len(llm.encode(prompt))
                estimate = batch * worker_bytes_per_sequence(llm.draft, args.K, budget, context)
                print(
                    f"| {batch} | {budget} | {m['target'] / 2**20:.0f} | "
                    f"{m['worker'] / 2**20:.0f} | {estimate / 2**20:.0f} |",
                    flush=True,
                )


def _context_table(args, llm_kwargs: dict) -> None:
    from engine import LLM, SamplingParams, SpeculativeConfig
    from engine.ssd.memory import kv_bytes_per_token

    params = SamplingParams(
        temperature=args.temperature, top_k=args.top_k, max_new_tokens=args.tokens, stop_on_eos=False, seed=0
    )
    mib = 2**20
    print(
        "| batch | budget | prompt | rows at once | target peak MiB | worker before MiB | worker peak MiB | "
        "worker growth MiB | target KV MiB | peak / KV | growth / KV |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for budget in args.budget:
        for length in args.prompt_len:
            spec = SpeculativeConfig(K=args.K, budget=budget)
            with LLM(args.target, args.draft, strategy="ssd", speculative=spec, **llm_kwargs) as llm:
                vocab = llm.target.get_input_embeddings().num_embeddings
                per_token = kv_bytes_per_token(llm.target)
                llm.generate([_random_prompts(1, 8, vocab)[0]], params)  # starts the worker; shapes warmed up
                for batch in args.batch:
                    m = _measure(llm, _random_prompts(batch, length, vocab), params)
                    kv = per_token * (length + m["new_tokens"]) * m["rows_at_once"]
                    growth = m["worker"] - m["worker_before"]
                    row = {
                        "batch": batch,
                        "budget": budget,
                        "K": args.K,
                        "prompt_len": length,
                        "new_tokens": m["new_tokens"],
                        "rows_at_once": m["rows_at_once"],
                        "target_peak_bytes": m["target"],
                        "worker_before_bytes": m["worker_before"],
                        "worker_peak_bytes": m["worker"],
                        "target_kv_bytes": kv,
                        "kv_bytes_per_token": per_token,
                        "target": args.target,
                        "draft": args.draft,
                        "dtype": args.dtype,
                        "prefix_caching": args.prefix_caching,
                    }
                    print(
                        f"| {batch} | {budget} | {length} | {m['rows_at_once']} | {m['target'] / mib:.0f} | "
                        f"{m['worker_before'] / mib:.0f} | {m['worker'] / mib:.0f} | {growth / mib:.0f} | "
                        f"{kv / mib:.0f} | {m['worker'] / kv:.2f} | {growth / kv:.2f} |",
                        flush=True,
                    )
                    if args.json is not None:
                        with args.json.open("a") as f:
                            f.write(json.dumps(row) + "\n")


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
    p.add_argument(
        "--prompt-len",
        type=int,
        nargs="+",
        help="a prompt of this many random token ids per row, its own per row (several: a fresh "
        "engine each); the table adds the worker's growth against the target's KV",
    )
    p.add_argument(
        "--no-prefix-caching",
        action="store_false",
        dest="prefix_caching",
        help="LLM(prefix_caching=False) (an engine without a prefix cache takes no such argument)",
    )
    p.add_argument("--json", type=Path, help="with --prompt-len: append one JSON line per row of the table here")
    args = p.parse_args(argv)
    if args.json is not None and not args.prompt_len:
        p.error("--json writes the --prompt-len table: add --prompt-len N")
    if args.prompt_len and min(args.prompt_len) < 1:
        p.error("--prompt-len must be >= 1")
    llm_kwargs: dict = {"dtype": args.dtype}
    if not args.prefix_caching:
        llm_kwargs["prefix_caching"] = False
    if args.prompt_len:
        _context_table(args, llm_kwargs)
    else:
        _sentence_table(args, llm_kwargs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What a verify of n tokens costs against one token, for the target's kernels on one CPU thread.

Speculative decoding pays off when the target checks K + 1 tokens in about the time of one: true where a
forward is bound by reading the weights, false where it is bound by arithmetic. This times one forward of n
new tokens on one row, after `--context` cached tokens, for:

* llama.cpp on the target's Q4_K_M GGUF (llama-cpp-python's low-level API: one llama_decode of n tokens with
  logits at every position, as a verify needs, then the n positions removed from the KV cache again);
* our int4 target (torch's `_weight_int4pack_mm_for_cpu`, group 32) with its int8 head, as bench's
  `--target-quant int4 --target-head-quant int8` loads it;
* our bfloat16 target.

Each system is timed on its own (median of `--reps` forwards after one warm-up), all in one process. Then, with
llama.cpp's one-token step as the baseline (llama.cpp AR), it prints the most any speculative decoder could gain
with the fastest of these kernels at each block size: a free draft, every verify the cheapest kernel's
T(K + 1), E(K) = (1 - α^(K+1)) / (1 - α) tokens per round. Run it alone (timing).

    python -m benchmarks.verify_scaling [--systems llamacpp int4 bf16] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

TOKENS = (1, 2, 3, 4, 5, 8, 16)
ALPHAS = (0.6, 0.8, 0.9, 1.0)


def time_llamacpp(gguf: Path, tokens: tuple[int, ...], context: int, reps: int, threads: int) -> dict[int, float]:
    import llama_cpp as L
    import numpy as np

    logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)  # llama.cpp's load chatter off
    L.llama_backend_init()
    model = L.llama_model_load_from_file(str(gguf).encode(), L.llama_model_default_params())
    params = L.llama_context_default_params()
    params.n_ctx = context + max(tokens) + 64
    params.n_batch = params.n_ubatch = max(512, max(tokens))
    params.n_seq_max = 1
    params.n_threads = params.n_threads_batch = threads
    ctx = L.llama_init_from_model(model, params)
    memory = L.llama_get_memory(ctx)
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    batch = L.llama_batch_init(max(context, max(tokens)), 0, 1)
    generator = torch.Generator().manual_seed(0)

    def decode(ids: list[int], start: int, all_logits: bool) -> float:
        for i, token in enumerate(ids):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, start + i, 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1 if all_logits or i == len(ids) - 1 else 0
        batch.n_tokens = len(ids)
        t0 = time.perf_counter()
        if L.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        logits = np.ctypeslib.as_array(L.llama_get_logits(ctx), shape=(len(ids) if all_logits else 1, n_vocab))
        logits.sum()  # the logits are read, as a verifier reads them
        return (time.perf_counter() - t0) * 1e3

    try:
        decode(torch.randint(1000, 20000, (context,), generator=generator).tolist(), 0, all_logits=False)
        out = {}
        for n in tokens:
            times = []
            for _ in range(reps + 1):
                times.append(decode(torch.randint(1000, 20000, (n,), generator=generator).tolist(), context, True))
                L.llama_memory_seq_rm(memory, 0, context, -1)
            out[n] = statistics.median(times[1:])
            print(f"  llamacpp 1 x {n}: {out[n]:.1f} ms", flush=True)
        return out
    finally:
        L.llama_batch_free(batch)
        L.llama_free(ctx)
        L.llama_model_free(model)


def time_torch(which: str, target: str, tokens: tuple[int, ...], context: int, reps: int) -> dict[int, float]:
    from engine.config import QuantConfig
    from engine.kv_cache import KVState
    from engine.loading.models import load_model, load_quantized

    if which == "int4":
        model = load_quantized(target, QuantConfig("int4", 32, head="int8"), dtype=torch.bfloat16).model
    else:
        model = load_model(target, dtype=torch.bfloat16).model
    generator = torch.Generator().manual_seed(0)
    state = KVState(model, 1, torch.device("cpu"))
    state.extend(torch.randint(1000, 20000, (1, context), generator=generator), logits_to_keep=1)
    out = {}
    for n in tokens:
        times = []
        for _ in range(reps + 1):
            block = torch.randint(1000, 20000, (1, n), generator=generator)
            t0 = time.perf_counter()
            state.extend(block).float().sum()
            times.append((time.perf_counter() - t0) * 1e3)
            state.rollback(torch.tensor([n]))
        out[n] = statistics.median(times[1:])
        print(f"  {which} 1 x {n}: {out[n]:.1f} ms", flush=True)
    del model, state
    return out


def bound_rows(results: dict[str, dict[int, float]], baseline: str) -> list[dict]:
    """Per α, the best speedup over `baseline`'s one-token step that a free, perfect-timing draft could reach."""
    t1 = results[baseline][1]
    blocks = sorted(set.intersection(*(set(r) for r in results.values())))
    rows = []
    for alpha in ALPHAS:
        best = None
        for n in blocks:
            if n < 2:
                continue
            K = n - 1
            expected = float(n) if alpha == 1.0 else (1 - alpha**n) / (1 - alpha)
            cheapest = min(results, key=lambda name: results[name][n])
            speedup = expected * t1 / results[cheapest][n]
            if best is None or speedup > best["speedup"]:
                best = dict(
                    alpha=alpha,
                    K=K,
                    tokens_per_round=round(expected, 3),
                    verify_ms=results[cheapest][n],
                    kernel=cheapest,
                    speedup=round(speedup, 3),
                )
        rows.append(best)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="qwen-coder-1.5b")
    parser.add_argument(
        "--systems", nargs="+", default=["llamacpp", "int4", "bf16"], choices=["llamacpp", "int4", "bf16"]
    )
    parser.add_argument("--tokens", nargs="+", type=int, default=list(TOKENS))
    parser.add_argument("--context", type=int, default=300, help="cached tokens before the timed forwards")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if args.context < 1 or args.reps < 1 or args.threads < 1 or min(args.tokens) < 1 or 1 not in args.tokens:
        parser.error("--context, --reps, --threads and every --tokens must be >= 1, and --tokens must include 1")
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(args.threads)
    tokens = tuple(sorted(set(args.tokens)))
    results: dict[str, dict[int, float]] = {}
    for name in args.systems:
        print(f"{name}:", flush=True)
        if name == "llamacpp":
            from saguaro.bench.peers import gguf_path, llamacpp_missing

            missing = llamacpp_missing()
            if missing:
                print(f"  {missing}")
                continue
            results[name] = time_llamacpp(gguf_path(args.target), tokens, args.context, args.reps, args.threads)
        else:
            results[name] = time_torch(name, args.target, tokens, args.context, args.reps)

    cpu = platform.processor() or platform.machine()
    try:
        info = Path("/proc/cpuinfo").read_text().splitlines()
        cpu = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
        flags = set(next(line.split(":", 1)[1].split() for line in info if line.startswith("flags")))
        cpu += " (" + ", ".join(f for f in ("avx512f", "avx512_vnni", "avx512_bf16", "amx_tile") if f in flags) + ")"
    except (OSError, StopIteration):
        pass
    print(f"\nCPU: {cpu}; {args.threads} thread(s); {args.context} cached tokens; median of {args.reps}")
    names = list(results)
    print("| tokens | " + " | ".join(f"{n} ms (× own 1-token)" for n in names) + " |")
    print("|---|" + "---|" * len(names))
    for n in tokens:
        cells = [f"{results[s][n]:.1f} ({results[s][n] / results[s][1]:.2f}×)" for s in names]
        print(f"| {n} | " + " | ".join(cells) + " |")
    bounds = []
    if "llamacpp" in results:
        bounds = bound_rows(results, "llamacpp")
        print("\nBest case of any speculative decoder over llama.cpp AR (free draft, cheapest verify kernel):")
        print("| α | best K | tokens/round | verify ms (kernel) | speedup bound |")
        print("|---|---|---|---|---|")
        for b in bounds:
            print(
                f"| {b['alpha']} | {b['K']} | {b['tokens_per_round']} | {b['verify_ms']:.1f} ({b['kernel']}) | "
                f"{b['speedup']:.2f}× |"
            )
    if args.json:
        args.json.write_text(
            json.dumps(
                dict(
                    cpu=cpu,
                    threads=args.threads,
                    context=args.context,
                    reps=args.reps,
                    ms={s: {str(n): v for n, v in r.items()} for s, r in results.items()},
                    bounds=bounds,
                ),
                indent=1,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

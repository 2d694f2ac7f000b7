"""Per-forward time of the target's verify (K + 1 tokens) and the draft's step (1 token), eager against
compiled, at each batch size: what `--compile` buys per forward on this machine.

Three paths per (model, forward, batch), each after `--context` cached tokens per row:

* eager     the engine's default: engine.kv_cache.KVState (transformers' DynamicCache) and an eager forward;
* static    the static slot cache of engine.static_cache with its bucket padding, run eagerly (what the cache
            itself costs or saves, apart from compiling);
* compiled  the same, compiled once per bucket (engine.compiled: inductor on a CPU, CUDA graphs on CUDA);
* tpN       with `--tp N`, the target only: eager forwards of a target sharded over N ranks (engine.tp).

What compiling saves per forward, over the model's layers, is the per-layer launch overhead the simulator's
presets state (`saved_per_layer_us`, at batch 1: (eager - compiled) / layers).

Each forward is timed alone (device synchronised before and after), `--reps` times after `--warmup` untimed
ones; the table gives the median and the compiled bucket's first call (its compile time). The models are the
default pair by alias (`--target`, `--draft`), or random weights in a real model's shapes (`--shapes`; no
download: for a machine without the model files, such as a GPU check), or `--shapes tiny` for a smoke run.
Run it alone (timing):

    python -m benchmarks.compiled_forward --device cpu --batch 1 8 --out reports/<folder>
    python -m benchmarks.compiled_forward --device cuda --shapes qwen-coder --dtype bfloat16 --out <folder>

From Python (a GPU check): `compare_forwards(device="cuda", shapes="qwen-coder")` returns the rows.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

# Random-weight stand-ins: (target, draft) Qwen2 / Llama configs of real models (config.json values).
SHAPES = {
    "qwen-coder": (  # the default pair: Qwen2.5-Coder-1.5B and -0.5B (simulator/presets.py, docs/models-and-data.md)
        dict(
            model_type="qwen2",
            hidden_size=1536,
            intermediate_size=8960,
            num_hidden_layers=28,
            num_attention_heads=12,
            num_key_value_heads=2,
            vocab_size=151936,
            tie_word_embeddings=False,
        ),
        dict(
            model_type="qwen2",
            hidden_size=896,
            intermediate_size=4864,
            num_hidden_layers=24,
            num_attention_heads=14,
            num_key_value_heads=2,
            vocab_size=151936,
            tie_word_embeddings=True,
        ),
    ),
    "llama": (  # Llama-3.1-8B and Llama-3.2-1B
        dict(
            model_type="llama",
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            vocab_size=128256,
            tie_word_embeddings=False,
        ),
        dict(
            model_type="llama",
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=16,
            num_attention_heads=32,
            num_key_value_heads=8,
            vocab_size=128256,
            tie_word_embeddings=True,
        ),
    ),
    "tiny": (  # a smoke run
        dict(
            model_type="qwen2",
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=512,
            tie_word_embeddings=False,
        ),
        dict(
            model_type="qwen2",
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=512,
            tie_word_embeddings=True,
        ),
    ),
}
PATHS = ("eager", "static", "compiled")


def random_model(shape: dict, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    """A causal LM with random weights in `shape`, built on `device` directly."""
    from transformers import AutoConfig, AutoModelForCausalLM

    shape = dict(shape)
    config = AutoConfig.for_model(shape.pop("model_type"), max_position_embeddings=32768, **shape)
    with torch.device(device):  # the weights are noise: only their shapes matter here
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval().requires_grad_(False)


def named_model(alias: str, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    from engine.loading.models import load_model

    return load_model(alias, dtype=dtype, device=device).model


def synchronise(device: torch.device) -> Callable[[], None]:
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def time_forwards(state, block: int, batch: int, vocab: int, reps: int, warmup: int, sync) -> tuple[list[float], float]:
    """ms per forward of `block` new tokens on every row (rolled back after each), and the first call's ms."""
    generator = torch.Generator().manual_seed(1)
    times, first = [], 0.0
    for i in range(warmup + reps):
        tokens = torch.randint(0, vocab, (batch, block), generator=generator).to(state.lengths.device)
        sync()
        t0 = time.perf_counter()
        state.extend(tokens)
        sync()
        ms = (time.perf_counter() - t0) * 1e3
        state.rollback(torch.full((batch,), block, dtype=torch.long))
        if i == 0:
            first = ms
        if i >= warmup:
            times.append(ms)
    return times, first


def measure(
    model: torch.nn.Module, role: str, block: int, batches: list[int], args, device: torch.device, tp_target=None
) -> list[dict]:
    """The rows of one model: each batch size on each path (and `tp_target`'s, the same model over ranks)."""
    from engine.compile_config import CompileConfig
    from engine.compiled import SlotModel
    from engine.kv_cache import KVState

    vocab = model.get_output_embeddings().out_features
    layers = model.config.get_text_config().num_hidden_layers
    sync = synchronise(device)
    rows = []
    paths = PATHS + ((f"tp{args.tp}",) if tp_target is not None else ())
    for batch in batches:
        for path in paths:
            settings = CompileConfig(
                max_len=args.context + block + 1, batch_buckets=(batch,), compiled=path == "compiled"
            )
            if path == "eager":
                state = KVState(model, batch, device)
            elif path.startswith("tp"):
                state = tp_target.new_kv_state(batch, device)
            else:
                runner = SlotModel(model, settings, device, name=role, max_tokens=block, rows=batch)
                state = runner.new_kv_state(batch, device)
            context = torch.randint(0, vocab, (batch, args.context), generator=torch.Generator().manual_seed(0))
            state.extend(context.to(device), logits_to_keep=1)  # the rows' past, prefilled eagerly
            times, first = time_forwards(state, block, batch, vocab, args.reps, args.warmup, sync)
            rows.append(
                {
                    "model": role,
                    "forward": "verify" if role == "target" else "draft step",
                    "tokens": block,
                    "batch": batch,
                    "context": args.context,
                    "layers": layers,
                    "path": path,
                    "median_ms": statistics.median(times),
                    "p10_ms": sorted(times)[len(times) // 10],
                    "p90_ms": sorted(times)[(9 * len(times)) // 10],
                    "first_call_ms": first,
                }
            )
            logging.getLogger(__name__).info(
                "%s %s b=%d %s: %.2f ms (first call %.0f ms)",
                role,
                rows[-1]["forward"],
                batch,
                path,
                rows[-1]["median_ms"],
                first,
            )
            del state
    return rows


def summarise(rows: list[dict]) -> list[dict]:
    """One line per (model, forward, batch): each path's median, compiled's speedup over eager, what it saves
    per layer, and the compiled bucket's compile time."""
    out = []
    keys = sorted(
        {(r["model"], r["forward"], r["tokens"], r["batch"]) for r in rows}, key=lambda k: (k[0] != "target", k[3])
    )
    for model, forward, tokens, batch in keys:
        by = {
            r["path"]: r
            for r in rows
            if (r["model"], r["forward"], r["tokens"], r["batch"]) == (model, forward, tokens, batch)
        }
        eager, compiled = by["eager"]["median_ms"], by["compiled"]["median_ms"]
        line = {
            "model": model,
            "forward": f"{forward} ({tokens} tok)",
            "batch": batch,
            **{f"{p}_ms": round(r["median_ms"], 3) for p, r in by.items()},
            "eager_over_compiled": round(eager / compiled, 3),
            "saved_per_layer_us": round((eager - compiled) / by["eager"]["layers"] * 1e3, 1),
            "compile_s": round((by["compiled"]["first_call_ms"] - compiled) / 1e3, 1),
        }
        out.append(line)
    return out


def table(rows: list[dict]) -> str:
    summary = summarise(rows)
    columns = list(summary[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(line.get(c, "")) for c in columns) + " |" for line in summary]
    return "\n".join(lines)


def compare_forwards(
    device: str = "cuda",
    shapes: str | None = "qwen-coder",
    dtype: str = "bfloat16",
    batches: tuple[int, ...] = (1, 8),
    K: int = 4,
    context: int = 256,
    reps: int = 20,
    warmup: int = 3,
) -> list[dict]:
    """The per-forward rows for `shapes` (random weights) or, with shapes=None, the default pair by alias."""
    argv = [
        "--device",
        device,
        "--dtype",
        dtype,
        "--batch",
        *map(str, batches),
        "-K",
        str(K),
        "--context",
        str(context),
        "--reps",
        str(reps),
        "--warmup",
        str(warmup),
    ] + (["--shapes", shapes] if shapes else [])
    return run(parser().parse_args(argv))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.compiled_forward", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--target", default="qwen-coder-1.5b", help="alias or folder (ignored with --shapes)")
    p.add_argument("--draft", default="qwen-coder-0.5b", help="alias or folder (ignored with --shapes)")
    p.add_argument("--shapes", choices=sorted(SHAPES), help="random weights in these models' shapes instead")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    p.add_argument("-K", type=int, default=4, help="draft tokens per round: the verify feeds K + 1")
    p.add_argument("--context", type=int, default=256, help="tokens already cached per row")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    p.add_argument(
        "--tp",
        type=int,
        default=1,
        help="also time the target's forwards over this many ranks (eager, engine.tp; a model by alias only)",
    )
    p.add_argument("--out", type=Path, help="folder for forward_times.json and forward_times.md")
    return p


def run(args) -> list[dict]:
    """Measure every row the flags ask for."""
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.tp > 1 and args.shapes:
        raise ValueError("--tp loads the target by alias in every rank: drop --shapes")
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    rows = []
    for role, block in (("target", args.K + 1), ("draft", 1)):
        if args.shapes:
            model = random_model(SHAPES[args.shapes][role == "draft"], dtype, device)
        else:
            model = named_model(args.target if role == "target" else args.draft, dtype, device)
        tp_target = None
        if role == "target" and args.tp > 1:
            from engine.config import EngineConfig
            from engine.tp import start_target

            tp_target, _ = start_target(
                args.target,
                EngineConfig(target=args.target, dtype=args.dtype, tp=args.tp, threads=args.threads),
                device,
            )
        try:
            rows += measure(model, role, block, args.batch, args, device, tp_target)
        finally:
            if tp_target is not None:
                tp_target.close()
        del model
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("torch").setLevel(logging.WARNING)
    device = torch.device(args.device)
    rows = run(args)
    machine = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
    }
    text = table(rows)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        models = f"random weights shaped as {args.shapes}" if args.shapes else f"{args.target} / {args.draft}"
        (args.out / "forward_times.json").write_text(
            json.dumps(
                {
                    "machine": machine,
                    "models": models,
                    "dtype": args.dtype,
                    "K": args.K,
                    "rows": rows,
                    "summary": summarise(rows),
                },
                indent=2,
            )
            + "\n"
        )
        (args.out / "forward_times.md").write_text(
            f"{models}, {args.dtype}, K = {args.K}, context {args.context}, "
            f"{machine['device']}, torch {machine['torch']}\n\n{text}\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

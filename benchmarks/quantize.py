"""Decode speed, weight bytes and closeness to bf16 of weight-only int8 / int4 models.

For each variant (bf16, int8, int4-g32, int4-g128 by default) of one model loaded in bfloat16:
- ms per decoded token at batch 1 on `--threads` threads: the median of `--steps` single-token forwards
  with a KV cache, after `--warmup` of them;
- bytes of parameters and buffers (each storage once; a tied head counts once);
- against bf16 on teacher-forced text: the fraction of positions whose next-token argmax agrees, and the
  mean KL(p_bf16 || p_variant) and total variation of the next-token distributions.

    python -m benchmarks.quantize --model smollm2-135m --steps 32

Read the closeness columns with the model's origin in mind: the packaged smollm2-135m is a GGUF Q4_1
file (blocks of 32 weights, 16 levels each), so its "bf16" weights already lie on an int4 grid that
int4-g32 reproduces almost exactly (up to bf16 rounding of scale and zero), while int8 per channel and
int4 with wider groups do not. On a float-trained checkpoint expect int8 to be the closest.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from engine.kv_cache import cache_keyword
from saguaro.bench.environment import cpu_model

TEXTS = (
    "The committee met on Tuesday to review the budget for the coming year. After a long discussion, "
    "the members agreed to postpone the decision until the auditors had finished their report.",
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n"
    "print([fibonacci(i) for i in range(10)])\n",
    "Photosynthesis converts light energy into chemical energy. In the chloroplasts, water is split and "
    "oxygen is released, while carbon dioxide is fixed into sugars by the Calvin cycle.",
)


def variant(base, name: str):
    """A quantised deep copy of `base` for 'int8' or 'int4-gN'; `base` itself for 'bf16'."""
    from engine.loading.quantize import quantize_weights

    if name == "bf16":
        return base, None
    model = copy.deepcopy(base)
    scheme, _, group = name.partition("-g")
    summary = quantize_weights(model, scheme, group_size=int(group) if group else 32)
    return model, summary


@torch.inference_mode()
def decode_ms(model, prompt_ids: torch.Tensor, steps: int, warmup: int) -> float:
    """Median ms of one greedy decode step (one token, batch 1) with a KV cache."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)  # filled in place by each forward
    out = model(prompt_ids, use_cache=True, logits_to_keep=1, **{cache_keyword(model): cache})  # prefill
    token = out.logits[:, -1:].argmax(-1)  # [1, 1]
    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        out = model(token, use_cache=True, **{cache_keyword(model): cache})
        token = out.logits[:, -1:].argmax(-1)
        if i >= warmup:
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


@torch.inference_mode()
def next_token_logprobs(model, texts: list[torch.Tensor]) -> list[torch.Tensor]:
    return [model(ids).logits[0].float().log_softmax(-1) for ids in texts]  # each [T, V]


def closeness(ref: list[torch.Tensor], other: list[torch.Tensor]) -> tuple[float, float, float]:
    """(argmax agreement, mean KL(ref || other), mean total variation) over all positions."""
    lp, lq = torch.cat(ref), torch.cat(other)  # [P, V] log-probs
    agree = (lp.argmax(-1) == lq.argmax(-1)).float().mean().item()
    kl = (lp.exp() * (lp - lq)).sum(-1).mean().item()
    tv = 0.5 * (lp.exp() - lq.exp()).abs().sum(-1).mean().item()
    return agree, kl, tv


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m", help="alias, folder or .gguf (engine.loading.models.load_model)")
    p.add_argument("--variants", nargs="+", default=["bf16", "int8", "int4-g32", "int4-g128"])
    p.add_argument("--steps", type=int, default=32, help="timed decode steps per variant")
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--cache-dir", default=None)
    args = p.parse_args(argv)

    from engine.loading.models import load_model
    from engine.loading.quantize import model_bytes

    torch.set_num_threads(args.threads)
    loaded = load_model(args.model, dtype=torch.bfloat16, cache_dir=args.cache_dir)
    tok = loaded.tokenizer
    texts = [tok(t, return_tensors="pt").input_ids for t in TEXTS]  # each [1, T]
    prompt = texts[0][:, :16]
    ref = next_token_logprobs(loaded.model, texts)
    positions = sum(t.shape[1] for t in texts)

    rows = []
    for name in args.variants:
        model, summary = variant(loaded.model, name)
        ms = decode_ms(model, prompt, args.steps, args.warmup)
        agree, kl, tv = closeness(ref, next_token_logprobs(model, texts))
        layers = (
            "all float"
            if summary is None
            else (f"{summary['converted']} / {summary['skipped_by_name']} / {summary['skipped_by_shape']}")
        )
        rows.append((name, ms, model_bytes(model) / 2**20, layers, agree, kl, tv))
        if model is not loaded.model:
            del model

    print(
        f"{loaded.name} on {cpu_model()}, {args.threads} thread(s), torch {torch.__version__}; "
        f"decode: median of {args.steps} steps after {args.warmup}; closeness over {positions} "
        f"teacher-forced positions of {len(texts)} texts"
    )
    print()
    print(
        "| variant | ms / token | weights MiB | Linear converted / kept by name / by shape "
        "| argmax agreement | mean KL (nats) | mean TV |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, ms, mib, layers, agree, kl, tv in rows:
        print(f"| {name} | {ms:.1f} | {mib:.1f} | {layers} | {agree:.3f} | {kl:.4f} | {tv:.4f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

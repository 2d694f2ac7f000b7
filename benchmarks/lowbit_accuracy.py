"""How far a low-bit target is from the float32 model it comes from, on Spec-Bench and HumanEval.

A low-bit target is a (slightly) different model: SD and SSD are exact with respect to it, not to the float
weights. This measures the difference. The reference is the float32 model of the model cache (for a packaged
alias: the GGUF's float32 dequantisation). For each prompt set, the reference's greedy continuation of
`--new-tokens` tokens is generated once per prompt (stopping early at an end-of-sequence token); then the
reference and each variant score prompt + continuation in one forward each, and at every continuation
position (the positions that predict a continuation token) we compare the next-token distributions p (float32)
and q (variant):

- greedy agreement: the fraction of positions where argmax q == argmax p;
- mean KL(p || q) in nats and mean total variation ½ Σ |p - q|, over all positions of the set (pooled).

Variants: `int8` and `int4-gN` quantise the float32 weights at load (engine.loading.models.load_quantized's fallback),
the layers left in float in `--float-dtype` (bfloat16, as the engine runs them); `cache-int8` / `cache-int4-gN`
read the low-bit cache built from the GGUF (engine.loading.lowbit_cache), skipped with a line when there is none;
a `-head-int8` / `-head-int4` suffix (e.g. `cache-int4-g32-head-int8`) quantises the output head too, which
every other low-bit variant keeps in `--float-dtype`; `bf16` is the whole model in bfloat16, for scale.

    python -m benchmarks.lowbit_accuracy --model smollm2-135m --n 4 --new-tokens 32 \\
        --out /tmp/lowbit-smollm2.json                                  # a smoke check, ~1 minute
    python -m benchmarks.lowbit_accuracy --n 20 --new-tokens 128 \\
        --out reports/lowbit_accuracy/qwen-coder-1.5b.json              # the default target

Memory: the reference's log-probabilities of every scored position are kept (4 bytes x vocabulary per position;
20 prompts x 128 positions x 152k for Qwen2.5: 1.6 GB per set) while the variants are built one at a time; the
float32 model is loaded again for each quantised-at-load variant (7.1 GB for the 1.5B target).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch
from torch import nn

from engine.kv_cache import cache_keyword

SETS = ("spec_bench", "humaneval")
DEFAULT_VARIANTS = ("int8", "int4-g32", "cache-int8", "cache-int4-g32")


@torch.inference_mode()
def greedy_continuation(
    model: nn.Module, prompt: Sequence[int], new_tokens: int, eos_ids: frozenset[int] = frozenset()
) -> list[int]:
    """The model's greedy continuation of `prompt`: `new_tokens` tokens, or fewer up to an EOS (included)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    ids = torch.tensor([list(prompt)])  # [1, T]
    out: list[int] = []
    for _ in range(new_tokens):
        logits = model(ids, use_cache=True, **{cache_keyword(model): cache}).logits[0, -1]  # [V]
        token = int(logits.argmax())
        out.append(token)
        if token in eos_ids:
            break
        ids = torch.tensor([[token]])
    return out


@torch.inference_mode()
def continuation_logprobs(model: nn.Module, prompt: Sequence[int], continuation: Sequence[int]) -> torch.Tensor:
    """log p(· | prompt + continuation[:i]) for i = 0..len(continuation)-1, float32 [M, V], from one forward."""
    ids = torch.tensor([list(prompt) + list(continuation)])  # [1, T + M]
    start = len(prompt) - 1  # the position whose output predicts continuation[0]
    logits = model(ids).logits[0, start : start + len(continuation)]  # [M, V]
    return logits.float().log_softmax(-1)


def compare(reference: Sequence[torch.Tensor], other: Sequence[torch.Tensor]) -> dict:
    """Greedy agreement, mean KL(p || q) and mean TV, pooled over every position of every prompt."""
    lp, lq = torch.cat(list(reference)), torch.cat(list(other))  # [P, V] log-probs
    p = lp.exp()
    kl = (p * (lp - lq)).sum(-1)  # [P]; p = 0 contributes 0 (exp(-inf) * finite)
    tv = 0.5 * (p - lq.exp()).abs().sum(-1)  # [P]
    return {
        "positions": int(lp.shape[0]),
        "greedy_agreement": float((lp.argmax(-1) == lq.argmax(-1)).float().mean()),
        "mean_kl": float(kl.mean()),
        "max_kl": float(kl.max()),
        "mean_tv": float(tv.mean()),
    }


def reference_pass(
    reference: nn.Module,
    prompt_sets: Mapping[str, Sequence[Sequence[int]]],
    new_tokens: int,
    eos_ids: frozenset[int] = frozenset(),
    log: Callable[[str], None] = lambda _: None,
) -> dict:
    """{set: (prompts, the reference's greedy continuations, its log-probs [M_i, V] on them)}."""
    if new_tokens < 1:
        raise ValueError(f"new_tokens must be >= 1, got {new_tokens}")
    plan = {}
    for set_name, prompts in prompt_sets.items():
        conts = [greedy_continuation(reference, prompt, new_tokens, eos_ids) for prompt in prompts]
        ref_lp = [continuation_logprobs(reference, prompt, c) for prompt, c in zip(prompts, conts, strict=True)]
        plan[set_name] = (list(prompts), conts, ref_lp)
        log(f"{set_name}: {len(prompts)} prompts, {sum(map(len, conts))} reference tokens")
    return plan


def score_variants(
    plan: dict,
    variants: Mapping[str, Callable[[], nn.Module | None]],
    new_tokens: int,
    log: Callable[[str], None] = lambda _: None,
) -> dict:
    """Each variant (built, scored on every set, freed, one at a time) against the reference's plan."""
    result = {
        "new_tokens": new_tokens,
        "sets": {
            name: {"prompts": len(prompts), "continuation_tokens": sum(map(len, conts)), "variants": {}}
            for name, (prompts, conts, _) in plan.items()
        },
    }
    for variant, build in variants.items():
        start = time.perf_counter()
        model = build()
        if model is None:
            log(f"{variant}: not available, skipped")
            for entry in result["sets"].values():
                entry["variants"][variant] = None
            continue
        log(f"{variant}: built in {time.perf_counter() - start:.1f} s")
        for set_name, (prompts, conts, ref_lp) in plan.items():
            lq = [continuation_logprobs(model, prompt, c) for prompt, c in zip(prompts, conts, strict=True)]
            row = result["sets"][set_name]["variants"][variant] = compare(ref_lp, lq)
            log(f"{variant} on {set_name}: {json.dumps(row)}")  # a partial result survives a timeout
        del model
        gc.collect()
    return result


def measure(
    reference: nn.Module,
    variants: Mapping[str, Callable[[], nn.Module | None]],
    prompt_sets: Mapping[str, Sequence[Sequence[int]]],
    new_tokens: int,
    eos_ids: frozenset[int] = frozenset(),
    log: Callable[[str], None] = lambda _: None,
) -> dict:
    """The core measurement: {"new_tokens", "sets": {set: {"prompts", "continuation_tokens",
    "variants": {name: compare(...) or None when the builder returned None}}}}.

    `reference` is the float model; each entry of `variants` builds one variant (None: not available).
    """
    return score_variants(reference_pass(reference, prompt_sets, new_tokens, eos_ids, log), variants, new_tokens, log)


def table(result: dict) -> str:
    """The result as a markdown table, one row per (prompt set, variant)."""
    lines = [
        "| prompt set | variant | positions | greedy agreement | mean KL (nats) | max KL | mean TV |",
        "|---|---|---|---|---|---|---|",
    ]
    for set_name, entry in result["sets"].items():
        for variant, row in entry["variants"].items():
            if row is None:
                lines.append(f"| {set_name} | {variant} | not available | | | | |")
                continue
            lines.append(
                f"| {set_name} | {variant} | {row['positions']} | {row['greedy_agreement']:.4f} | "
                f"{row['mean_kl']:.5f} | {row['max_kl']:.4f} | {row['mean_tv']:.4f} |"
            )
    return "\n".join(lines)


def parse_variant(name: str) -> tuple[bool, str | None, int, str | None]:
    """(from the low-bit cache, scheme or None for bf16, group size, head scheme or None) of a variant name;
    ValueError if unknown. A `-head-int8` / `-head-int4` suffix quantises the output head too (int4 with the
    variant's group size; engine.loading.quantize.quantize_head)."""
    body, _, head = name.partition("-head-")
    cached = body.startswith("cache-")
    body = body.removeprefix("cache-")
    scheme, _, group = body.partition("-g")
    usage = (
        f"unknown variant {name!r}: use bf16, int8, int4-g32 / -g64 / -g128, or cache-<int8 | int4-gN>, "
        "the low-bit ones optionally with -head-int8 or -head-int4"
    )
    if head not in ("", "int8", "int4") or (head and "-head-" not in name):
        raise ValueError(usage)
    head_quant = head or None
    if body == "bf16" and not cached and head_quant is None:
        return False, None, 32, None
    if scheme == "int8" and not group:
        return cached, "int8", 32, head_quant
    if scheme == "int4" and group in ("32", "64", "128"):
        return cached, "int4", int(group), head_quant
    raise ValueError(usage)


def builders(
    spec: str, names: Sequence[str], float_dtype: torch.dtype, cache_dir: str | None
) -> dict[str, Callable[[], nn.Module | None]]:
    from engine.config import QuantConfig
    from engine.loading import lowbit_cache
    from engine.loading.models import load_model
    from engine.loading.quantize import cast_unquantized, quantize_model

    def build(name: str) -> Callable[[], nn.Module | None]:
        cached, scheme, group, head_quant = parse_variant(name)

        def make() -> nn.Module | None:
            if scheme is None:
                return load_model(spec, dtype=torch.bfloat16, cache_dir=cache_dir).model
            if cached:
                model = lowbit_cache.load(str(spec), scheme, group, cache_dir, head_quant=head_quant)
                return None if model is None else cast_unquantized(model, float_dtype).eval()
            model = load_model(spec, dtype=torch.float32, cache_dir=cache_dir).model
            return quantize_model(model, QuantConfig(scheme, group, head_quant), dtype=float_dtype)

        return make

    return {name: build(name) for name in names}


def encode(tokenizer, text: str, chat: bool) -> list[int]:
    if chat and getattr(tokenizer, "chat_template", None):
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        return list(tokenizer(rendered, add_special_tokens=False)["input_ids"])
    return list(tokenizer(text)["input_ids"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen-coder-1.5b", help="alias, folder or .gguf (default: the default target)")
    p.add_argument("--n", type=int, default=20, help="prompts per set (first n of each, round-robin over tasks)")
    p.add_argument("--new-tokens", type=int, default=128, help="reference continuation length M")
    p.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS)
    p.add_argument("--variants", nargs="+", default=list(DEFAULT_VARIANTS))
    p.add_argument(
        "--float-dtype",
        default="bfloat16",
        choices=("bfloat16", "float32"),
        help="dtype of the layers a low-bit model keeps in float (the engine's default: bfloat16)",
    )
    p.add_argument("--no-chat", action="store_true", help="do not wrap prompts in the chat template")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--out", type=Path, required=True, help="JSON file to write")
    args = p.parse_args(argv)
    try:
        for name in args.variants:
            parse_variant(name)
        if args.n < 1 or args.new_tokens < 1:
            raise ValueError("--n and --new-tokens must be >= 1")
    except ValueError as err:
        print(f"lowbit_accuracy: {err}", file=sys.stderr)
        return 2

    from engine.loading.devices import TORCH_DTYPES
    from engine.loading.models import load_model
    from saguaro.bench.prompts import load_prompts

    if args.threads:
        torch.set_num_threads(args.threads)
    say = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    started = time.perf_counter()
    ref = load_model(args.model, dtype=torch.float32, cache_dir=args.cache_dir)
    tok = ref.tokenizer
    prompt_sets = {s: [encode(tok, pr.text, not args.no_chat) for pr in load_prompts(s, args.n)] for s in args.sets}
    eos = {
        i for i in (tok.eos_token_id, getattr(ref.model.generation_config, "eos_token_id", None)) if isinstance(i, int)
    }
    variants = builders(args.model, args.variants, TORCH_DTYPES[args.float_dtype], args.cache_dir)

    plan = reference_pass(ref.model, prompt_sets, args.new_tokens, frozenset(eos), log=say)
    del ref  # the float32 model is not needed once its log-probabilities are taken
    gc.collect()
    result = score_variants(plan, variants, args.new_tokens, log=say)
    result.update(
        model=args.model,
        reference="float32 (model cache)",
        float_dtype=args.float_dtype,
        chat_template=not args.no_chat,
        n_per_set=args.n,
        torch=torch.__version__,
        threads=torch.get_num_threads(),
        wall_s=round(time.perf_counter() - started, 1),
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"{args.model}: low-bit variants vs the float32 model, {args.n} prompts per set, "
        f"teacher-forced on the float32 model's greedy continuation of up to {args.new_tokens} tokens"
    )
    print()
    print(table(result))
    print()
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

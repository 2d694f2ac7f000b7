"""`saguaro generate`: real generation with AR, SD or SSD on the default pair or any local model."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
from pathlib import Path

from saguaro.commands.values import whole_or_auto

DEFAULT_TARGET = "qwen-coder-1.5b"
DEFAULT_DRAFT = "qwen-coder-0.5b"
log = logging.getLogger(__name__)
AUTO_K_MAX = 8  # engine.config.AUTO_K_MAX (not imported: building the parser stays free of torch)


def add_parser(sub) -> argparse.ArgumentParser:
    from saguaro.cli import HelpFormatter

    p = sub.add_parser(
        "generate", help="generate text with AR, SD or SSD", description=__doc__, formatter_class=HelpFormatter
    )
    p.add_argument("prompt", nargs="*", help="prompt text(s); read from --prompts-file or stdin if none")
    p.add_argument(
        "--prompts-file", type=Path, help="JSONL file: a 'prompt' (or 'turns') text or an 'ids' token list per line"
    )
    p.add_argument("--strategy", choices=["ar", "sd", "ssd"], default="sd")
    p.add_argument("--target", default=DEFAULT_TARGET, help="alias, model folder or .gguf file")
    p.add_argument("--draft", default=DEFAULT_DRAFT, help="alias, model folder or .gguf file")
    add_speculation_flags(p)
    p.add_argument("--draft-threads", type=int, default=1, help="SSD draft worker threads (own cores on CPU)")
    p.add_argument("--draft-device", help="SSD draft worker device (default cpu, or cuda:1 with a CUDA target)")
    p.add_argument("--init-method", default="tcp://127.0.0.1:0", help="SSD rendezvous tcp://host:port (0 = free)")
    p.add_argument(
        "--external-draft",
        action="store_true",
        help="SSD: do not start the worker; start it on the draft host with python -m engine.ssd.process",
    )
    add_sampling_flags(p)
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at the end-of-sequence token")
    p.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="TEXT",
        help="stop the output before this text (repeat the flag for several: one TEXT each, so that a "
        "prompt after it is not taken for a stop text)",
    )
    p.add_argument(
        "--stop-token-id",
        type=int,
        nargs="+",
        action="extend",
        default=[],
        metavar="ID",
        help="stop after these token ids",
    )
    p.add_argument(
        "--logprobs",
        type=int,
        metavar="N",
        help="report each token's log-probability under the target and the top N (0..5); with --json",
    )
    p.add_argument("--stream", action="store_true", help="print the text as rounds emit it (one prompt)")
    add_batch_flag(p, None, "most sequences decoded together (default: all prompts at once)")
    add_model_flags(p)
    p.add_argument("--no-chat-template", action="store_true", help="feed prompts as raw text")
    p.add_argument("--json", action="store_true", help="print outputs and metrics as JSON")
    p.add_argument("--rounds-out", type=Path, help="write per-round records (JSONL) here")
    return p


DTYPES = ["auto", "float32", "bfloat16", "float16"]  # auto: engine.loading.devices.resolve_dtype


def add_sampling_flags(p: argparse.ArgumentParser) -> None:
    """generate's sampling flags; their defaults are engine.SamplingParams' (tests/saguaro/test_cli_defaults.py)."""
    p.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, help="keep the k most likely tokens (default: off)")
    p.add_argument("--top-p", type=float, help="keep the smallest set of tokens with this much mass (default: off)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument(
        "--seed",
        type=int,
        help="seed of the first prompt, the others derive theirs (default: a fresh random seed, as the API)",
    )
    p.add_argument(
        "--sampling-mode",
        choices=["standard", "invariant"],
        default="standard",
        help="invariant: drafter-invariant sampling, the same text for a seed with AR, SD or SSD at any "
        "temperature (docs/api.md)",
    )


def add_batch_flag(p: argparse.ArgumentParser, default: int | None, text: str) -> None:
    """--batch: the most sequences decoded together (vLLM's --max-num-seqs, kept as a hidden alias)."""
    p.add_argument("--batch", type=int, default=default, dest="max_num_seqs", metavar="N", help=text)
    p.add_argument("--max-num-seqs", type=int, dest="max_num_seqs", default=argparse.SUPPRESS, help=argparse.SUPPRESS)


QUANTS = ("int8", "int4")
DRAFT_QUANTS = QUANTS + ("int8-dynamic",)  # engine.config.DRAFT_QUANTS
GROUP_SIZES = (32, 64, 128)


def add_quant_flags(p: argparse.ArgumentParser) -> None:
    """Low-bit weights per model (engine.config.QuantConfig: scheme, group size, head; EngineConfig target_quant /
    draft_quant)."""
    p.add_argument(
        "--target-quant",
        choices=QUANTS,
        help="weight-only low-bit target: int4 (grouped, asymmetric) or int8 (per channel), on torch's CPU "
        "kernels; embeddings, norms and the head stay in --dtype (default: float weights)",
    )
    p.add_argument(
        "--draft-quant",
        choices=DRAFT_QUANTS,
        help="the same for the draft, or int8-dynamic (int8 activations too: the fastest CPU draft; "
        "what --draft-int8 means) (default: float weights)",
    )
    p.add_argument("--quant-group-size", type=int, choices=GROUP_SIZES, default=32, help="int4's group size")
    head = (
        "quantise the {0}'s output head too, untied from the embedding (whose lookup stays float); needs "
        "--{0}-quant int8 or int4. int8 costs almost no accuracy at ~0.6x the bf16 head's time, int4 ~0.3x with "
        "a visibly larger KL (reports/2026-12-cpu-lowbit-accuracy) (default: the head in float)"
    )
    p.add_argument("--target-head-quant", choices=("int8", "int4"), help=head.format("target"))
    p.add_argument("--draft-head-quant", choices=("int8", "int4"), help=head.format("draft"))


def quant_kwargs(args) -> dict:
    """The LLM keyword arguments of add_quant_flags (and --draft-int8, the short form of --draft-quant
    int8-dynamic): a QuantConfig per low-bit model, None for float weights. ValueError for flags that contradict."""
    from engine.config import DYNAMIC_INT8, QuantConfig

    draft = args.draft_quant
    if getattr(args, "draft_int8", False):
        if draft not in (None, DYNAMIC_INT8):
            raise ValueError(
                f"--draft-int8 means --draft-quant {DYNAMIC_INT8}: drop one of them (got --draft-quant {draft})"
            )
        draft = DYNAMIC_INT8
    kwargs = {}
    for model, scheme, head in (
        ("target", args.target_quant, args.target_head_quant),
        ("draft", draft, args.draft_head_quant),
    ):
        if head is not None and scheme not in QUANTS:
            raise ValueError(
                f"--{model}-head-quant {head} needs --{model}-quant int8 or int4 (got {scheme}): set "
                f"--{model}-quant, or drop --{model}-head-quant"
            )
        kwargs[f"{model}_quant"] = None if scheme is None else QuantConfig(scheme, args.quant_group_size, head)
    return kwargs


DTYPE_HELP = (
    "float dtype of the models; auto (the default): bfloat16 where the device multiplies in it at speed "
    "(a CUDA GPU with bf16, a CPU with AVX-512 or AMX), else float32 (float16 on an older GPU); on an "
    "AVX2-only CPU bfloat16 runs prefills and batched verifies 2-5x slower"
)


def resolve_dtypes(args) -> None:
    """--dtype and --draft-dtype with auto replaced by what it means on --device (what loads is what is said)."""
    from engine.loading.devices import resolve_dtype

    device = getattr(args, "device", "cpu")
    args.dtype = resolve_dtype(args.dtype, device)
    if getattr(args, "draft_dtype", None) is not None:
        args.draft_dtype = resolve_dtype(args.draft_dtype, device)


def add_precision_flags(p) -> None:
    """dtype, int8 draft and quantisation (generate, serve and bench share them)."""
    p.add_argument("--dtype", default="auto", choices=DTYPES, help=DTYPE_HELP)
    p.add_argument("--draft-dtype", choices=DTYPES, help="default: --dtype (float32 with --draft-int8)")
    p.add_argument(
        "--draft-int8", action="store_true", help="dynamic int8 draft (the same as --draft-quant int8-dynamic)"
    )
    add_quant_flags(p)


def add_model_flags(p: argparse.ArgumentParser) -> None:
    """dtype, int8 draft, quantisation, threads, device and cache (generate and serve share them)."""
    add_precision_flags(p)
    p.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--cache", type=Path, help="model cache folder (default ~/.cache/saguaro)")
    add_runtime_flags(p)


def add_runtime_flags(p: argparse.ArgumentParser) -> None:
    """--compile (with its cache's --max-len) and --tp (generate and serve share them)."""
    p.add_argument(
        "--compile",
        action="store_true",
        help="fixed-shape forwards on a static KV cache, compiled once per shape (CUDA graphs on CUDA)",
    )
    p.add_argument(
        "--max-len",
        type=int,
        dest="max_len",
        help="with --compile: tokens per row of the static cache, prompt + output + speculation (default 2048)",
    )
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks of the target (started by the engine)")
    p.add_argument(
        "--no-prefix-caching",
        action="store_false",
        dest="prefix_caching",
        help="do not reuse the KV of prompt prefixes earlier requests computed (default: reuse)",
    )
    p.add_argument(
        "--kv-cache-memory",
        type=memory_size,
        metavar="SIZE",
        help="the most memory the target's KV cache may take, e.g. 4GiB or 512MiB (default: no limit); "
        "requests wait for room, and one that could never fit is refused",
    )


SIZE_UNITS = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 10**3, "mb": 10**6, "gb": 10**9}


def memory_size(text: str) -> int:
    """Bytes from a size such as 4GiB, 512MiB, 1.5GB or 1048576."""
    raw = text.strip().lower()
    number = raw.rstrip("kmgib")
    unit = raw[len(number) :]
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in SIZE_UNITS or not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: write e.g. 4GiB, 512MiB, 2GB or a number of bytes")
    return int(value * SIZE_UNITS[unit])


def runtime_kwargs(args) -> dict:
    """LLM's compile, tp, prefix caching and KV cache budget from the flags of add_runtime_flags."""
    from engine.compile_config import CompileConfig

    if args.max_len is not None and not args.compile:
        raise ValueError("--max-len sizes the static KV cache of --compile: add --compile, or drop --max-len")
    settings = CompileConfig(**({} if args.max_len is None else {"max_len": args.max_len}))
    return {
        "compile": settings if args.compile else None,
        "tp": args.tp,
        "prefix_caching": getattr(args, "prefix_caching", True),
        "kv_cache_memory": getattr(args, "kv_cache_memory", None),
    }


def add_speculation_flags(p: argparse.ArgumentParser) -> None:
    """K (or adaptive K), Saguaro's C and SSD's fan-out, budget and backup (generate and serve share them)."""
    p.add_argument(
        "-K",
        dest="K",
        metavar="K",
        help="draft tokens per round, or auto: SD and SSD choose each round's K in --K-min..8 from the "
        "running acceptance and the measured draft and verify times (SSD: and its hit rate). "
        "Default: auto for sd and ssd (engine.config.COMMAND_LINE_DEFAULTS; how they compare: "
        "reports/2026-12-cpu-speculation-defaults; seeded output at T > 0 then varies from run "
        "to run: give -K for repeatable output)",
    )
    p.add_argument("--lookahead", "--K", dest="K", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    add_adaptive_flags(p)
    p.add_argument("--C", type=float, default=1.0, help="Saguaro constant in (0, 1]; 1 = off")
    p.add_argument(
        "--fanout",
        type=int,
        nargs="+",
        metavar="F",
        help="F_0..F_K: K + 1 integers, space-separated (e.g. --fanout 4 3 2 1 1)",
    )
    p.add_argument(
        "--schedule",
        choices=["uniform", "given", "geometric"],
        help="SSD fan-out schedule (default: geometric, or given with --fanout; uniform: the budget spread "
        "evenly; given = --fanout / --fanout-backup). geometric: Thm 12's until the run "
        "has measured where the bonus stands among the draft's guesses, then the best schedule for "
        "those measured hit rates; with --budget auto it may shrink to one guess (the fastest "
        "SSD on code here)",
    )
    p.add_argument(
        "--fanout-backup",
        type=int,
        nargs="+",
        metavar="F",
        help="SSD F^b: fan-out after a backup round, K + 1 integers",
    )
    p.add_argument(
        "--budget",
        help="SSD cache budget B = sum of F_k: an integer, or 'auto' (fit to timings; the "
        "default for ssd, unless --fanout gives the schedule)",
    )
    p.add_argument(
        "--backup", choices=["neural", "random", "lookup", "auto"], default="neural", help="SSD backup on a cache miss"
    )


def add_adaptive_flags(p) -> None:
    """Adaptive K's bounds and cost, and SD's confidence stop (generate, serve and bench share them)."""
    p.add_argument("--K-min", type=int, default=1, dest="K_min", help="the smallest K that -K auto may choose")
    p.add_argument(
        "--draft-cost",
        type=float,
        dest="draft_cost",
        help="-K auto: one draft token's time over one verify's (T_d / T_v), fixed instead of measured, "
        "so that seeded outputs repeat exactly (default: measured)",
    )
    p.add_argument(
        "--confidence-stop",
        type=float,
        dest="confidence_stop",
        metavar="P",
        help="SD: stop drafting once the draft's top probability falls below P in (0, 1] in every row (default: off)",
    )


def parse_K(text) -> int | str:
    """-K's value: 'auto' or an integer (checked further by SpeculativeConfig)."""
    return whole_or_auto(text, "-K must be a whole number of draft tokens per round (>= 1) or auto")


def speculation_defaults(args) -> dict:
    """-K, --budget and --schedule as given, the unset ones from the strategy's command-line defaults
    (engine.config.COMMAND_LINE_DEFAULTS); an explicit --fanout keeps its own schedule and budget."""
    from engine.config import COMMAND_LINE_DEFAULTS, Strategy

    defaults = dict(COMMAND_LINE_DEFAULTS.get(Strategy(getattr(args, "strategy", "sd")), {}))
    if args.fanout or args.fanout_backup:
        defaults.pop("budget", None)
        defaults.pop("schedule", None)
    K = defaults.get("K", "4") if args.K is None else args.K
    budget = defaults.get("budget") if args.budget is None else args.budget
    schedule = args.schedule or defaults.get("schedule", "uniform")
    return {"K": K, "budget": budget, "schedule": getattr(schedule, "value", schedule)}


def speculative_config(args, placement):
    """The SpeculativeConfig the flags of add_speculation_flags ask for, with the given placement."""
    from engine import SpeculativeConfig

    chosen = speculation_defaults(args)
    budget = (
        None if chosen["budget"] is None else whole_or_auto(chosen["budget"], "--budget must be an integer or 'auto'")
    )
    K = parse_K(chosen["K"])
    if K == "auto" and not 1 <= args.K_min <= AUTO_K_MAX:
        raise ValueError(f"--K-min must be in 1..{AUTO_K_MAX} (the largest K that -K auto chooses), got {args.K_min}")
    if args.K_min != 1 and K != "auto":
        raise ValueError("--K-min is the smallest K that -K auto may choose: add -K auto, or drop --K-min")
    if args.draft_cost is not None and K != "auto":
        raise ValueError("--draft-cost fixes the cost that -K auto weighs: add -K auto, or drop --draft-cost")
    if K == "auto" and getattr(args, "strategy", "sd") not in ("sd", "ssd"):
        raise ValueError(
            f"-K auto (adaptive K) is implemented for --strategy sd and ssd only, not {args.strategy}: "
            "give a number of draft tokens"
        )
    if args.confidence_stop is not None and getattr(args, "strategy", "sd") != "sd":
        raise ValueError(f"--confidence-stop is implemented for --strategy sd only, not {args.strategy}: drop it")
    return SpeculativeConfig(
        K=K,
        C=args.C,
        fanout=tuple(args.fanout) if args.fanout else None,
        fanout_backup=tuple(args.fanout_backup) if args.fanout_backup else None,
        schedule=chosen["schedule"],
        budget=budget,
        backup=args.backup,
        placement=placement,
        K_min=args.K_min,
        draft_cost=args.draft_cost,
        confidence_stop=args.confidence_stop,
    )


def describe_models(args) -> str:
    """What is about to load, for the progress line: "qwen-coder-1.5b (bfloat16) and draft qwen-coder-0.5b (int8)"."""
    text = f"{args.target} ({args.target_quant or args.dtype})"
    if args.strategy != "ar":
        draft_dtype = args.draft_quant or ("int8-dynamic" if args.draft_int8 else args.draft_dtype or args.dtype)
        where = " in the SSD draft worker" if args.strategy == "ssd" else ""
        text += f" and draft {args.draft} ({draft_dtype}){where}"
    return text


@contextlib.contextmanager
def loading(args):
    """Progress lines around building the engine (wrap the LLM construction only): "loading ... ..." and
    "... loaded in 4.2 s". The engine logs each model it loads (engine.loading.models) and SSD's worker start."""
    start = time.perf_counter()
    log.info("loading %s ...", describe_models(args))
    yield
    log.info("... loaded in %.1f s", time.perf_counter() - start)


def load_llm(args, spec, **options):
    """The LLM that the model flags (add_model_flags) and `spec` ask for, built inside `loading`; `options` are
    the command's own LLM arguments."""
    from engine import LLM

    resolve_dtypes(args)
    with loading(args):
        return LLM(
            args.target,
            args.draft if args.strategy != "ar" else None,
            strategy=args.strategy,
            speculative=spec,
            dtype=args.dtype,
            draft_dtype=args.draft_dtype,
            **quant_kwargs(args),
            device=args.device,
            threads=args.threads,
            cache_dir=args.cache,
            max_num_seqs=args.max_num_seqs,
            **runtime_kwargs(args),
            **options,
        )


def read_prompts(args) -> list[str | list[int]]:
    """The prompts from argv, --prompts-file or stdin, checked to be UTF-8 text before any model loads."""
    if args.prompt:
        for n, arg in enumerate(args.prompt, 1):
            _check_argument(arg, n)
        return list(args.prompt)
    if args.prompts_file:
        from saguaro.bench.prompts import load_prompts

        return [p.content for p in load_prompts(str(args.prompts_file))]
    if sys.stdin is not None and not sys.stdin.isatty():
        return [_read_stdin()]
    raise ValueError("no prompt given: pass it as an argument, with --prompts-file, or on stdin")


def _check_argument(arg: str, n: int) -> None:
    # Python decodes argv with surrogateescape: bytes that are not UTF-8 arrive as lone surrogates.
    try:
        arg.encode("utf-8")
    except UnicodeEncodeError:
        raw = os.fsencode(arg)
        raise ValueError(
            f"prompt argument {n} is not UTF-8 text ({_bad_byte(raw)}): "
            "pass UTF-8 text (convert it with iconv -t UTF-8)"
        ) from None


def _read_stdin() -> str:
    buffer = getattr(sys.stdin, "buffer", None)
    raw = buffer.read() if buffer is not None else sys.stdin.read().encode("utf-8", errors="surrogatepass")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(
            f"the prompt on stdin is not UTF-8 text ({_bad_byte(raw)}): "
            "pipe UTF-8 text (convert it with iconv -t UTF-8)"
        ) from None


def _bad_byte(raw: bytes) -> str:
    """Where the first byte that is not UTF-8 sits, for the error message."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as err:
        return f"byte 0x{raw[err.start]:02x} at offset {err.start}"
    return "a lone surrogate"


def run(args) -> int:
    from engine import SamplingParams

    prompts = read_prompts(args)
    params = SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        max_new_tokens=args.max_new_tokens,
        stop_on_eos=not args.ignore_eos,
        seed=args.seed,
        stop=tuple(args.stop),
        stop_token_ids=tuple(args.stop_token_id),
        logprobs=args.logprobs,
        sampling_mode=args.sampling_mode,
    )
    if args.stream and len(prompts) != 1:
        raise ValueError(f"--stream prints one prompt's text as it comes; got {len(prompts)} prompts")
    from engine.config import DraftPlacement

    spec = speculative_config(
        args,
        DraftPlacement(
            draft_threads=args.draft_threads,
            draft_device=args.draft_device,
            init_method=args.init_method,
            external=args.external_draft,
        ),
    )
    with load_llm(args, spec, chat_template=not args.no_chat_template) as llm:
        if args.stream:
            for chunk in llm.stream(prompts, params):
                print(chunk.text, end="", flush=True)
            print()
            return 0
        result = llm.generate(prompts, params)
    if args.rounds_out:
        result.metrics.write_rounds(args.rounds_out)
    if args.json:
        print(
            json.dumps(
                {
                    "outputs": [
                        {
                            "prompt": p,
                            "text": o.text,
                            "token_ids": o.token_ids,
                            "finish_reason": o.finish_reason,
                            "logprobs": None
                            if o.logprobs is None
                            else [
                                {"token_id": t.token_id, "logprob": t.logprob, "top": [list(x) for x in t.top]}
                                for t in o.logprobs
                            ],
                            "metrics": o.metrics.summary(),
                        }
                        for p, o in zip(prompts, result, strict=True)
                    ],
                    "metrics": result.metrics.summary(),
                },
                indent=2,
            )
        )
        return 0
    for o in result:
        print(o.text)
        print()
    s = result.metrics.summary()
    print(
        f"[{s['strategy']}] {s['new_tokens']} tokens in {s['wall_s']:.2f} s = {s['tokens_per_s']:.2f} tok/s; "
        f"TTFT {s['mean_ttft_ms']:.0f} ms; TPOT {s['mean_tpot_ms']:.0f} ms; ITL {s['mean_itl_ms']:.0f} ms"
        + (f"; alpha {s['alpha']:.2f}, mean accepted {s['mean_accepted']:.2f}" if s["strategy"] != "ar" else ""),
        file=sys.stderr,
    )
    return 0

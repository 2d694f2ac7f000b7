"""The engine's own cost against its forwards: per-token time of AR, SD and SSD on an overhead-bound random pair,
beside what the forwards alone allow.

    python -m benchmarks.engine_overhead --vocab 2048 151936 --out runs/engine-overhead
    python -m benchmarks.engine_overhead --vocab 2048 --strategies ssd --prompt-len 256 1024 2048 4096


Where SSD pays (a GPU at small batch) a forward is cheap and the engine's own work decides the speed. The same
regime shows on a CPU with tiny models: a width-64 Qwen2 target several layers deep and a draft a quarter of its
depth (benchmarks.random_models), forced to agree (α = 1, greedy: every speculation accepted, every SSD outcome
cached) or, with --mode random, unrelated at temperature 1. The target runs on one thread; SSD's draft worker gets
its own process on the other core, as in every CPU study.

Per vocabulary it prints, per new token (decode only, the prefill left out; the fastest of --repeats, since a shared
machine only ever slows a run down):
- bare: a loop of the target's forward over one token and an argmax (a DynamicCache, nothing else);
- hf-generate: transformers' `generate` (greedy, or sampling at T 1);
- ar, sd, ssd: this engine's time per output token (TPOT), and its ideal from its own measured forwards and its own
  rounds (how many, how many tokens each, how many branches the worker built):
  AR, the target's one-token forward; SD, per round the draft's K forwards (the first over its two-token tail) and
  the verify of K + 1 tokens; SSD, per round the longer of the verify and the worker's build (a glue forward over the
  K + 1 newest tokens, then K tree steps over its branches, each one row with a token per branch), plus the backup's K
  draft forwards on a round that missed;
- the engine's own round records (medians over the decode rounds of the fastest repeat): a round's time, the
  target's verify, and for SSD the worker's cache build (what it reports with each answer) and its backup;
- host synchronisations per steady round (the worker in the target's process, counted as a GPU run would wait:
  benchmarks.host_syncs) and bytes across SSD's link per round (both directions, as engine.ssd.messages lays out).

The forwards are timed in the same process on the same thread, at the context length of the middle of the run.
--device cuda runs the pair and the engine on the GPU (SSD's worker on the same one) and times every forward to
the end of its device work; the default is the CPU.
Several --prompt-len values give one row per (vocabulary, prompt length): how the engine's costs grow with the
context against the forwards' own (the verify's attention reads every cached token, and so does the build's).

With --host-terms (or --host-terms-only, that section alone: about a minute at vocabulary 151,936) it also prints,
per vocabulary, the engine's own work a round with its forwards taken out (saguaro.calibration.host_terms: the
block KV cache's forward returns fixed logits at once, everything else runs): AR, SD and SSD (the worker in the
target's process) at K, batch 1 and 8, the median step and its timed parts, and the simulator's host terms
derived from them (simulator.host_terms: per round, per draft forward, per SSD tree step, each with its part per
sequence or branch row). With --out each vocabulary's measurement is also written as host_terms_V.json, the form
of simulator/data/saguaro_cpu_host.json (the "saguaro-cpu" engine preset).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers import DynamicCache

from benchmarks.gpu_check import synchronize  # waits for a CUDA device's queued work; nothing on the CPU
from benchmarks.random_models import Shape, build
from engine.kv_cache import cache_keyword

WIDTH = 64  # hidden size: small enough that a forward costs little more than its launches


def shapes(vocab: int, target_layers: int, draft_layers: int) -> tuple[Shape, Shape]:
    target = Shape(f"width-{WIDTH}-{target_layers}-layer", WIDTH, 2 * WIDTH, target_layers, 4, 2, vocab, True)
    draft = Shape(f"width-{WIDTH}-{draft_layers}-layer", WIDTH, 2 * WIDTH, draft_layers, 4, 2, vocab, True)
    return target, draft


# -- the forwards alone ---------------------------------------------------------------------------------------
def _fastest_ms(fn, reps: int, device: torch.device, warmup: int = 3) -> float:
    """The fastest of `reps` calls, each timed to the end of its device work: a shared machine only ever slows a
    forward down."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return min(times)


@torch.inference_mode()
def forward_ms(model: torch.nn.Module, context: int, width: int, rows: int = 1, reps: int = 30) -> float:
    """One forward of `width` new tokens over `rows` rows of `context` cached tokens (a DynamicCache, cropped back
    after each forward): what the model's own work costs, with nothing of the engine around it. A step of SSD's
    tree over n branches of one row is timed as one row with n new tokens: the same keys, n queries."""
    V = model.config.vocab_size
    device = model.device
    gen = torch.Generator().manual_seed(0)
    cache = DynamicCache(config=model.config)
    prompt = torch.randint(0, V, (rows, context), generator=gen).to(device)
    model(prompt, **{cache_keyword(model): cache}, use_cache=True, logits_to_keep=1)
    block = torch.randint(0, V, (rows, width), generator=gen).to(device)

    def step():
        model(block, **{cache_keyword(model): cache}, use_cache=True)
        cache.crop(-width)

    return _fastest_ms(step, reps, device)


@torch.inference_mode()
def bare_loop_ms(model: torch.nn.Module, prompt: list[int], new_tokens: int) -> float:
    """Per token: the target's one-token forward and an argmax, in a plain loop (the prefill not counted)."""
    device = model.device
    cache = DynamicCache(config=model.config)
    keyword = cache_keyword(model)
    ids = torch.tensor([prompt], device=device)
    logits = model(ids, **{keyword: cache}, use_cache=True, logits_to_keep=1).logits[:, -1]
    token = logits.argmax(-1, keepdim=True)  # stays on the device: the loop reads nothing back
    synchronize(device)
    t0 = time.perf_counter()
    for _ in range(new_tokens):
        logits = model(token, **{keyword: cache}, use_cache=True).logits[:, -1]
        token = logits.argmax(-1, keepdim=True)
    synchronize(device)
    return (time.perf_counter() - t0) * 1e3 / new_tokens


@torch.inference_mode()
def hf_generate_ms(model: torch.nn.Module, prompt: list[int], new_tokens: int, temperature: float) -> float:
    """Per token: transformers' generate, its time for `new_tokens` less its time for one (the prefill)."""
    ids = torch.tensor([prompt], device=model.device)
    sampling = (
        dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else dict(do_sample=False)
    )

    def run(n: int) -> float:
        synchronize(model.device)
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=n, min_new_tokens=n, pad_token_id=0, eos_token_id=None, **sampling)
        synchronize(model.device)
        return time.perf_counter() - t0

    run(4)
    return (run(new_tokens) - run(1)) * 1e3 / (new_tokens - 1)


# -- the engine ---------------------------------------------------------------------------------------------------
@dataclass
class EngineRun:
    strategy: str
    tpot_ms: list[float] = field(default_factory=list)  # one per repeat
    rounds: int = 0  # decode rounds of the fastest repeat
    tokens_per_round: float = 0.0
    hit_rate: float | None = None
    branches_per_build: float | None = None
    alpha: float | None = None
    ideal_ms: float | None = None
    syncs_per_round: float | None = None
    link_bytes_per_round: float | None = None
    fault: str | None = None
    # medians over the decode rounds of the fastest repeat (engine.metrics.RoundRecord), ms
    round_ms: float | None = None
    verify_ms: float | None = None
    build_ms: float | None = None  # SSD: the worker's cache build, as it reports it
    backup_ms: float | None = None  # SSD: the backup's drafting on the critical path
    rounds_kept: list | None = None  # the fastest repeat's round records, until its ideal is worked out

    @property
    def best_tpot_ms(self) -> float:
        """The fastest repeat: a shared machine only ever slows a run down."""
        return min(self.tpot_ms)


def engine(target, draft, strategy: str, K: int, threads: int):
    """The engine on the target's device (SSD's worker on the draft's: the same GPU, or the other CPU core)."""
    from engine import LLM, SpeculativeConfig
    from engine.config import DraftPlacement

    spec = SpeculativeConfig(K=K, placement=DraftPlacement(draft_threads=1, deadline_s=120.0))
    return LLM(
        target,
        None if strategy == "ar" else draft,
        strategy=strategy,
        speculative=spec,
        threads=threads,
        device=str(target.device),
    )


def run_engine(llm, prompt: list[int], new_tokens: int, temperature: float, seed: int):
    from engine import SamplingParams

    params = SamplingParams(temperature=temperature, max_new_tokens=new_tokens, stop_on_eos=False, seed=seed)
    out = llm.generate([prompt], params)
    return out


def ideal_ms(strategy: str, rounds: list, K: int, t: dict) -> float:
    """The engine's ideal per token: the forwards its own rounds made, each at its measured time (module docstring)."""
    decode = [r for r in rounds if r.phase == "decode"]
    tokens = sum(sum(r.emitted) for r in decode)
    total = 0.0
    for r in decode:
        k = r.K
        if strategy == "ar":
            total += t["target_1"]
        elif strategy == "sd":
            total += t["draft_2"] + (k - 1) * t["draft_1"] + t[f"target_{k + 1}"]
        else:
            branches = max(r.branches or 1, 1)
            build = t[f"draft_{k + 1}"] + k * _branch_ms(t, branches)
            verify = t[f"target_{k + 1}"]
            hit = bool(r.hit) and all(r.hit)
            backup = 0.0 if hit else t["draft_2"] + (k - 1) * t["draft_1"]
            total += backup + max(verify, build)
    return total / tokens


def _branch_ms(t: dict, branches: int) -> float:
    """A branch step over `branches` rows: read off the measured batch sizes (a line through the two nearest)."""
    sizes = sorted(int(key.split("x")[1]) for key in t if key.startswith("branch_x"))
    if branches in sizes:
        return t[f"branch_x{branches}"]
    lo = max([s for s in sizes if s < branches], default=sizes[0])
    hi = min([s for s in sizes if s > branches], default=sizes[-1])
    if lo == hi:
        return t[f"branch_x{lo}"]
    a, b = t[f"branch_x{lo}"], t[f"branch_x{hi}"]
    return a + (b - a) * (branches - lo) / (hi - lo)


def round_medians(rounds: list) -> dict:
    """Median round, verify, build and backup times (ms) of a run's decode rounds; None where never recorded."""
    decode = [r for r in rounds if r.phase == "decode"]

    def median(values: list) -> float | None:
        kept = [v for v in values if v is not None]
        return statistics.median(kept) if kept else None

    return {
        "round_ms": median([r.round_ms for r in decode]),
        "verify_ms": median([r.verify_ms for r in decode]),
        "build_ms": median([r.cache_build_ms for r in decode]),
        "backup_ms": median([r.backup_ms for r in decode]),
    }


def count_syncs(target, draft, strategy: str, K: int, temperature: float, steps: int = 12) -> float:
    """Host synchronisations per steady decode round (the worker in the target's process)."""
    from benchmarks.host_syncs import count_host_syncs
    from engine import LLM, SamplingParams, SpeculativeConfig
    from engine.config import DraftPlacement

    spec = SpeculativeConfig(K=K, placement=DraftPlacement(in_process=True))
    drafted = None if strategy == "ar" else draft
    with LLM(target, drafted, strategy=strategy, speculative=spec, device=str(target.device)) as llm:
        params = SamplingParams(temperature=temperature, max_new_tokens=10 * steps, stop_on_eos=False, seed=1)
        llm.loop.submit(llm.make_sequence([1, 2, 3, 4], params))
        for _ in range(3):
            llm.loop.step()
        counts = []
        for _ in range(steps):
            with count_host_syncs() as count:
                llm.loop.step()
            counts.append(count.total)
    return statistics.mean(counts)


def link_bytes(target, draft, K: int, temperature: float, prompt: list[int], new_tokens: int) -> float:
    """Bytes across SSD's link per round, both directions (engine.ssd.messages.encode of each Round and answer)."""
    from engine import LLM, SamplingParams, SpeculativeConfig
    from engine.config import DraftPlacement
    from engine.ssd.messages import encode

    spec = SpeculativeConfig(K=K, placement=DraftPlacement(in_process=True))
    sizes: list[int] = []
    with LLM(target, draft, strategy="ssd", speculative=spec, device=str(target.device)) as llm:
        channel = llm.loop.proposer.channel
        exchange = channel.exchange

        def counted(msg):
            answer = exchange(msg)
            sizes.append(sum(t.numel() * t.element_size() for t in encode(msg) + encode(answer)))
            return answer

        channel.exchange = counted
        params = SamplingParams(temperature=temperature, max_new_tokens=new_tokens, stop_on_eos=False, seed=1)
        llm.generate([prompt], params)
    steady = sizes[2:] or sizes
    return statistics.mean(steady)


# -- one vocabulary -------------------------------------------------------------------------------------------------
def measure(vocab: int, prompt_len: int, args) -> dict:
    agree = args.mode == "agree"
    temperature = 0.0 if agree else 1.0
    t_shape, d_shape = shapes(vocab, args.target_layers, args.draft_layers)
    target = build(t_shape, args.device, torch.float32, seed=1, agree=agree)
    draft = build(d_shape, args.device, torch.float32, seed=2, agree=agree)
    gen = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, vocab, (prompt_len,), generator=gen).tolist()
    K, N = args.K, args.new_tokens
    torch.set_num_threads(1)
    mid = prompt_len + N // 2

    def forwards() -> dict:
        t = {}
        for k in range(K + 1):
            t[f"target_{k + 1}"] = forward_ms(target, mid, k + 1)
            t[f"draft_{k + 1}"] = forward_ms(draft, mid, k + 1)
        for n in args.branch_rows:
            t[f"branch_x{n}"] = forward_ms(draft, mid, n)  # a tree step: one row, n branch tokens
        return t

    t: dict = {}
    row = {"vocab": vocab, "prompt_len": prompt_len, "bare_ms": [], "hf_generate_ms": []}
    runs = {s: EngineRun(s) for s in args.strategies}
    llms = {s: engine(target, draft, s, K, threads=1) for s in args.strategies}
    try:
        for llm in llms.values():  # warm up every path once (the worker's start, the first shapes)
            run_engine(llm, prompt, 16, temperature, seed=0)
        for rep in range(args.repeats):
            t = {k: min(v, t.get(k, v)) for k, v in forwards().items()}  # each repeat's, the fastest kept
            row["bare_ms"].append(bare_loop_ms(target, prompt, N))
            row["hf_generate_ms"].append(hf_generate_ms(target, prompt, N, temperature))
            for s, llm in llms.items():
                out = run_engine(llm, prompt, N, temperature, seed=rep + 1)
                run = runs[s]
                run.tpot_ms.append(out[0].metrics.tpot_s * 1e3)
                if run.tpot_ms[-1] > min(run.tpot_ms):
                    continue  # the round figures are the fastest repeat's
                decode = [r for r in out.metrics.rounds if r.phase == "decode"]
                run.rounds = len(decode)
                run.tokens_per_round = sum(sum(r.emitted) for r in decode) / max(len(decode), 1)
                summary = out.metrics.summary()
                run.alpha = summary.get("alpha")
                run.hit_rate = summary.get("hit_rate")
                builds = [r.branches for r in decode if r.branches]
                run.branches_per_build = statistics.mean(builds) if builds else None
                run.rounds_kept = out.metrics.rounds
                for name, value in round_medians(out.metrics.rounds).items():
                    setattr(run, name, value)
                run.fault = llm.fault
    finally:
        for llm in llms.values():
            llm.close()
    row["forwards_ms"] = {k: round(v, 4) for k, v in t.items()}
    row["K"] = K
    for s, run in runs.items():
        run.ideal_ms = ideal_ms(s, run.rounds_kept, K, t)  # from the fastest forwards of every repeat
        run.rounds_kept = None
        run.syncs_per_round = count_syncs(target, draft, s, K, temperature)
    if "ssd" in runs:
        runs["ssd"].link_bytes_per_round = link_bytes(target, draft, K, temperature, prompt, min(N, 64))
    row["engine"] = {s: asdict(r) | {"best_tpot_ms": r.best_tpot_ms} for s, r in runs.items()}
    return row


# -- the engine's host work, its forwards taken out --------------------------------------------------------------
def host_terms(vocab: int, args, argv: list[str]):
    """The engine's rounds with its forwards taken out on this benchmark's random pair (module docstring), at the
    mode's temperature; a simulator.host_terms.HostTerms that records the command (`argv`, its arguments)."""
    from saguaro.calibration.host_terms import measure_host_terms

    t_shape, d_shape = shapes(vocab, args.target_layers, args.draft_layers)
    target = build(t_shape, "cpu", torch.float32, seed=1)
    draft = build(d_shape, "cpu", torch.float32, seed=2)
    command = " ".join(["python -m benchmarks.engine_overhead", *argv])
    return measure_host_terms(
        target,
        draft,
        K=args.K,
        rounds=args.host_rounds,
        temperature=0.0 if args.mode == "agree" else 1.0,
        meta={"command": command, "pair": f"{t_shape.name} + {d_shape.name}"},
    )


def print_host_terms(terms, out=None) -> None:
    from saguaro.calibration.host_terms import describe

    out = out or sys.stdout  # read at the call: a test's captured stream
    meta = terms.meta
    print(
        f"vocabulary {meta['vocab']}: the engine's work a round with its forwards taken out (K {terms.K}, median "
        f"of {meta['rounds']} rounds; load average {meta['load_average_before'][0]:.2f} before, "
        f"{meta['load_average_after'][0]:.2f} after)",
        file=out,
    )
    for line in describe(terms):
        print(line, file=out)


def print_row(row: dict, out=sys.stdout) -> None:
    bare = min(row["bare_ms"])
    context = f", prompt {row['prompt_len']} tokens" if "prompt_len" in row else ""  # older results have one
    print(
        f"vocabulary {row['vocab']}{context}: bare loop {bare:.3f} ms a token, transformers generate "
        f"{min(row['hf_generate_ms']) / bare:.2f}x bare (fastest of {len(row['bare_ms'])} repeats)",
        file=out,
    )
    print(
        "  strategy  ms/token  x bare  ideal ms  x ideal  tokens/round  hit rate  syncs/round  link B/round", file=out
    )
    for s, r in row["engine"].items():
        ms = r["best_tpot_ms"]
        hit = "-" if r["hit_rate"] is None else f"{r['hit_rate']:.2f}"
        link = "-" if r["link_bytes_per_round"] is None else f"{r['link_bytes_per_round']:.0f}"
        print(
            f"  {s:8s}  {ms:8.3f}  {ms / bare:6.2f}  {r['ideal_ms']:8.3f}  {ms / r['ideal_ms']:7.2f}  "
            f"{r['tokens_per_round']:12.2f}  {hit:>8s}  {r['syncs_per_round']:11.1f}  {link:>12s}",
            file=out,
        )
    if any(r.get("round_ms") is not None for r in row["engine"].values()):
        width = row["K"] + 1
        verify = row["forwards_ms"][f"target_{width}"]
        print(
            f"  strategy  round ms  verify ms  build ms  backup ms  (medians; the target's forward of {width} "
            f"tokens alone {verify:.3f} ms)",
            file=out,
        )
        for s, r in row["engine"].items():
            cells = [_ms(r.get(name)) for name in ("round_ms", "verify_ms", "build_ms", "backup_ms")]
            print(f"  {s:8s}  {cells[0]:>8s}  {cells[1]:>9s}  {cells[2]:>8s}  {cells[3]:>9s}", file=out)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.engine_overhead", description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, nargs="+", default=[2048, 151936])
    parser.add_argument(
        "--mode",
        choices=["agree", "random"],
        default="agree",
        help="agree: models forced to agree, greedy (α = 1); random: unrelated weights at T 1",
    )
    parser.add_argument("--strategies", nargs="+", choices=["ar", "sd", "ssd"], default=["ar", "sd", "ssd"])
    parser.add_argument("-K", type=int, default=4)
    parser.add_argument("--target-layers", type=int, default=8)
    parser.add_argument("--draft-layers", type=int, default=2)
    parser.add_argument(
        "--prompt-len",
        type=int,
        nargs="+",
        default=[32],
        help="prompt tokens (the context decoding starts from); several: one row each",
    )
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--branch-rows",
        type=int,
        nargs="+",
        default=[1, 2, 4, 8, 16, 32],
        help="branches a tree step is timed at (the build's forwards are read off them)",
    )
    parser.add_argument(
        "--device",
        default="cpu",
        help="where the models and the engine run: cpu (the target on one thread, SSD's worker on another core) "
        "or cuda (SSD's worker on the same GPU; the forwards are timed to the end of their device work)",
    )
    parser.add_argument("--out", type=Path, help="write results.json here")
    parser.add_argument(
        "--host-terms",
        action="store_true",
        help="also the engine's work a round with its forwards taken out, and the simulator's host "
        "terms from it (module docstring)",
    )
    parser.add_argument("--host-terms-only", action="store_true", help="that section alone")
    parser.add_argument(
        "--host-rounds",
        type=int,
        default=64,
        help="rounds timed per strategy and batch size for the host terms (default 64)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        device = torch.device(args.device)
    except RuntimeError:
        parser.error(f"--device must be cpu or cuda[:N], got {args.device!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here (torch.cuda.is_available() is False)")
    if device.type not in ("cpu", "cuda"):
        parser.error(f"--device must be cpu or cuda[:N], got {args.device!r}")
    if args.K < 1 or args.new_tokens < 8 or min(args.prompt_len) < 1 or args.repeats < 1:
        parser.error("-K must be >= 1, --new-tokens >= 8, --prompt-len and --repeats >= 1")
    if args.host_rounds < 1:
        parser.error("--host-rounds must be >= 1")
    rows = []
    for vocab in args.vocab:
        if args.host_terms_only:
            row = {"vocab": vocab}
            rows.append(row)
        else:
            for prompt_len in args.prompt_len:
                row = measure(vocab, prompt_len, args)
                print_row(row, sys.stdout)
                sys.stdout.flush()
                rows.append(row)
                if args.out is not None:  # after every row: a long sweep cut short keeps what it measured
                    write_results(args, rows)
        if args.host_terms or args.host_terms_only:
            terms = host_terms(vocab, args, sys.argv[1:] if argv is None else argv)
            print_host_terms(terms)
            row["host_terms"] = terms.to_dict()
            if args.out is not None:
                args.out.mkdir(parents=True, exist_ok=True)
                (args.out / f"host_terms_{vocab}.json").write_text(json.dumps(row["host_terms"], indent=1) + "\n")
                write_results(args, rows)
    return 0


def write_results(args, rows: list[dict]) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {
        "cpu": _cpu(),
        "torch": torch.__version__,
        "argv": sys.argv[1:],
        "args": vars(args) | {"out": str(args.out)},
    }
    (args.out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    sys.exit(main())

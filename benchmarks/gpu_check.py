"""The steps of the offline GPU check (scripts/gpu-check.sh runs each in its own process, under its own timeout).

    python -m benchmarks.gpu_check STEP --out DIR [--device cuda|cpu] [--quick] [--budget-s S]

STEP is one of env, canary, greedy, tests, syncs, overhead, timings, compiled, launch, e2e-agree, e2e-random. Each
step appends its lines to DIR/summary.md as it goes (so a killed run still returns what it learned) and its figures
to DIR/results.json under its name. Nothing here downloads anything or needs more than torch, transformers and the
engine: the models are random weights of real shapes (benchmarks.random_models), built on the device.

On CPU (`--device cpu`) the same code runs on tiny shapes: a dry run of the check itself, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from benchmarks.random_models import PAIRS, TINY_PAIRS, pair

STEPS = (
    "env",
    "canary",
    "greedy",
    "tests",
    "syncs",
    "overhead",
    "timings",
    "compiled",
    "launch",
    "e2e-agree",
    "e2e-random",
)


# -- output ---------------------------------------------------------------------------------------------------
class Report:
    """summary.md (lines appended and flushed at once) and results.json (one key per step)."""

    def __init__(self, out: Path, step: str):
        self.out, self.step = out, step
        out.mkdir(parents=True, exist_ok=True)
        self.summary = out / "summary.md"
        self.results = out / "results.json"

    def line(self, text: str) -> None:
        with self.summary.open("a") as f:
            f.write(text + "\n")
        print(text, file=sys.stderr, flush=True)

    def save(self, data: dict) -> None:
        merged = json.loads(self.results.read_text()) if self.results.exists() else {}
        merged[self.step] = data
        tmp = self.results.with_suffix(".tmp")
        tmp.write_text(json.dumps(merged, indent=1, default=str))
        tmp.replace(self.results)


class Clock:
    """Time left of a step's budget, so a step stops adding configurations before its hard timeout."""

    def __init__(self, budget_s: float):
        self.end = time.monotonic() + budget_s

    def left(self) -> float:
        return self.end - time.monotonic()


# -- timing ---------------------------------------------------------------------------------------------------
def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_ms(fn: Callable[[], object], device: torch.device, reps: int, warmup: int = 2) -> float:
    """Median wall time of fn() in ms: CUDA events on a GPU (each rep synchronised), perf_counter on a CPU."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


class SyncedTimer:
    """Wraps a bound method so each call is timed between two synchronisations (its own work alone)."""

    def __init__(self, obj, name: str, device: torch.device):
        self.obj, self.name, self.device = obj, name, device
        self.original = getattr(obj, name)
        self.ms: list[float] = []
        setattr(obj, name, self)

    def __call__(self, *args, **kwargs):
        synchronize(self.device)
        t0 = time.perf_counter()
        result = self.original(*args, **kwargs)
        synchronize(self.device)
        self.ms.append((time.perf_counter() - t0) * 1e3)
        return result

    def restore(self) -> None:
        setattr(self.obj, self.name, self.original)


# -- host synchronisations --------------------------------------------------------------------------------------
HOST_READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy")


@contextmanager
def counting_syncs(device: torch.device) -> Iterator[Counter]:
    """Counts what forces the host to wait for the device. On CUDA: torch's own sync debug mode (each
    synchronising call warns). On CPU: calls that read a tensor's values into Python (each would be a sync if
    the tensor lived on a GPU), plus copies to the CPU of tensors that are not there."""
    counts: Counter = Counter()
    if device.type == "cuda":
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                yield counts
            counts["cuda syncs"] += sum("synchroniz" in str(w.message) for w in caught)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        return
    originals = {name: getattr(torch.Tensor, name) for name in HOST_READS + ("cpu",)}

    def wrap(name, fn):
        def counted(self, *args, **kwargs):
            if name != "cpu" or self.device.type != "cpu":
                counts[name] += 1
            return fn(self, *args, **kwargs)

        return counted

    for name, fn in originals.items():
        setattr(torch.Tensor, name, wrap(name, fn))
    try:
        yield counts
    finally:
        for name, fn in originals.items():
            setattr(torch.Tensor, name, fn)


# -- the steps --------------------------------------------------------------------------------------------------
def step_env(report: Report, device: torch.device, args) -> bool:
    import transformers

    from engine.kv_cache import cache_keyword
    from engine.loading.tiny import tiny_model

    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "device": str(device),
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "commit": os.environ.get("GPU_CHECK_COMMIT", "unknown"),
        "cache keyword": cache_keyword(tiny_model()),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            gpus=torch.cuda.device_count(),
            gpu=props.name,
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            capability=f"sm_{props.major}{props.minor}",
            bf16=torch.cuda.is_bf16_supported(),
            nccl=torch.distributed.is_nccl_available(),
        )
    report.line(f"# GPU check on {info.get('gpu', 'CPU (dry run)')}\n")
    report.line(
        f"- torch {info['torch']} (CUDA {info['cuda']}), transformers {info['transformers']}, Python "
        f"{info['python']}, {info['cores']} cores; commit {info['commit']}"
    )
    report.line(f"- the KV cache goes to the forward as `{info['cache keyword']}=`")
    report.save(info)
    return True


def step_canary(report: Report, device: torch.device, args) -> bool:
    """The KV cache against full forwards: one cached step, a ragged batch, a roll-back."""
    from engine.kv_cache import KVState, right_aligned
    from engine.loading.tiny import tiny_model

    model = tiny_model(vocab_size=64, hidden_size=64, num_layers=2, seed=3).to(device)
    prompts = [[5, 9, 2, 7, 1, 3], [4, 8]]

    def alone(ids: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            return model(input_ids=torch.tensor([ids], device=device)).logits[0, -1].float()

    errors: dict[str, float | str] = {}
    try:
        state = KVState(model, 1, device)
        state.extend(torch.tensor([prompts[0][:-1]], device=device), logits_to_keep=1)
        step = state.extend(torch.tensor([[prompts[0][-1]]], device=device))[0, -1].float()
        errors["one cached step"] = float((step - alone(prompts[0])).abs().max())
        ragged = KVState(model, 2, device)
        tokens, valid = right_aligned(prompts, 0, device)
        last = ragged.extend(tokens, valid)[:, -1].float()
        errors["ragged batch"] = max(float((last[b] - alone(p)).abs().max()) for b, p in enumerate(prompts))
        ragged.extend(torch.tensor([[11, 12], [13, 14]], device=device))
        ragged.rollback(torch.tensor([2, 2], device=device))
        again = ragged.extend(torch.tensor([[6], [6]], device=device))[:, -1].float()
        errors["roll-back"] = max(float((again[b] - alone(p + [6])).abs().max()) for b, p in enumerate(prompts))
    except (RuntimeError, TypeError) as err:  # a cache the forward did not read ends in a shape error
        errors["error"] = f"{type(err).__name__}: {str(err)[:300]}"
    ok = all(isinstance(e, float) and e < 1e-4 for e in errors.values())
    report.line(
        f"- KV-cache canary {'ok' if ok else 'FAILED'}: max |Δ logit| against a full forward, fp32: "
        + ", ".join(f"{k} {v:.1e}" if isinstance(v, float) else f"{k} {v}" for k, v in errors.items())
    )
    report.save({"max_abs_error": errors, "ok": ok})
    return ok


def _greedy_pair():
    from engine.loading.tiny import tiny_pair

    return tiny_pair(vocab_size=96, seed=4, target_layers=3, draft_layers=2, logit_scale=4.0)


def step_greedy(report: Report, device: torch.device, args) -> bool:
    """Greedy fp32 SD and SSD (worker in the target's process, in its own process, and one that dies) against
    AR, on a ragged batch of three prompts with at most two running, so one joins mid-run."""
    from engine import LLM, SamplingParams, SpeculativeConfig
    from engine.config import DraftPlacement, WorkerFaults

    prompts = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11]]
    params = SamplingParams(temperature=0, max_new_tokens=12 if args.quick else 24, stop_on_eos=False)
    process = DraftPlacement(deadline_s=60.0)
    runs = {
        "sd": ("sd", SpeculativeConfig(K=3)),
        "ssd in process": ("ssd", SpeculativeConfig(K=3, placement=DraftPlacement(in_process=True))),
        "ssd worker process": ("ssd", SpeculativeConfig(K=3, placement=process)),
        "ssd worker dies at round 3": (
            "ssd",
            SpeculativeConfig(K=3, placement=DraftPlacement(deadline_s=60.0, faults=WorkerFaults(exit_at_round=3))),
        ),
    }
    results, ok = {}, True
    target, _ = _greedy_pair()
    with LLM(target, device=str(device), max_num_seqs=2) as llm:
        ar = [o.token_ids for o in llm.generate(prompts, params)]
    for name, (strategy, spec) in runs.items():
        target, draft = _greedy_pair()
        t0 = time.perf_counter()
        try:
            with LLM(target, draft, strategy=strategy, speculative=spec, device=str(device), max_num_seqs=2) as llm:
                out = llm.generate(prompts, params)
                used, fault = llm.strategy_in_use, llm.fault
            same = [o.token_ids for o in out] == ar
            summary = out.metrics.summary()
            results[name] = {
                "equal": same,
                "strategy at the end": used,
                "fault": fault,
                "alpha": summary.get("alpha"),
                "hit_rate": summary.get("hit_rate"),
                "s": round(time.perf_counter() - t0, 1),
            }
        except Exception as err:  # noqa: BLE001  the check records a crash and goes on
            same, results[name] = False, {"equal": False, "error": f"{type(err).__name__}: {err}"}
        expect_fault = "dies" in name
        good = same and (results[name].get("fault") is not None) == expect_fault
        if expect_fault and good:
            good = results[name]["strategy at the end"] == "sd"
        ok &= good
        detail = results[name].get("error") or (
            f"α {results[name]['alpha']}, hit rate {results[name]['hit_rate']}, "
            f"ended as {results[name]['strategy at the end']}"
        )
        report.line(f"- greedy fp32 {name}: {'= AR' if same else '!= AR'}{'' if good else ' (FAILED)'}; {detail}")
    report.save({"ar_tokens": ar, "runs": results, "ok": ok})
    return ok


def step_tests(report: Report, device: torch.device, args) -> bool:
    """tests/gpu (greedy, chi-square exactness with its negative control, the link) on this device."""
    root = Path(__file__).resolve().parent.parent
    log = report.out / "pytest.log"
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "tests/gpu",
        "-q",
        "-rfE",
        "-p",
        "no:cacheprovider",
        f"--timeout={max(30, int(args.budget_s) - 10)}",
    ]
    if device.type == "cuda":
        cmd.append("--run-gpu")
    if args.quick:
        cmd += ["-x", "-k", "greedy"]
    t0 = time.perf_counter()
    with log.open("w") as f:
        rc = subprocess.call(cmd, cwd=root, stdout=f, stderr=subprocess.STDOUT, timeout=args.budget_s)
    tail = [line for line in log.read_text().splitlines() if line.strip()][-1:] or ["(no output)"]
    report.line(
        f"- tests/gpu on {device.type}: {'ok' if rc == 0 else f'FAILED (exit {rc})'}: {tail[0]} "
        f"({time.perf_counter() - t0:.0f} s; pytest.log)"
    )
    report.save({"exit": rc, "last line": tail[0]})
    return rc == 0


def step_syncs(report: Report, device: torch.device, args) -> bool:
    """Host synchronisations per steady decode step, per strategy (batch of four, fp32 tiny pair)."""
    from engine import LLM, SamplingParams, SpeculativeConfig
    from engine.config import DraftPlacement

    params = SamplingParams(temperature=0, max_new_tokens=40, stop_on_eos=False)
    configs = {
        "ar": ("ar", None),
        "sd": ("sd", SpeculativeConfig(K=3)),
        "ssd": ("ssd", SpeculativeConfig(K=3, placement=DraftPlacement(in_process=True))),
    }
    results = {}
    for name, (strategy, spec) in configs.items():
        target, draft = _greedy_pair()
        with LLM(
            target, None if strategy == "ar" else draft, strategy=strategy, speculative=spec, device=str(device)
        ) as llm:
            for i, prompt in enumerate([[1, 2, 3], [4, 5], [6, 7, 8, 9], [3, 3]]):
                llm.loop.submit(llm.make_sequence(prompt, params, index=i, seed=i))
            for _ in range(3):  # the prefill and two rounds: caches and shapes settle
                llm.loop.step()
            steps = 3
            with counting_syncs(device) as counts:
                for _ in range(steps):
                    llm.loop.step()
            results[name] = {k: v / steps for k, v in counts.items()}
            results[name]["total per step"] = sum(counts.values()) / steps
    what = "CUDA syncs" if device.type == "cuda" else "host reads of tensor values (each a sync on a GPU)"
    report.line(
        f"- {what} per decode step, batch 4: " + ", ".join(f"{k} {v['total per step']:.1f}" for k, v in results.items())
    )
    report.save(results)
    return True


def step_overhead(report: Report, device: torch.device, args) -> bool:
    """The engine's own cost against its forwards (benchmarks.engine_overhead) on this device: AR, SD and SSD on the
    overhead-bound random pair forced to agree (width 64, an 8-layer target, a 2-layer draft, K 4, greedy), each
    strategy's time per token beside what its own measured forwards allow, at vocabularies 2,048 and 151,936."""
    from benchmarks import engine_overhead

    clock = Clock(args.budget_s)
    quick = args.quick
    options = engine_overhead.build_parser().parse_args(
        ["--device", str(device), "--new-tokens", "16" if quick else "128", "--repeats", "1" if quick else "2"]
        + (["--branch-rows", "1", "16"] if quick else [])
    )
    rows = []
    for vocab in (512,) if quick else (2048, 151936):
        if rows and clock.left() < 40:
            report.line(f"- engine overhead at vocabulary {vocab}: not run, the step's budget was spent")
            break
        row = engine_overhead.measure(vocab, 32, options)
        rows.append(row)
        bare = min(row["bare_ms"])
        cells = ", ".join(
            f"{s} {r['best_tpot_ms']:.3f} ms ({r['best_tpot_ms'] / r['ideal_ms']:.2f}x ideal)"
            for s, r in row["engine"].items()
        )
        report.line(f"- engine overhead, vocabulary {vocab}, α 1, per token: bare loop {bare:.3f} ms; {cells}")
        report.save({"rows": rows})
    return bool(rows)


def _pairs(args) -> dict:
    return TINY_PAIRS if args.quick or args.device == "cpu" else PAIRS


def _batches(args) -> tuple[int, ...]:
    return (1, 8) if args.quick else (1, 8, 32)


def step_timings(report: Report, device: torch.device, args) -> bool:
    """Per-forward times (CUDA events): the target's verify at K+1 = 2..8, one draft step, the draft worker's cache
    build at budgets 4-64 per row and a round answered by the neural backup, at batch 1, 8 and 32."""
    from engine import LLM, SamplingParams, SpeculativeConfig
    from engine.config import DraftPlacement
    from engine.kv_cache import KVState

    clock, dtype = Clock(args.budget_s), torch.bfloat16 if device.type == "cuda" else torch.float32
    context = 64 if args.quick else 256
    widths = (2, 4) if args.quick else tuple(range(2, 9))
    budgets = (4, 16) if args.quick else (4, 8, 16, 32, 64)
    reps = 3 if args.quick else 5
    results, gen = {}, torch.Generator(device=device).manual_seed(0)
    for pair_name, (t_shape, d_shape) in _pairs(args).items():
        if clock.left() < 10:
            report.line(f"- timings {pair_name}: skipped, out of time")
            continue
        target, draft = pair(t_shape, d_shape, device, dtype)
        V = t_shape.vocab
        rows = []
        for B in _batches(args):
            if clock.left() < 10:
                break
            prompt = torch.randint(0, V, (B, context), device=device, generator=gen)
            row = {"pair": pair_name, "batch": B, "context": context}
            for name, model in (("target", target), ("draft", draft)):
                state = KVState(model, B, device)
                state.extend(prompt, logits_to_keep=1)
                for w in widths if name == "target" else (1,):
                    block = torch.randint(0, V, (B, w), device=device, generator=gen)
                    drop = torch.full((B,), w, device=device)

                    def forward(state=state, block=block, drop=drop):
                        state.extend(block)
                        state.rollback(drop)

                    key = f"verify K+1={w} ms" if name == "target" else "draft step ms"
                    row[key] = round(median_ms(forward, device, reps), 3)
                del state
            for budget in budgets:
                if clock.left() < 10:
                    break
                spec = SpeculativeConfig(K=4, budget=budget, placement=DraftPlacement(in_process=True))
                try:
                    with LLM(target, draft, strategy="ssd", speculative=spec, device=str(device)) as llm:
                        worker = llm.proposer.channel.worker
                        build = SyncedTimer(worker, "build_cache", device)
                        respond = SyncedTimer(worker, "respond", device)
                        backups: list[bool] = []  # per answer: did a backup draft some rows
                        original = respond.original

                        def answer(msg, original=original, backups=backups, worker=worker):
                            reply = original(msg)
                            backups.append(worker.last_backup is not None)
                            return reply

                        respond.original = answer
                        params = SamplingParams(temperature=0, max_new_tokens=12, stop_on_eos=False, seed=1)
                        llm.generate([p.tolist() for p in prompt], params)
                        builds = build.ms[1:] or build.ms
                        row[f"cache build budget {budget} ms"] = round(statistics.median(builds), 3)
                        if budget == budgets[0]:
                            answered = respond.ms[1:]  # the first answer also prefills
                            with_backup = [ms for ms, b in zip(answered, backups[1:], strict=True) if b]
                            if with_backup:
                                row["backup round (neural, K 4) ms"] = round(statistics.median(with_backup), 3)
                except (RuntimeError, ValueError) as err:
                    row[f"cache build budget {budget} ms"] = f"{type(err).__name__}: {str(err)[:200]}"
            rows.append(row)
            report.line(
                f"  - {pair_name} batch {B}: "
                + ", ".join(f"{k.removesuffix(' ms')} {v}" for k, v in row.items() if k.endswith("ms"))
            )
        results[pair_name] = rows
        del target, draft
        if device.type == "cuda":
            torch.cuda.empty_cache()
    report.save({"dtype": str(dtype), "rows": results})
    return True


def step_e2e(report: Report, device: torch.device, args, agree: bool) -> bool:
    """AR, SD and SSD tokens/s at batch 1, 8 and 32, eager forwards, SSD's draft worker in its own process on the
    same device. `agree`: greedy on models forced to agree (α = 1, every outcome cached: SSD's best case); else
    temperature 1 on unrelated random weights (α measured; the outcome is spread over the vocabulary, so SSD's cache
    misses and every round takes the backup: its worst case)."""
    from engine import LLM, SamplingParams, SpeculativeConfig
    from engine.config import DraftPlacement

    clock, dtype = Clock(args.budget_s), torch.bfloat16 if device.type == "cuda" else torch.float32
    new_tokens = 16 if args.quick else 64
    prompt_len = 32 if args.quick else 128
    results, temperature = [], 0.0 if agree else 1.0
    what = "models forced to agree, T 0" if agree else "unrelated random weights, T 1"
    report.line(f"- end to end, {what}, {prompt_len}-token prompts, {new_tokens} new tokens, eager:")
    for pair_name, (t_shape, d_shape) in _pairs(args).items():
        for strategy, spec in (
            ("ar", None),
            ("sd", SpeculativeConfig(K=4)),
            ("ssd", SpeculativeConfig(K=4, placement=DraftPlacement(deadline_s=120.0))),
        ):
            if clock.left() < 20:
                report.line(f"  - {pair_name} {strategy}: skipped, out of time")
                continue
            target, draft = pair(t_shape, d_shape, device, dtype, agree=agree)
            gen = torch.Generator().manual_seed(7)
            try:
                with LLM(
                    target, None if strategy == "ar" else draft, strategy=strategy, speculative=spec, device=str(device)
                ) as llm:
                    warm = SamplingParams(temperature=temperature, max_new_tokens=8, stop_on_eos=False, seed=0)
                    llm.generate([[1, 2, 3, 4]], warm)
                    for B in _batches(args):
                        if clock.left() < 10:
                            break
                        prompts = torch.randint(0, t_shape.vocab, (B, prompt_len), generator=gen).tolist()
                        params = SamplingParams(
                            temperature=temperature, max_new_tokens=new_tokens, stop_on_eos=False, seed=B
                        )
                        synchronize(device)
                        t0 = time.perf_counter()
                        out = llm.generate(prompts, params)
                        synchronize(device)
                        wall = time.perf_counter() - t0
                        summary = out.metrics.summary()
                        emitted = sum(len(o.token_ids) for o in out)
                        row = {
                            "pair": pair_name,
                            "strategy": strategy,
                            "batch": B,
                            "temperature": temperature,
                            "agree": agree,
                            "tokens_per_s": emitted / wall,
                            "wall_s": wall,
                            "alpha": summary.get("alpha"),
                            "hit_rate": summary.get("hit_rate"),
                            "ran_as": llm.strategy_in_use,
                            "fault": llm.fault,
                        }
                        results.append(row)
                        report.line(
                            f"  - {pair_name} {strategy} batch {B}: {row['tokens_per_s']:.1f} tok/s"
                            + (f", α {row['alpha']:.2f}" if strategy != "ar" and row["alpha"] is not None else "")
                            + (f", hit rate {row['hit_rate']:.2f}" if row["hit_rate"] is not None else "")
                            + (f" (ran as {row['ran_as']}: {row['fault']})" if row["fault"] else "")
                        )
            except (RuntimeError, ValueError) as err:
                results.append({"pair": pair_name, "strategy": strategy, "error": f"{type(err).__name__}: {err}"})
                report.line(f"  - {pair_name} {strategy}: FAILED: {type(err).__name__}: {str(err)[:300]}")
            del target, draft
            if device.type == "cuda":
                torch.cuda.empty_cache()
    report.save(
        {
            "dtype": str(dtype),
            "new_tokens": new_tokens,
            "prompt_len": prompt_len,
            "temperature": temperature,
            "agree": agree,
            "rows": results,
        }
    )
    return not any("error" in r for r in results)


def step_compiled(report: Report, device: torch.device, args) -> bool:
    """The target's verify (K+1 = 5) and the draft's step, eager against compiled (CUDA graphs on CUDA) on the
    static slot cache, batch 1 and 8, on random weights shaped like the default pair (benchmarks.compiled_forward)."""
    from benchmarks.compiled_forward import compare_forwards, summarise

    shapes = "tiny" if args.quick or device.type == "cpu" else "qwen-coder"
    rows = compare_forwards(
        device=str(device),
        shapes=shapes,
        dtype="bfloat16" if device.type == "cuda" else "float32",
        batches=(1,) if args.quick else (1, 8),
        reps=3 if args.quick else 10,
    )
    summary = summarise(rows)
    for line in summary:
        report.line(
            f"  - compiled {line['model']} {line['forward']} batch {line['batch']}: eager "
            f"{line['eager_ms']} ms, static {line['static_ms']}, compiled {line['compiled_ms']} "
            f"({line['eager_over_compiled']}x; {line['saved_per_layer_us']} µs a layer saved; compile "
            f"{line['compile_s']} s)"
        )
    report.save({"shapes": shapes, "rows": rows, "summary": summary})
    return True


def step_launch(report: Report, device: torch.device, args) -> bool:
    """A Llama-3.2-1B-shaped decode step eager against replayed from a CUDA graph, lean and through transformers
    (benchmarks.launch_overhead): how far the simulator's eager launch overhead per layer carries."""
    if device.type != "cuda":
        report.line("- launch overhead: CUDA only, skipped on CPU")
        report.save({"skipped": "CUDA only"})
        return True
    from benchmarks import launch_overhead

    path = report.out / "launch_overhead.json"
    launch_overhead.main(str(path))
    out = json.loads(path.read_text())
    report.line(
        f"- launch overhead (Llama-3.2-1B shape, batch 1): lean {out['lean_launch_overhead_us_per_layer']:.0f}"
        f" µs a layer eager over graph; transformers eager split {out['transformers'].get('eager_split')}"
    )
    path.unlink()
    report.save(out)
    return True


RUN = {
    "env": step_env,
    "canary": step_canary,
    "greedy": step_greedy,
    "tests": step_tests,
    "syncs": step_syncs,
    "overhead": step_overhead,
    "timings": step_timings,
    "compiled": step_compiled,
    "launch": step_launch,
    "e2e-agree": lambda r, d, a: step_e2e(r, d, a, agree=True),
    "e2e-random": lambda r, d, a: step_e2e(r, d, a, agree=False),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("step", choices=STEPS)
    parser.add_argument("--out", type=Path, required=True, help="folder for summary.md, results.json and logs")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (a dry run on tiny shapes)")
    parser.add_argument("--quick", action="store_true", help="the fewest configurations (the check's own test)")
    parser.add_argument("--budget-s", type=float, default=120.0, help="seconds this step may take")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(
            f"gpu-check: torch {torch.__version__} sees no CUDA device; use --device cpu for a dry run", file=sys.stderr
        )
        return 2
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)
    report = Report(args.out, args.step)
    try:
        return 0 if RUN[args.step](report, device, args) else 1
    except Exception as err:
        report.line(f"- {args.step}: CRASHED: {type(err).__name__}: {str(err)[:500]}")
        raise


if __name__ == "__main__":
    sys.exit(main())

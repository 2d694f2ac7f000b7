"""The benchmark loop: warm-up, then every (variant, batch) unit once, recorded as it finishes.

Variants are interleaved batch by batch, so that drift of the machine (heat, other load) hits all
systems alike. Each call's seed is `seed + batch index`, the same whatever ran before it, so a resumed
run draws exactly what an uninterrupted one would. A call that raises is recorded as an error line
for each of its prompts (message and the last frames of the traceback) and the run goes on.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from engine import SamplingParams
from engine.loading.devices import resolve_dtype
from saguaro.bench.config import BenchConfig, Variant
from saguaro.bench.environment import environment
from saguaro.bench.others import OtherLoad, disturbed_reason
from saguaro.bench.prompts import Prompt, load_prompts
from saguaro.bench.runfolder import RunDir
from saguaro.bench.summary import summarize
from saguaro.bench.systems import Models, Systems

log = logging.getLogger(__name__)
TRACEBACK_FRAMES = 4
MANY_SSD_ENGINES = 4
MEMORY_MARGIN = 1 << 30  # left free for the OS and the run's own growth


@dataclass
class BenchOutcome:
    run_dir: RunDir
    ran: int  # units run by this invocation
    skipped: int  # units already done before this invocation (a resumed run)
    errors: int  # result lines with an error, in this invocation
    unavailable: list[dict] = field(default_factory=list)
    summary: dict = field(default_factory=dict)


def _batches(prompts: list[Prompt], size: int) -> list[list[Prompt]]:
    return [prompts[i : i + size] for i in range(0, len(prompts), size)]


def _error_summary(err: BaseException) -> dict:
    frames = traceback.extract_tb(err.__traceback__)[-TRACEBACK_FRAMES:]
    return {
        "error": f"{type(err).__name__}: {err}",
        "traceback": [f"{f.filename}:{f.lineno} in {f.name}" for f in frames],
    }


class Bench:
    """Runs a BenchConfig into a run folder.

    `models`: already built models (tests, notebooks) instead of loading config.target / config.draft.
    `systems`: a factory for the systems under test (default `Systems` on the models); the test fixtures
    pass a statistical stand-in with the same interface.
    """

    def __init__(
        self,
        config: BenchConfig,
        run_dir: RunDir,
        models: Models | None = None,
        systems: Callable[[BenchConfig], Systems] | None = None,
    ):
        self.config = config
        self.run_dir = run_dir
        self.prompts = run_dir.prompts()
        if self.prompts is None:  # a new run: select the prompts and keep a copy beside the results
            self.prompts = load_prompts(
                config.prompts, config.n_prompts, list(config.categories) or None, config.prompt_order
            )
            run_dir.write_prompts(self.prompts)
        self._models = models
        self._systems = systems
        self._say = log.debug  # progress lines: log.info while run(progress=True) runs

    @staticmethod
    def available_memory() -> int:
        """Bytes the machine can still give (psutil's `available`)."""
        import psutil

        return psutil.virtual_memory().available

    def _check_memory(self, before: int, engines_left: int) -> None:
        """With --order interleaved every SSD engine stays alive, each with a draft worker process: after building
        one, refuse the run if the ones still to build would not fit (each costing what this one did, half again
        for what their first calls add) rather than let the kernel's OOM killer end it without a word."""
        left = self.available_memory()
        cost = before - left
        if engines_left <= 0 or cost <= 0:
            return
        need = int(1.5 * cost * engines_left) + MEMORY_MARGIN
        if need > left:
            raise ValueError(
                f"{engines_left + 1} SSD engines would stay alive together (--order interleaved), about "
                f"{cost / 2**30:.1f} GiB each, and only {left / 2**30:.1f} GiB is left after the first: use "
                f"--order grouped (one engine at a time) or fewer SSD variants"
            )

    def params(self, T: float, batch_index: int, warmup: bool = False, mode: str | None = None) -> SamplingParams:
        c = self.config
        return SamplingParams(
            temperature=T,
            max_new_tokens=c.warmup_tokens if warmup else c.max_new_tokens,
            stop_on_eos=c.stop_on_eos,
            seed=c.seed + batch_index,
            sampling_mode=mode or "standard",
        )

    def units(self, variants: list[Variant]) -> list[tuple[Variant, int, list[Prompt]]]:
        """(variant, batch index, prompts) in run order.

        interleaved: batch 0 of every variant, then batch 1, ... (machine drift hits all systems alike);
        grouped: all of one variant's batches, then the next's, variants sharing an engine together.
        """
        per_variant = {v: _batches(self.prompts, v.settings.batch) for v in variants}
        if self.config.order == "grouped":
            engines = list(dict.fromkeys(Systems.engine_key(v) for v in variants))
            ordered = sorted(variants, key=lambda v: engines.index(Systems.engine_key(v)))
            return [(v, i, b) for v in ordered for i, b in enumerate(per_variant[v])]
        longest = max((len(b) for b in per_variant.values()), default=0)
        return [(v, i, bs[i]) for i in range(longest) for v, bs in per_variant.items() if i < len(bs)]

    def run(self, progress: bool = True, on_unit: Callable[[int], None] | None = None) -> BenchOutcome:
        """Run what is not done yet, then write the summary. `on_unit(n)` is called after each recorded
        unit (tests use it)."""
        variants, skipped = self.config.grid()
        all_units = self.units(variants)
        done = self.run_dir.prepare_resume({(v.key, i): len(ps) for v, i, ps in all_units})
        todo = [u for u in all_units if (u[0].key, u[1]) not in done]
        unavailable = [{"key": v.key, "system": v.system, "reason": why} for v, why in skipped]
        outcome = BenchOutcome(self.run_dir, 0, len(all_units) - len(todo), 0, unavailable)
        if todo:
            self._run(todo, outcome, progress, on_unit)
        outcome.summary = summarize(self.run_dir, outcome.unavailable)
        return outcome

    def _run(self, todo, outcome: BenchOutcome, progress: bool, on_unit) -> None:
        say = self._say = log.info if progress else log.debug
        unavailable = outcome.unavailable
        if self._systems is not None:
            systems = self._systems(self.config)
        else:
            models = self._models
            if models is None:
                c = self.config
                start = time.perf_counter()
                say(
                    "loading %s (%s) and draft %s (%s) ...",
                    c.target,
                    c.target_quant or c.dtype,
                    c.draft,
                    c.draft_quant or ("int8-dynamic" if c.draft_int8 else c.draft_dtype or c.dtype),
                )
                models = Models.load(c)
                say("... loaded in %.1f s", time.perf_counter() - start)
            systems = Systems(models, self.config)
        grouped = self.config.order == "grouped"
        try:
            ssd_left = len({Systems.engine_key(u[0]) for u in todo if u[0].system == "ssd"})
            built: set = set()
            for v in dict.fromkeys(u[0] for u in todo):
                if v.system in ("ar", "sd", "ssd"):
                    say("building the %s engine for %s ...", v.system.upper(), v.key)
                new_ssd = v.system == "ssd" and not grouped and Systems.engine_key(v) not in built
                before = self.available_memory() if new_ssd else None
                built.add(Systems.engine_key(v))
                why = systems.unavailable(v) or _ignored_settings(systems, v)
                if before is not None and not why:
                    ssd_left -= 1
                    self._check_memory(before, ssd_left)
                if why:
                    log.warning("%s is unavailable: %s", v.key, why)
                    unavailable.append({"key": v.key, "system": v.system, "reason": why})
                if grouped:  # its engine is built again when its turn comes
                    systems.release(v)
            blocked = {u["key"] for u in unavailable}
            todo = [u for u in todo if u[0].key not in blocked]
            ssd_engines = {Systems.engine_key(v) for v, _, _ in todo if v.system == "ssd"}
            if not grouped and len(ssd_engines) > MANY_SSD_ENGINES:
                log.warning(
                    "%d SSD engines stay alive together, each with a draft worker process holding the "
                    "draft: if memory runs short, use --order grouped",
                    len(ssd_engines),
                )
            last_of_engine = {Systems.engine_key(v): n for n, (v, _, _) in enumerate(todo)}
            if not grouped:
                self._warm_up(systems, dict.fromkeys(u[0] for u in todo))
            warm: set[Variant] = set()
            start = time.perf_counter()
            for n, (v, index, prompts) in enumerate(todo):
                if grouped and v not in warm:
                    self._warm_up(systems, [v])
                    warm.add(v)
                say("%s", progress_line(n, len(todo), v, index, prompts, time.perf_counter() - start))
                outcome.errors += self._run_unit(systems, v, index, prompts)
                if grouped and last_of_engine[Systems.engine_key(v)] == n:
                    systems.release(v)
                outcome.ran += 1
                if on_unit is not None:
                    on_unit(outcome.ran)
            say("ran %d calls in %.1f s", len(todo), time.perf_counter() - start)
        finally:
            systems.close()

    def _warm_up(self, systems: Systems, variants) -> None:
        if not self.config.warmup or not self.prompts:
            return
        for v in variants:
            prompts = self.prompts[: v.settings.batch]
            self._say("warming up %s ...", v.key)
            for _ in range(self.config.warmup):
                try:
                    systems.run(
                        v, prompts, self.params(v.settings.temperature, 0, warmup=True, mode=v.settings.sampling_mode)
                    )
                except Exception as err:  # noqa: BLE001  recorded when the real call fails the same way
                    log.warning("warm-up of %s failed: %s", v.key, err)

    def _run_unit(self, systems: Systems, v: Variant, index: int, prompts: list[Prompt]) -> int:
        ident = {
            "key": v.key,
            "system": v.system,
            "settings": v.settings.to_dict(),
            "batch_index": index,
            "batch_size": len(prompts),
        }
        described = [{**ident, "prompt_id": p.id, "category": p.category, "task": p.task} for p in prompts]
        load = OtherLoad.now()
        try:
            out = systems.run(v, prompts, self.params(v.settings.temperature, index, mode=v.settings.sampling_mode))
        except Exception as err:  # noqa: BLE001  one failed batch is a row of the results, not the run's end
            log.warning("%s, batch %d (%s) failed: %s", v.key, index, ", ".join(p.id for p in prompts), err)
            self.run_dir.append_unit([{**d, **_error_summary(err)} for d in described], [])
            return len(prompts)
        share = load.share()
        call = {"wall_s": out.wall_s, "torch_threads": out.threads, "others_cpu_share": round(share, 3)}
        if reason := disturbed_reason(share):
            log.warning("%s, batch %d: %s; marked disturbed", v.key, index, reason)
            call["disturbed"] = reason
        results = [{**d, **call, **r} for d, r in zip(described, out.requests, strict=True)]
        prompt_ids = [p.id for p in prompts]
        rounds = [{"key": v.key, "batch_index": index, "prompt_ids": prompt_ids, **r} for r in out.rounds]
        self.run_dir.append_unit(results, rounds)
        return 0


def progress_line(n: int, total: int, v: Variant, index: int, prompts: list[Prompt], elapsed_s: float) -> str:
    """ "[3/40] ssd K=4 B=12 uniform neural T=0 b=1, batch 2: prompt tiny/3 (12 s so far, about 150 s left) ..."."""
    ids = ", ".join(p.id for p in prompts)
    which = f"prompt{'s' if len(prompts) > 1 else ''} {ids}"
    left = f", about {elapsed_s / n * (total - n):.0f} s left" if n else ""
    return f"[{n + 1}/{total}] {v.key}, batch {index}: {which} ({elapsed_s:.0f} s so far{left}) ..."


def _ignored_settings(systems, v: Variant) -> str | None:
    """Why an SD variant with adaptive K or a confidence stop cannot run: the engine that was built for it does
    not have them (a Systems that does not pass Settings.speculative_kwargs on). None when it does, or when it
    cannot be told (a stand-in without engines)."""
    s = v.settings
    if v.system != "sd" or not (s.adaptive or s.confidence_stop is not None):
        return None
    engine = getattr(systems, "_engines", {}).get(Systems.engine_key(v))
    spec = getattr(getattr(engine, "config", None), "speculative", None)
    if spec is None:
        return None
    if spec.adaptive != bool(s.adaptive) or spec.confidence_stop != s.confidence_stop:
        return (
            "this saguaro/bench/systems.py builds SD without the variant's adaptive K / confidence stop "
            "(it must pass Settings.speculative_kwargs() to SpeculativeConfig)"
        )
    return None


def start(config: BenchConfig, out: str, name: str | None = None, models: Models | None = None) -> Bench:
    """A Bench writing into a new run folder under `out`."""
    import torch

    # "auto" resolved once, here, so the run folder records what loaded and a resumed run loads the same
    config = replace(
        config,
        dtype=resolve_dtype(config.dtype),
        draft_dtype=None if config.draft_dtype is None else resolve_dtype(config.draft_dtype),
    )
    if config.threads:
        torch.set_num_threads(config.threads)
    run_dir = RunDir.create(
        out, name or config.prompts.rsplit("/", 1)[-1], config.to_dict(), environment(torch.get_num_threads())
    )
    return Bench(config, run_dir, models)


def resume(path: str, models: Models | None = None) -> Bench:
    """A Bench continuing the run folder at `path` with its own saved configuration."""
    import torch

    run_dir = RunDir.open(path)
    config = BenchConfig.from_dict(run_dir.config)
    if config.threads:
        torch.set_num_threads(config.threads)
    run_dir.note_resumed(environment(torch.get_num_threads()))
    return Bench(config, run_dir, models)

"""Engine settings: frozen dataclasses that validate themselves and raise ValueError."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum

from engine.compile_config import CompileConfig
from theory.glossary import Backup, Strategy

DTYPES = ("float32", "bfloat16", "float16")
QUANTS = ("int8", "int4")  # weight-only low-bit schemes (engine.loading.weight_only); None = the float weights
# The draft may also use dynamic int8 (int8 weights and int8 activations, torch.ao): 2.3x faster than
# weight-only int8 for the 0.5B draft (41 vs 95 ms a step, one thread of a 2-core AMD EPYC). Not for the
# target: its per-tensor activation scale spans the rows of a forward, so the target's p would depend on
# what shares the batch.
DYNAMIC_INT8 = "int8-dynamic"
DRAFT_QUANTS = QUANTS + (DYNAMIC_INT8,)
QUANT_GROUP_SIZES = (32, 64, 128)  # int4 groups along in_features (engine.loading.weight_only.GROUP_SIZES)
AUTO_K_MAX = 8  # the largest K that K="auto" may choose


class FanoutSchedule(str, Enum):
    """How SSD spreads its cache budget over the outcomes k = 0..K (docs/ssd.md §4)."""

    UNIFORM = "uniform"  # B spread evenly (the reference engine's default)
    GIVEN = "given"  # exactly `fanout` / `fanout_backup`
    GEOMETRIC = "geometric"  # Thm 12 from the running α and the fitted power-law r


class StartFault(str, Enum):
    """Fault injection for tests: what the worker process does while it starts."""

    EXIT_BEFORE_JOINING = "exit before joining"  # before it connects to the target's store
    EXIT_WHILE_LOADING = "exit while loading"  # connected, while it builds its model
    HANG_WHILE_LOADING = "hang while loading"


@dataclass(frozen=True)
class WorkerFaults:
    """Fault injection for tests: at the given round (1 = the first decode round) the worker process
    exits, hangs (its loop sleeps; its heartbeat goes on), stops (SIGSTOP: the whole process, heartbeat
    included), or answers with a malformed message; `at_start`: a fault while it starts."""

    exit_at_round: int | None = None
    hang_at_round: int | None = None
    malformed_at_round: int | None = None
    stop_at_round: int | None = None
    at_start: StartFault | None = None


@dataclass(frozen=True)
class DraftPlacement:
    """Where SSD's draft worker runs and how the target talks to it (engine/ssd/README.md).

    in_process   run the worker in the target's process (tests; no overlap, same results).
    draft_threads torch threads of the worker; on CPU it is also pinned to that many cores.
    draft_device  the worker's device; None = "cpu" beside a CPU target and "cuda" beside a CUDA target;
                 "cuda" (no index) = the next GPU after the target's, or the target's own when it is the only
                 one (the worker keeps its own process); engine.ssd.placement.draft_device_for.
    init_method  tcp://host:port of the rendezvous the target hosts; port 0 = a free port.
    deadline_s   longest wait for one answer of the worker before falling back to synchronous SD with
                 the in-process draft (AR when there is none). A worker whose process stops is found sooner,
                 by its heartbeat (engine.ssd.heartbeat: within 5.5 s).
    start_deadline_s longest wait for the worker to start, load its model and answer a new batch.
    external     do not start the worker: one is started by hand (another host) with
                 `python -m engine.ssd.process tcp://host:port` and fetches its settings from the target.
    """

    in_process: bool = False
    draft_threads: int = 1
    draft_device: str | None = None
    init_method: str = "tcp://127.0.0.1:0"
    deadline_s: float = 30.0
    start_deadline_s: float = 300.0
    faults: WorkerFaults | None = None
    external: bool = False

    def __post_init__(self) -> None:
        if self.draft_threads < 1:
            raise ValueError(f"draft_threads must be >= 1, got {self.draft_threads}")
        if not (self.deadline_s > 0 and self.start_deadline_s > 0):
            raise ValueError("deadline_s and start_deadline_s must be > 0 seconds")
        if not self.init_method.startswith("tcp://"):
            raise ValueError(f"init_method must look like tcp://host:port, got {self.init_method!r}")


# What `saguaro generate`, `serve` and `bench` run for a strategy when no speculation flag is given: chosen from the CPU
# studies; measured side by side with the best candidates (reports/2026-12-cpu-speculation-defaults: HumanEval and
# Spec-Bench, greedy and T 0.7, 2-core CPU) SD's was the fastest SD variant in all four settings and SSD's the fastest
# SSD variant on HumanEval (greedy 1.33x the runner-up) and 0.955-0.962 of fixed K 3 on Spec-Bench (48 prompts at T 0.7,
# 24 greedy). K and budget "auto" follow the times a run measures, so seeded output at T > 0 may differ from run to run
# (give -K and --budget for repeatable output); SpeculativeConfig's own defaults below stay fixed for that reason.
COMMAND_LINE_DEFAULTS: dict[Strategy, dict] = {
    Strategy.SD: {"K": "auto"},
    Strategy.SSD: {"K": "auto", "budget": "auto", "schedule": FanoutSchedule.GEOMETRIC},
}


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculation settings (notation of docs/ssd.md).

    K       draft tokens per round.
    fanout  F_0..F_K: guesses per verification outcome k (SSD's cache); also fixes Saguaro's
            down-weighted set at draft position k+1: the top F_k + 1 tokens of q. None = uniform 3.
    C       Saguaro down-weighting constant in (0, 1]; 1 = plain sampling (Saguaro off).
    backup  what SSD does on a cache miss.
    schedule       SSD fan-out schedule kind; GIVEN uses `fanout` (after hits) and `fanout_backup`.
    fanout_backup  F^b: fan-out for rounds whose speculation came from the backup (None = as `fanout`).
    budget         B = Σ_k F_k for UNIFORM / GEOMETRIC; None = Σ fanouts; "auto" = fitted from the
                   measured timings so that building the cache fits inside one verify.
    placement      where SSD's draft worker runs.
    adaptive       SD and SSD: choose each round's K in K_min..K from the running per-row α and the measured
                   draft and verify times (theory.adaptive.best_K); K is then the maximum. K="auto" is
                   adaptive=True with K = AUTO_K_MAX.
    K_min          the smallest K adaptive may choose (>= 1).
    draft_cost     adaptive only: T_d / T_v, one draft token's time over one verify's, as a fixed number
                   instead of measured (measured times make the seeded outputs vary from run to run,
                   though never their distribution).
    confidence_stop SD only: stop drafting once the draft's top probability (softmax of its raw logits) falls
                   below this at the next position in every row of the batch; the round verifies the
                   shorter block (at least one token).
    """

    K: int = 4  # "auto" is taken as adaptive=True with K = AUTO_K_MAX
    fanout: tuple[int, ...] | None = None
    C: float = 1.0
    backup: Backup = Backup.NEURAL
    schedule: FanoutSchedule = FanoutSchedule.UNIFORM
    fanout_backup: tuple[int, ...] | None = None
    budget: int | str | None = None
    placement: DraftPlacement = field(default_factory=DraftPlacement)
    adaptive: bool = False
    K_min: int = 1
    draft_cost: float | None = None
    confidence_stop: float | None = None

    def __post_init__(self) -> None:
        if isinstance(self.K, str) and self.K == "auto":  # taken at construction; the field then holds an int
            object.__setattr__(self, "K", AUTO_K_MAX)
            object.__setattr__(self, "adaptive", True)
        if not isinstance(self.K, int) or self.K < 1:
            raise ValueError(f"K (draft tokens per round) must be an integer >= 1, got {self.K!r}")
        if not 0 < self.C <= 1:
            raise ValueError(f"C (Saguaro constant) must be in (0, 1]; use 1 to turn it off, got {self.C}")
        if self.fanout is not None:
            fanout = tuple(int(f) for f in self.fanout)
            if len(fanout) != self.K + 1 or min(fanout) < 0:
                raise ValueError(
                    f"fanout must list K + 1 = {self.K + 1} non-negative integers F_0..F_K, got {self.fanout}"
                )
            object.__setattr__(self, "fanout", fanout)
        if self.fanout_backup is not None:
            fanout = tuple(int(f) for f in self.fanout_backup)
            if len(fanout) != self.K + 1 or min(fanout) < 0:
                raise ValueError(
                    f"fanout_backup must list K + 1 = {self.K + 1} non-negative integers, got {self.fanout_backup}"
                )
            object.__setattr__(self, "fanout_backup", fanout)
        object.__setattr__(self, "backup", Backup(self.backup))
        object.__setattr__(self, "schedule", FanoutSchedule(self.schedule))
        if self.budget is not None and self.budget != "auto" and (not isinstance(self.budget, int) or self.budget < 0):
            raise ValueError(f"budget must be a non-negative integer, None or 'auto', got {self.budget!r}")
        if not isinstance(self.K_min, int) or not 1 <= self.K_min <= self.K:
            raise ValueError(f"K_min must be an integer in 1..K = 1..{self.K}, got {self.K_min!r}")
        if self.draft_cost is not None and not self.draft_cost >= 0:
            raise ValueError(f"draft_cost (T_d / T_v) must be >= 0, or None to measure it; got {self.draft_cost}")
        if self.confidence_stop is not None and not 0 < self.confidence_stop <= 1:
            raise ValueError(f"confidence_stop must be a probability in (0, 1], or None; got {self.confidence_stop}")

    @property
    def fanouts(self) -> tuple[int, ...]:
        """F_0..F_K, with the uniform default filled in."""
        return self.fanout if self.fanout is not None else (3,) * (self.K + 1)

    def saguaro_top(self) -> tuple[int, ...]:
        """Size of Saguaro's down-weighted set at draft positions 1..K: F_{i-1} + 1."""
        return tuple(f + 1 for f in self.fanouts[: self.K])


@dataclass(frozen=True)
class QuantConfig:
    """Low-bit weights of one model (engine.loading.quantize).

    scheme      "int8" (symmetric, one scale per output channel) or "int4" (asymmetric, grouped by
                `group_size` along in_features): weight-only low-bit Linear layers on torch's CPU kernels.
                A draft may also be "int8-dynamic": int8 activations too (torch.ao), the fastest CPU draft.
    group_size  int4's group: 32, 64 or 128.
    head        None (the output head in float) or "int8" / "int4": the output head low-bit too, untied from
                the embedding, whose lookup stays float (engine.loading.quantize.quantize_head).
    """

    scheme: str
    group_size: int = 32
    head: str | None = None

    def __post_init__(self) -> None:
        if self.scheme not in DRAFT_QUANTS:
            raise ValueError(
                f"unknown quantisation scheme {self.scheme!r}: use one of {', '.join(QUANTS)}, "
                f"or {DYNAMIC_INT8} for a draft"
            )
        if self.group_size not in QUANT_GROUP_SIZES:
            raise ValueError(
                f"group_size must be one of {', '.join(map(str, QUANT_GROUP_SIZES))}, got {self.group_size!r}"
            )
        if self.head is not None and self.head not in QUANTS:
            raise ValueError(
                f"unknown quantisation scheme {self.head!r} for the output head: use one of "
                f"{', '.join(QUANTS)}, or head=None for a float head"
            )
        if self.head is not None and self.scheme == DYNAMIC_INT8:
            raise ValueError(
                f"head={self.head!r} does not apply to {DYNAMIC_INT8}, whose output head is dynamic "
                "int8 already: drop head, or use the scheme 'int8' / 'int4'"
            )

    @classmethod
    def of(cls, value: QuantConfig | str | None) -> QuantConfig | None:
        """`value` as a QuantConfig: a scheme name alone ("int4") takes the default group size and a float head."""
        if value is None or isinstance(value, QuantConfig):
            return value
        if isinstance(value, str):
            return cls(value)
        raise ValueError(
            f"a quantisation must be a QuantConfig, a scheme name ({', '.join(DRAFT_QUANTS)}) or None, got {value!r}"
        )

    @property
    def dynamic(self) -> bool:
        """Dynamic int8 (torch.ao, draft only) rather than weight-only low-bit layers."""
        return self.scheme == DYNAMIC_INT8


@dataclass(frozen=True)
class EngineConfig:
    """Which models run where, and how.

    dtype / draft_dtype  float weights and activations (draft_dtype None: as dtype); with a quantised
                   model, the dtype of the layers left in float (embeddings, norms, output head).
    target_quant / draft_quant  None (float weights) or a QuantConfig (a scheme name alone, such as "int4",
                   is taken as QuantConfig("int4")): weight-only low-bit Linear layers on the CPU kernels
                   (engine.loading.quantize). A low-bit target is the target: SD and SSD are exact with respect
                   to the model loaded, not to its float weights. The draft may also be "int8-dynamic"
                   (dynamic int8 activations too: the fastest draft on CPU; q is whatever it computes, and
                   verification uses exactly that q).
    compile        None (eager forwards on the dynamic KV cache) or a CompileConfig (True: its defaults): every
                   model forward runs on a preallocated slot cache in fixed shapes, compiled once per shape
                   (engine.compiled; CUDA graphs on CUDA).
    tp             tensor-parallel ranks of the target (engine.tp): the engine starts tp - 1 more processes,
                   shards the target with transformers' tensor parallelism and feeds every rank the same
                   inputs; rank 0 (this process) samples and verifies.
    prefix_caching reuse the KV of prompt prefixes that earlier requests computed (engine.blocks), for the
                   target and the draft; eager forwards only.
    kv_cache_memory bytes the target's KV cache may take (None: it grows as needed): requests are admitted
                   against it, and one that could never fit is refused.
    """

    target: str
    draft: str | None = None
    strategy: Strategy = Strategy.AR
    speculative: SpeculativeConfig = SpeculativeConfig()
    dtype: str = "bfloat16"
    draft_dtype: str | None = None  # None: same as dtype
    device: str = "cpu"
    threads: int | None = None  # torch intra-op threads; None leaves torch's default
    chat_template: bool = True  # wrap text prompts in the tokenizer's chat template
    cache_dir: str | None = None  # where models are downloaded to / looked up (None: the default cache)
    target_quant: QuantConfig | None = None
    draft_quant: QuantConfig | None = None
    compile: CompileConfig | None = None
    tp: int = 1
    prefix_caching: bool = True
    kv_cache_memory: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "strategy", Strategy(self.strategy))
        for name in ("dtype", "draft_dtype"):
            value = getattr(self, name)
            if value is not None and value not in DTYPES:
                raise ValueError(f"{name} must be one of {', '.join(DTYPES)}, got {value!r}")
        object.__setattr__(self, "target_quant", QuantConfig.of(self.target_quant))
        object.__setattr__(self, "draft_quant", QuantConfig.of(self.draft_quant))
        object.__setattr__(self, "compile", CompileConfig.of(self.compile))
        if not isinstance(self.tp, int) or self.tp < 1:
            raise ValueError(f"tp (tensor-parallel ranks of the target) must be an integer >= 1, got {self.tp!r}")
        if self.kv_cache_memory is not None and (
            not isinstance(self.kv_cache_memory, int)
            or isinstance(self.kv_cache_memory, bool)
            or self.kv_cache_memory < 1
        ):
            raise ValueError(
                f"kv_cache_memory must be a number of bytes >= 1 (or None: no limit), got {self.kv_cache_memory!r}"
            )
        if self.tp > 1 and self.compile is not None:
            raise ValueError("compile and tp > 1 do not combine yet: drop one of them")
        if self.tp > 1 and self.target_quant is not None:
            raise ValueError(
                f"a tensor-parallel target shards float weights: drop target_quant "
                f"{self.target_quant.scheme} or use tp=1"
            )
        if self.target_quant is not None and self.target_quant.dynamic:
            raise ValueError(
                f"target_quant {DYNAMIC_INT8} is for the draft only: its activation scale spans the "
                "batch, so the target's distribution would depend on what shares it; use int8 or int4"
            )
        if self.draft_quant is not None and self.draft_quant.dynamic and self.draft_dtype not in (None, "float32"):
            raise ValueError(
                f"a dynamic int8 draft keeps its other layers in float32: drop "
                f"draft_dtype={self.draft_dtype!r} (or use draft_quant 'int8' / 'int4')"
            )
        if self.strategy is not Strategy.AR and self.draft is None:
            raise ValueError(f"strategy {self.strategy.value} needs a draft model: pass draft=...")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if self.strategy is Strategy.SSD and self.speculative.confidence_stop is not None:
            raise ValueError("confidence_stop is implemented for sd only; drop it for ssd (adaptive K works for both)")
        if self.target_quant is not None and not self.device.startswith("cpu"):
            raise ValueError(
                f"target_quant {self.target_quant.scheme} runs on CPU kernels only: use device='cpu' "
                f"or drop target_quant (got device={self.device!r})"
            )
        placement = self.speculative.placement
        own_device = placement.draft_device if self.strategy is Strategy.SSD and not placement.in_process else None
        draft_device = own_device or self.device
        if self.draft_quant is not None and self.strategy is not Strategy.AR and not draft_device.startswith("cpu"):
            raise ValueError(
                f"draft_quant {self.draft_quant.scheme} runs on CPU kernels only: put the draft on the CPU "
                f"(device / draft_device 'cpu') or drop draft_quant (the draft runs on {draft_device!r})"
            )

    @property
    def draft_float_dtype(self) -> str:
        """The draft's float dtype: all of it, or, quantised, the layers left in float (float32 for dynamic int8)."""
        dynamic = self.draft_quant is not None and self.draft_quant.dynamic
        return "float32" if dynamic else self.draft_dtype or self.dtype


# -- arguments removed from the API, kept working for one minor version --------------------------------------
# LLM's low-bit arguments before QuantConfig. Each still works until REMOVED_IN, with a DeprecationWarning that
# names its replacement; given beside its replacement at another value, it is a ValueError.
DEPRECATED_IN, REMOVED_IN = "0.2.0", "0.3.0"
REMOVED_QUANT_ARGUMENTS: dict[str, str] = {
    "draft_int8": f"draft_quant={DYNAMIC_INT8!r}",
    "quant_group_size": "target_quant / draft_quant=QuantConfig(scheme, group_size=N)",
    "target_head_quant": "target_quant=QuantConfig(scheme, head=...)",
    "draft_head_quant": "draft_quant=QuantConfig(scheme, head=...)",
}


def _deprecation_message(caller: str, name: str) -> str:
    return (
        f"{caller}({name}=...) is deprecated since {DEPRECATED_IN} and will be removed in {REMOVED_IN}: "
        f"use {REMOVED_QUANT_ARGUMENTS[name]}"
    )


def _scheme(value: QuantConfig | str | None) -> str | None:
    return value.scheme if isinstance(value, QuantConfig) else value


def replace_removed_quant_arguments(
    target_quant: QuantConfig | str | None,
    draft_quant: QuantConfig | str | None,
    removed: dict[str, object],
    caller: str = "LLM",
) -> tuple[QuantConfig | None, QuantConfig | None, list[str]]:
    """target_quant and draft_quant with the removed arguments in `removed` folded in, and a deprecation message
    for each of them (the caller warns, so that the warning points at its own caller).

    draft_int8=True is draft_quant="int8-dynamic" (False asks for nothing); quant_group_size sets the group of
    both quantisations given; target_head_quant / draft_head_quant set that model's QuantConfig head and need
    its quantisation. A name that never was an argument is a TypeError, as Python raises for it."""
    unknown = sorted(set(removed) - set(REMOVED_QUANT_ARGUMENTS))
    if unknown:
        raise TypeError(f"{caller}() got an unexpected keyword argument {unknown[0]!r}")
    messages = [_deprecation_message(caller, name) for name in REMOVED_QUANT_ARGUMENTS if name in removed]
    if removed.get("draft_int8"):
        if draft_quant is not None and _scheme(draft_quant) != DYNAMIC_INT8:
            raise ValueError(
                f"draft_int8=True means draft_quant={DYNAMIC_INT8!r}, which conflicts with "
                f"draft_quant={draft_quant!r}: give only draft_quant"
            )
        draft_quant = draft_quant if draft_quant is not None else DYNAMIC_INT8
    target, draft = QuantConfig.of(target_quant), QuantConfig.of(draft_quant)
    group = removed.get("quant_group_size")
    if group is not None:
        if group not in QUANT_GROUP_SIZES:
            raise ValueError(f"quant_group_size must be one of {', '.join(map(str, QUANT_GROUP_SIZES))}, got {group!r}")
        for model, given in (("target", target_quant), ("draft", draft_quant)):
            if isinstance(given, QuantConfig) and given.group_size != group:
                raise ValueError(
                    f"quant_group_size={group} conflicts with {model}_quant={given!r}: give only "
                    f"{model}_quant's group_size"
                )
        target = None if target is None else replace(target, group_size=group)
        draft = None if draft is None else replace(draft, group_size=group)
    out = {}
    for model, quant in (("target", target), ("draft", draft)):
        head = removed.get(f"{model}_head_quant")
        if head is not None:
            if not isinstance(head, str):
                raise ValueError(f"{model}_head_quant must be 'int8' or 'int4', got {head!r}")
            if quant is None:
                raise ValueError(
                    f"{model}_head_quant={head!r} needs {model}_quant 'int8' or 'int4' (got None): set "
                    f"{model}_quant=QuantConfig(scheme, head={head!r})"
                )
            if quant.head is not None and quant.head != head:
                raise ValueError(
                    f"{model}_head_quant={head!r} conflicts with {model}_quant={quant!r}: give only "
                    f"{model}_quant's head"
                )
            quant = replace(quant, head=head)  # QuantConfig checks the head against the scheme
        out[model] = quant
    return out["target"], out["draft"], messages

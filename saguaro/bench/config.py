"""What one `saguaro bench` invocation runs: the configuration and the sweep grid it expands to.

A *variant* is one system with one setting of every swept axis (K, fan-out budget and schedule, C,
backup, temperature, batch size, and for this engine's systems eager or compiled forwards). Axes that do not apply to a
system are left out of its variant (AR has no K; only SSD has a fan-out and a backup), and C collapses to 1 at
temperature 0, where Saguaro sampling changes nothing, so the grid holds no duplicate runs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from saguaro.bench.prompts import PROMPT_ORDERS
from saguaro.commands.values import AUTO  # -K auto: adaptive K (SD and SSD), K_min..AUTO_K_MAX each round
from theory import integer_fanout, uniform_fanout
from theory.glossary import Backup

OURS = ("ar", "sd", "ssd")
PEERS = ("hf", "hf-assisted", "llamacpp", "llamacpp-lookup")
SYSTEMS = OURS + PEERS
DEFAULT_SYSTEMS = OURS + ("hf", "hf-assisted")  # llama.cpp is an optional extra: asked for by name
SPECULATIVE = ("sd", "ssd", "hf-assisted")
SCHEDULES = ("uniform", "geometric")
BACKUPS = tuple(b.value for b in Backup if b is not Backup.AUTO)
DTYPES = ("auto", "float32", "bfloat16", "float16")  # auto: engine.loading.devices.resolve_dtype, when the run starts
ORDERS = ("interleaved", "grouped")
SAMPLING_MODES = ("standard", "invariant")  # engine.sampling_params.SamplingMode
AUTO_K_MAX = 8  # engine.config.AUTO_K_MAX (tests/saguaro/test_cli_defaults.py checks they agree)


def known_fields(cls: type, data: dict) -> dict:
    """`data` (a run folder's config.json) when each of its keys is a field of the dataclass `cls`."""
    unknown = set(data) - {f.name for f in fields(cls)}
    if unknown:
        raise ValueError(f"config.json has unknown fields {sorted(unknown)}: was it written by another version?")
    return data


@dataclass(frozen=True)
class Settings:
    """One point of the sweep for one system; None = the axis does not apply to that system."""

    temperature: float
    batch: int
    K: int | None = None
    C: float | None = None
    budget: int | str | None = None  # B = Σ F_k (SSD), or "auto": sized by the engine at run time
    schedule: str | None = None  # "uniform", "geometric" or "explicit" (SSD)
    fanout: tuple[int, ...] | None = None  # F_0..F_K (SSD)
    backup: str | None = None  # SSD's backup on a cache miss
    # SD only (None elsewhere): adaptive K (K is then the largest, AUTO_K_MAX), its smallest K and fixed
    # draft cost, and the confidence stop
    adaptive: bool | None = None
    K_min: int | None = None
    draft_cost: float | None = None
    confidence_stop: float | None = None
    compiled: bool | None = None  # ar, sd, ssd: compiled forwards on the static KV cache (None: not ours)
    sampling_mode: str | None = None  # ar, sd, ssd: "invariant" (drafter-invariant sampling); None: standard

    def label(self) -> str:
        parts = []
        if self.adaptive:
            parts.append(
                "K=auto"
                + (f" K_min={self.K_min}" if self.K_min not in (None, 1) else "")
                + (f" cost={self.draft_cost:g}" if self.draft_cost is not None else "")
            )
        elif self.K is not None:
            parts.append(f"K={self.K}")
        if self.confidence_stop is not None:
            parts.append(f"stop={self.confidence_stop:g}")
        if self.fanout is not None or self.budget == "auto":
            parts.append(
                f"B={self.budget} {self.schedule}"
                if self.schedule != "explicit"
                else "F=" + "-".join(map(str, self.fanout))
            )
        if self.C is not None and self.C != 1.0:
            parts.append(f"C={self.C:g}")
        if self.backup is not None:
            parts.append(self.backup)
        parts.append(f"T={self.temperature:g}")
        parts.append(f"b={self.batch}")
        if self.compiled:
            parts.append("compiled")
        if self.sampling_mode == "invariant":
            parts.append("invariant")
        return " ".join(parts)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["fanout"] = list(self.fanout) if self.fanout is not None else None
        return out

    def speculative_kwargs(self) -> dict:
        """K and the adaptive settings as engine.SpeculativeConfig takes them (K="auto" when adaptive)."""
        out: dict = {"K": AUTO if self.adaptive else self.K}
        if self.K_min is not None:
            out["K_min"] = self.K_min
        if self.draft_cost is not None:
            out["draft_cost"] = self.draft_cost
        if self.confidence_stop is not None:
            out["confidence_stop"] = self.confidence_stop
        return out


@dataclass(frozen=True)
class Variant:
    system: str
    settings: Settings

    @property
    def key(self) -> str:
        """Unique within a run: what results.jsonl and rounds.jsonl are keyed by."""
        return f"{self.system} {self.settings.label()}"


def matches(pattern: str, key: str) -> bool:
    """Whether a --only pattern picks a variant: each of its space-separated words is one of the key's words
    ("ssd K=3 B=8" picks "ssd K=3 B=8 uniform neural T=0 b=1"; "sd" picks SD's variants, not SSD's)."""
    return set(pattern.split()) <= set(key.split())


def _positive_ints(name: str, values: tuple, minimum: int = 1, allow_empty: bool = False) -> None:
    if not values and not allow_empty:
        raise ValueError(f"give at least one value for {name}")
    if any(not isinstance(v, int) or v < minimum for v in values):
        raise ValueError(f"{name} must be integers >= {minimum}, got {list(values)}")


@dataclass(frozen=True)
class BenchConfig:
    """Everything that decides what is measured; saved as config.json in the run folder.

    `target` / `draft` are model specs for engine.loading.models.load_model (aliases, folders, GGUF files);
    tests hand Bench already-built models instead and put a description here.
    `fanout_alpha` / `fanout_r`: the α and r from which the geometric schedule (Thm 12's integer
    optimum) is computed for each (K, budget).
    """

    target: str = "qwen-coder-1.5b"
    draft: str = "qwen-coder-0.5b"
    prompts: str = "spec_bench"
    n_prompts: int = 20
    categories: tuple[str, ...] = ()
    prompt_order: str = "round-robin"  # or "file": the first n prompts in file order
    max_new_tokens: int = 128
    stop_on_eos: bool = True
    systems: tuple[str, ...] = DEFAULT_SYSTEMS
    Ks: tuple[int | str, ...] = (4,)  # "auto": adaptive K (sd, ssd; hf-assisted: transformers' own default)
    budgets: tuple[int, ...] = (12,)
    schedules: tuple[str, ...] = ("uniform",)
    fanout: tuple[int, ...] | None = None  # an explicit F_0..F_K instead of budgets × schedules
    fanout_alpha: float = 0.8
    fanout_r: float = 1.0
    Cs: tuple[float, ...] = (1.0,)
    backups: tuple[str, ...] = ("neural",)
    temperatures: tuple[float, ...] = (0.0,)
    batch_sizes: tuple[int, ...] = (1,)
    dtype: str = "auto"  # a run folder's config has the dtype auto resolved to (runner.start)
    draft_dtype: str | None = None
    draft_int8: bool = False
    target_quant: str | None = None  # "int8" / "int4": weight-only low-bit target (engine.config.EngineConfig)
    draft_quant: str | None = None  # the same for the draft, or "int8-dynamic" (what --draft-int8 means)
    quant_group_size: int = 32
    target_head_quant: str | None = None  # "int8" / "int4": the low-bit target's output head too
    draft_head_quant: str | None = None
    threads: int | None = None
    seed: int = 0
    warmup: int = 1  # warm-up calls per variant, excluded from the results
    warmup_tokens: int = 16
    order: str = "interleaved"  # or "grouped": one variant after another, each engine closed when done
    K_min: int = 1  # -K auto: the smallest K it may choose
    draft_cost: float | None = None  # -K auto: T_d / T_v fixed instead of measured
    confidence_stop: float | None = None  # sd: stop drafting below this draft top probability
    compiled: tuple[bool, ...] = (False,)  # ar, sd, ssd: eager and / or compiled forwards (--compile off on)
    compile_max_len: int = 2048  # tokens per row of the compiled engines' static KV cache
    only: tuple[str, ...] = ()  # keep the grid's variants some of these match (`matches`); () = all of them
    sampling_modes: tuple[str, ...] = ("standard",)  # ar, sd, ssd at T > 0: standard and / or invariant

    def __post_init__(self) -> None:
        for name in (
            "only",
            "systems",
            "categories",
            "Ks",
            "budgets",
            "schedules",
            "Cs",
            "backups",
            "temperatures",
            "batch_sizes",
            "compiled",
            "sampling_modes",
        ):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if not self.sampling_modes or set(self.sampling_modes) - set(SAMPLING_MODES):
            raise ValueError(
                f"sampling modes must be among {', '.join(SAMPLING_MODES)}, got {list(self.sampling_modes)}"
            )
        if self.fanout is not None:
            object.__setattr__(self, "fanout", tuple(int(f) for f in self.fanout))
        unknown = set(self.systems) - set(SYSTEMS)
        if unknown or not self.systems:
            raise ValueError(f"unknown systems {sorted(unknown)}; choose from {', '.join(SYSTEMS)}")
        _positive_ints("K (-K)", tuple(k for k in self.Ks if k != AUTO), allow_empty=True)
        if not self.Ks:
            raise ValueError("give at least one value for -K")
        _positive_ints("fan-out budget (--budget)", tuple(b for b in self.budgets if b != "auto"), allow_empty=True)
        _positive_ints("batch size (--batch)", self.batch_sizes)
        if not self.compiled or any(not isinstance(c, bool) for c in self.compiled):
            raise ValueError(f"--compile takes off and / or on, got {list(self.compiled)}")
        if True in self.compiled and not set(OURS) & set(self.systems):
            raise ValueError("--compile on applies to this engine's systems: add ar, sd or ssd to --systems")
        if self.compile_max_len < 2:
            raise ValueError(f"--max-len must be >= 2 tokens per row, got {self.compile_max_len}")
        if not isinstance(self.K_min, int) or not 1 <= self.K_min <= AUTO_K_MAX:
            raise ValueError(f"--K-min must be a whole number in 1..{AUTO_K_MAX}, got {self.K_min!r}")
        if (self.K_min != 1 or self.draft_cost is not None) and AUTO not in self.Ks:
            raise ValueError("--K-min and --draft-cost set what -K auto does: add auto to -K, or drop them")
        if self.draft_cost is not None and not self.draft_cost >= 0:
            raise ValueError(f"--draft-cost (T_d / T_v) must be >= 0, got {self.draft_cost}")
        if self.confidence_stop is not None and not 0 < self.confidence_stop <= 1:
            raise ValueError(f"--confidence-stop must be a probability in (0, 1], got {self.confidence_stop}")
        if AUTO in self.Ks and not {"sd", "ssd"} & set(self.systems):
            raise ValueError("-K auto is implemented for sd and ssd only: add sd or ssd to --systems")
        if self.confidence_stop is not None and "sd" not in self.systems:
            raise ValueError("--confidence-stop is implemented for sd only: add sd to --systems")
        for name, given, allowed in (
            ("schedule", self.schedules, SCHEDULES),
            ("backup", self.backups, BACKUPS),
            ("dtype", (self.dtype,), DTYPES),
        ):
            bad = set(given) - set(allowed)
            if bad or not given:
                raise ValueError(f"unknown {name} {sorted(bad)}; choose from {', '.join(allowed)}")
        if self.target_quant not in (None, "int8", "int4"):
            raise ValueError(f"target_quant must be int8, int4 or unset (float weights), got {self.target_quant!r}")
        if self.draft_quant not in (None, "int8", "int4", "int8-dynamic"):
            raise ValueError(f"draft_quant must be int8, int4, int8-dynamic or unset, got {self.draft_quant!r}")
        for name, head, body in (
            ("target", self.target_head_quant, self.target_quant),
            ("draft", self.draft_head_quant, self.draft_quant),
        ):
            if head is not None and (head not in ("int8", "int4") or body not in ("int8", "int4")):
                raise ValueError(
                    f"--{name}-head-quant takes int8 or int4 and needs --{name}-quant int8 or int4 "
                    f"(got head {head!r}, weights {body!r})"
                )
        if self.draft_int8 and self.draft_quant not in (None, "int8-dynamic"):
            raise ValueError(
                "--draft-int8 means --draft-quant int8-dynamic; drop one of them "
                f"(got --draft-quant {self.draft_quant})"
            )
        if self.quant_group_size not in (32, 64, 128):
            raise ValueError(f"--quant-group-size must be 32, 64 or 128, got {self.quant_group_size}")
        if self.draft_dtype is not None and self.draft_dtype not in DTYPES:
            raise ValueError(f"unknown draft dtype {self.draft_dtype!r}; choose from {', '.join(DTYPES)}")
        if not self.Cs or any(not 0 < c <= 1 for c in self.Cs):
            raise ValueError(f"C (Saguaro constant) must be in (0, 1], got {list(self.Cs)}")
        if not self.temperatures or any(not t >= 0 for t in self.temperatures):
            raise ValueError(f"temperatures must be >= 0 (0 = greedy), got {list(self.temperatures)}")
        if self.n_prompts < 1 or self.max_new_tokens < 1:
            raise ValueError("--num-prompts and --max-new-tokens must be >= 1")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if self.prompt_order not in PROMPT_ORDERS:
            raise ValueError(f"unknown prompt order {self.prompt_order!r}; choose from {', '.join(PROMPT_ORDERS)}")
        if self.order not in ORDERS:
            raise ValueError(f"unknown order {self.order!r}; choose from {', '.join(ORDERS)}")
        if self.warmup < 0 or self.warmup_tokens < 1:
            raise ValueError("warm-up calls must be >= 0 and warm-up tokens >= 1")
        if not 0 < self.fanout_alpha < 1 or not self.fanout_r > 0:
            raise ValueError("the geometric schedule needs 0 < --fanout-alpha < 1 and --fanout-r > 0")
        if any(not isinstance(o, str) or not o.split() for o in self.only):
            raise ValueError(
                f"--only takes variant keys or parts of them (e.g. 'ssd K=3 B=8 uniform'), got {list(self.only)}"
            )
        if self.fanout is not None:
            if (
                len(self.Ks) != 1
                or self.Ks[0] == AUTO
                or len(self.fanout) != self.Ks[0] + 1
                or min(self.fanout) < 0
                or sum(self.fanout) < 1
            ):
                raise ValueError(
                    f"an explicit --fanout needs one K and K+1 non-negative guesses F_0..F_K, "
                    f"got K={list(self.Ks)} and fanout {list(self.fanout)}"
                )
        if self.only:
            self.grid()  # a pattern that picks nothing is refused now, not after the models have loaded

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict) -> BenchConfig:
        return cls(**known_fields(cls, data))

    def schedules_for(self, K: int) -> list[tuple[int, str, tuple[int, ...]]]:
        """(budget, schedule name, F_0..F_K) for each SSD fan-out to run at lookahead K; F is None for the
        budget "auto" (the engine sizes it at run time, each round's schedule is in its records)."""
        if self.fanout is not None:
            return [(sum(self.fanout), "explicit", self.fanout)]
        out = []
        for B in self.budgets:
            for name in self.schedules:
                if B == "auto":
                    out.append((B, name, None))
                    continue
                if name == "uniform":
                    F = uniform_fanout(K, B)
                else:
                    F = integer_fanout(self.fanout_alpha, self.fanout_r, K, B)
                out.append((B, name, tuple(int(f) for f in F)))
        return out

    def grid(self) -> tuple[list[Variant], list[tuple[Variant, str]]]:
        """The variants to run, and those that cannot run with the reason (transformers' assisted
        generation handles batch 1 only)."""
        variants: list[Variant] = []
        skipped: list[tuple[Variant, str]] = []
        for system in self.systems:
            for T in self.temperatures:
                Cs = (1.0,) if T == 0 else self.Cs
                for b in self.batch_sizes:
                    for s in self._modes(system, T, self._compiled(system, self._settings(system, T, b, Cs))):
                        v = Variant(system, s)
                        if v in variants or v in (x for x, _ in skipped):
                            continue
                        if s.adaptive and system not in ("sd", "ssd", "hf-assisted"):
                            skipped.append((v, "-K auto (adaptive K) is implemented for sd and ssd only"))
                        elif system == "hf-assisted" and b > 1:
                            skipped.append((v, "transformers' assisted generation supports batch size 1 only"))
                        elif system.startswith("llamacpp") and b > 1:
                            skipped.append((v, "the llama.cpp peer runs batch size 1 only"))
                        else:
                            variants.append(v)
        if self.only:
            every = [v.key for v in variants] + [v.key for v, _ in skipped]
            missing = [o for o in self.only if not any(matches(o, key) for key in every)]
            if missing:
                keys = "; ".join(v.key for v in variants) or "none"
                raise ValueError(
                    f"--only {missing[0]!r} matches no variant of the grid the other flags give "
                    f"({keys}): widen the axes (-K, --budget, --schedule, ...) or fix the pattern"
                )
            variants = [v for v in variants if any(matches(o, v.key) for o in self.only)]
            skipped = [(v, why) for v, why in skipped if any(matches(o, v.key) for o in self.only)]
        return variants, skipped

    def _modes(self, system: str, T: float, settings: list[Settings]) -> list[Settings]:
        """Each setting of one of this engine's systems once per --sampling-mode (at T = 0 both are the argmax: once;
        the peers sample as they do)."""
        if system not in OURS or T == 0:
            return settings
        return [replace(s, sampling_mode=None if m == "standard" else m) for s in settings for m in self.sampling_modes]

    def _compiled(self, system: str, settings: list[Settings]) -> list[Settings]:
        """Each setting of one of this engine's systems once per --compile value (the peers: as they are)."""
        if system not in OURS:
            return settings
        return [replace(s, compiled=True) if c else s for s in settings for c in self.compiled]

    def _settings(self, system: str, T: float, b: int, Cs: tuple[float, ...]) -> list[Settings]:
        if system in ("ar", "hf", "llamacpp", "llamacpp-lookup"):  # no K, budget or C of ours
            return [Settings(T, b)]
        fixed = [K for K in self.Ks if K != AUTO]
        # a system without adaptive K gets one placeholder variant for -K auto, listed as skipped by grid()
        placeholder = [Settings(T, b, K=AUTO_K_MAX, adaptive=True)] if AUTO in self.Ks else []
        if system == "hf-assisted":
            return [Settings(T, b, K=K) for K in fixed] + placeholder
        if system == "sd":
            sd = {"K_min": self.K_min, "draft_cost": self.draft_cost}
            stop = self.confidence_stop
            return [Settings(T, b, K=K, C=C, confidence_stop=stop) for K in fixed for C in Cs] + [
                Settings(T, b, K=AUTO_K_MAX, C=C, adaptive=True, confidence_stop=stop, **sd)
                for C in Cs
                if AUTO in self.Ks
            ]
        # ssd -K auto: K_max = AUTO_K_MAX; a fan-out given for K_max serves a shorter K as F_0..F_{K-1}, F_{K_max}
        auto = {"K_min": self.K_min, "draft_cost": self.draft_cost, "adaptive": True}
        return [
            Settings(T, b, K=K, C=C, budget=B, schedule=name, fanout=F, backup=backup)
            for K in fixed
            for B, name, F in self.schedules_for(K)
            for C in Cs
            for backup in self.backups
        ] + [
            Settings(T, b, K=AUTO_K_MAX, C=C, budget=B, schedule=name, fanout=F, backup=backup, **auto)
            for B, name, F in (self.schedules_for(AUTO_K_MAX) if AUTO in self.Ks else [])
            for C in Cs
            for backup in self.backups
        ]

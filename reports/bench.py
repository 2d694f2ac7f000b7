"""Side-by-side benchmark of this engine's strategies and transformers' peers on real prompts.

Every system uses the same model objects (so the same dtypes and weights) and the same thread
count; systems are interleaved prompt by prompt so that machine drift hits all alike; a warm-up
prompt per system is run first and excluded.
"""

from __future__ import annotations

import logging
import platform
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from statistics import median

import torch

from engine import LLM, SamplingParams, SpeculativeConfig
from reports.peers import hf_generate
from reports.prompts import Prompt, load_prompts

log = logging.getLogger(__name__)

OURS = ("ar", "sd")
PEERS = ("hf", "hf-assisted")
SYSTEMS = OURS + PEERS
SPECULATIVE = ("sd", "hf-assisted")


@dataclass(frozen=True)
class BenchConfig:
    target: str = "qwen-coder-1.5b"
    draft: str = "qwen-coder-0.5b"
    prompts: str = "spec_bench"
    n_prompts: int = 20
    categories: tuple[str, ...] = ()
    max_new_tokens: int = 128
    temperature: float = 0.0
    systems: tuple[str, ...] = SYSTEMS
    Ks: tuple[int, ...] = (4,)
    C: float = 1.0
    dtype: str = "bfloat16"
    draft_dtype: str | None = None
    draft_int8: bool = False
    threads: int | None = None
    seed: int = 0
    warmup: int = 1

    def __post_init__(self) -> None:
        unknown = set(self.systems) - set(SYSTEMS)
        if unknown:
            raise ValueError(f"unknown systems {sorted(unknown)}; choose from {', '.join(SYSTEMS)}")
        if not self.Ks or min(self.Ks) < 1:
            raise ValueError(f"K values must be >= 1, got {self.Ks}")

    def variants(self) -> list[tuple[str, int | None]]:
        """(system, K) pairs: speculative systems once per K."""
        return [(s, K) for s in self.systems for K in (self.Ks if s in SPECULATIVE else (None,))]


@dataclass
class Result:
    system: str
    K: int | None
    prompt_id: str
    category: str
    new_tokens: int
    seconds: float
    accepted_hist: dict[int, int] = field(default_factory=dict)
    token_ids: list[int] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.system if self.K is None else f"{self.system} K={self.K}"


class Bench:
    """Loads the models once and runs every (system, K) on each prompt."""

    def __init__(self, config: BenchConfig):
        self.config = config
        if config.threads:
            torch.set_num_threads(config.threads)
        self.prompts: list[Prompt] = load_prompts(config.prompts, config.n_prompts, list(config.categories) or None)
        from engine.models import int8_dynamic, load_model
        from engine.llm import TORCH_DTYPES

        target = load_model(config.target, dtype=TORCH_DTYPES[config.dtype])
        self.target, self.tokenizer = target.model, target.tokenizer
        self.draft = None
        if any(s in SPECULATIVE for s in config.systems):
            draft = load_model(config.draft, dtype=TORCH_DTYPES[config.draft_dtype or config.dtype])
            self.draft = int8_dynamic(draft.model) if config.draft_int8 else draft.model
        self.params = SamplingParams(
            temperature=config.temperature, max_new_tokens=config.max_new_tokens, seed=config.seed
        )
        self.engines = {
            (s, K): LLM(
                self.target, self.draft if s != "ar" else None, strategy=s, tokenizer=self.tokenizer,
                speculative=SpeculativeConfig(K=K or 1, C=config.C),
            )
            for s, K in config.variants()
            if s in OURS
        }
        any_engine = next(iter(self.engines.values()), None) or LLM(self.target, tokenizer=self.tokenizer)
        self.encode, self.eos_ids, self.pad_id = any_engine.encode, any_engine.eos_ids, any_engine.pad_id

    def run_one(self, system: str, K: int | None, prompt: Prompt) -> Result:
        ids = self.encode(prompt.text)
        if system in OURS:
            out = self.engines[(system, K)].generate([ids], self.params)
            o = out[0]
            return Result(system, K, prompt.id, prompt.category, len(o.token_ids), out.metrics.wall_s,
                          dict(out.metrics.accepted_hist), o.token_ids)
        assistant = self.draft if system == "hf-assisted" else None
        new, seconds = hf_generate(self.target, ids, self.params, self.eos_ids, self.pad_id, assistant, K)
        return Result(system, K, prompt.id, prompt.category, len(new), seconds, {}, new)

    def run(self, progress: bool = True) -> list[Result]:
        from tqdm import tqdm

        variants = self.config.variants()
        for prompt in self.prompts[: self.config.warmup]:
            for system, K in variants:
                self.run_one(system, K, prompt)
        results = []
        bar = tqdm(total=len(self.prompts) * len(variants), disable=not progress, desc="bench", unit="run")
        for prompt in self.prompts:
            for system, K in variants:
                results.append(self.run_one(system, K, prompt))
                bar.update()
        bar.close()
        return results


def machine() -> dict:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }


def alpha_from_hist(hist: Counter, K: int) -> float:
    accepted = sum(k * c for k, c in hist.items())
    rejections = sum(c for k, c in hist.items() if k < K)
    return accepted / (accepted + rejections) if accepted + rejections else float("nan")


def summarize(results: list[Result]) -> list[dict]:
    """One row per (system, K): tokens/s (total and median per prompt), ratios, α, mean accepted."""
    by_label: dict[str, list[Result]] = defaultdict(list)
    for r in results:
        by_label[r.label].append(r)
    rows = []
    for label, rs in by_label.items():
        tokens, seconds = sum(r.new_tokens for r in rs), sum(r.seconds for r in rs)
        hist: Counter = Counter()
        for r in rs:
            hist.update({int(k): v for k, v in r.accepted_hist.items()})
        n_rounds = sum(hist.values())
        rows.append({
            "system": label, "prompts": len(rs), "tokens": tokens, "seconds": seconds,
            "tokens_per_s": tokens / seconds if seconds else 0.0,
            "median_tokens_per_s": median(r.new_tokens / r.seconds for r in rs if r.seconds > 0),
            "alpha": alpha_from_hist(hist, rs[0].K) if n_rounds else None,
            "mean_accepted": sum(k * c for k, c in hist.items()) / n_rounds if n_rounds else None,
        })
    base = {r["system"]: r["tokens_per_s"] for r in rows}
    for row in rows:
        for ref in ("ar", "hf"):
            if ref in base and base[ref]:
                row[f"vs_{ref}"] = row["tokens_per_s"] / base[ref]
    return rows


def by_category(results: list[Result]) -> list[dict]:
    """α and mean accepted length per prompt category for each speculative (system, K)."""
    groups: dict[tuple[str, str], Counter] = defaultdict(Counter)
    Ks: dict[str, int] = {}
    for r in results:
        if r.accepted_hist:
            groups[(r.label, r.category)].update({int(k): v for k, v in r.accepted_hist.items()})
            Ks[r.label] = r.K
    rows = []
    for (label, category), hist in sorted(groups.items()):
        n = sum(hist.values())
        rows.append({
            "system": label, "category": category, "rounds": n,
            "alpha": alpha_from_hist(hist, Ks[label]),
            "mean_accepted": sum(k * c for k, c in hist.items()) / n,
            "tokens_per_round": 1 + sum(k * c for k, c in hist.items()) / n,
        })
    return rows


def as_dict(config: BenchConfig, results: list[Result]) -> dict:
    return {
        "config": asdict(config),
        "machine": machine(),
        "summary": summarize(results),
        "by_category": by_category(results),
        "results": [asdict(r) for r in results],
    }

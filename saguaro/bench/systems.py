"""The systems under test, all on one set of model objects: this engine's AR, SD and SSD through `LLM`,
transformers' `generate` and assisted generation as peers, and llama.cpp (`llamacpp`, `llamacpp-lookup`)
on the GGUF file the target was provisioned from.

Every system gets the same target and draft objects (so the same weights, dtypes and quantisation)
and runs under the same torch thread count; llama.cpp gets that many threads and the same prompt token
ids (our tokenizer and chat template). A strategy the engine does not offer (yet) raises ValueError when
its `LLM` is built; that variant is then reported as unavailable, with the reason. So is llama.cpp when
llama-cpp-python is not installed (the optional extra `llamacpp`), or at a batch size above 1.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import torch

from engine import LLM, SamplingParams, SpeculativeConfig
from engine.compile_config import CompileConfig
from engine.config import DYNAMIC_INT8, QuantConfig
from saguaro.bench.config import BenchConfig, Variant
from saguaro.bench.peers import (
    LLAMACPP_SYSTEMS,
    LOOKUP_NUM_PRED_TOKENS,
    LlamaCppPeer,
    gguf_path,
    hf_generate,
    llamacpp_missing,
)
from saguaro.bench.prompts import Prompt

log = logging.getLogger(__name__)


@dataclass
class Models:
    """The target, the draft (None when no system needs one) and the tokenizer (None: token-id prompts).

    `dtype` / `draft_dtype` / `draft_quant` say how they were loaded and `draft_spec` from where: SSD's
    draft worker loads the draft in its own process by that recipe (an int8 model object cannot be sent to
    it); without a `draft_spec` (models built in memory) the worker gets the draft object's weights.
    """

    target: torch.nn.Module
    draft: torch.nn.Module | None
    tokenizer: object | None = None
    dtype: str = "float32"
    draft_dtype: str = "float32"
    draft_spec: str | None = None
    draft_quant: QuantConfig | None = None  # low-bit: SSD's worker quantises the draft it loads by this recipe

    @classmethod
    def load(cls, config: BenchConfig) -> Models:
        from engine.loading.devices import TORCH_DTYPES
        from engine.loading.models import load_model, load_quantized

        def load(spec: str, dtype: str, quant: QuantConfig | None):
            if quant is None:
                return load_model(spec, dtype=TORCH_DTYPES[dtype])
            # low-bit (from the low-bit cache when it has the model); float layers in `dtype`
            return load_quantized(spec, quant, dtype=TORCH_DTYPES[dtype])

        def quant(scheme: str | None, head: str | None) -> QuantConfig | None:
            return None if scheme is None else QuantConfig(scheme, config.quant_group_size, head)

        target = load(config.target, config.dtype, quant(config.target_quant, config.target_head_quant))
        draft_scheme = config.draft_quant or (DYNAMIC_INT8 if config.draft_int8 else None)  # --draft-int8: the same
        draft_quant = quant(draft_scheme, config.draft_head_quant)
        dtype = "float32" if draft_quant is not None and draft_quant.dynamic else config.draft_dtype or config.dtype
        draft = None
        if any(s in ("sd", "ssd", "hf-assisted") for s in config.systems):
            draft = load(config.draft, dtype, draft_quant).model
        return cls(
            target.model,
            draft,
            target.tokenizer,
            config.dtype,
            dtype,
            config.draft if draft is not None else None,
            draft_quant,
        )


@dataclass
class CallOutput:
    """One generate call over a batch: per-request figures, the call's wall time, round records."""

    requests: list[dict]
    wall_s: float
    rounds: list[dict]
    threads: int | None = None  # torch threads of the process that ran the target


class Systems:
    """Builds each engine once (keyed by strategy and speculation settings) and runs batches on it.

    Threads: every system runs the target with the run's thread count, except SSD, whose engine gives
    the draft worker its own core(s) and the target the rest (the SSD layout: draft on separate hardware).
    Building an SSD engine changes torch's global thread count, so each call sets its own first.
    """

    def __init__(self, models: Models, config: BenchConfig):
        self.models = models
        self.config = config
        self._engines: dict[tuple, LLM] = {}
        self._threads: dict[tuple, int] = {}
        self._unavailable: dict[tuple, str | None] = {}
        self._llamacpp: dict[str, LlamaCppPeer] = {}  # loaded once per system, shared by its variants
        # encodes text for the peers (with the same chat template) and knows EOS and padding
        self.encoder = LLM(models.target, tokenizer=models.tokenizer, threads=config.threads)
        self.base_threads = torch.get_num_threads()

    @staticmethod
    def engine_key(v: Variant) -> tuple:
        s = v.settings
        if v.system == "ssd" and s.budget == "auto":
            return (v.system, s.K, s.C, "auto", s.schedule, s.backup, s.adaptive, s.K_min, s.draft_cost, s.compiled)
        if v.system in ("sd", "ssd"):
            return (
                v.system,
                s.K,
                s.C,
                s.fanout,
                s.backup,
                s.adaptive,
                s.K_min,
                s.draft_cost,
                s.confidence_stop,
                s.compiled,
            )
        return (v.system, s.compiled)

    def _engine(self, v: Variant) -> LLM:
        key = self.engine_key(v)
        if key not in self._engines:
            s, m = v.settings, self.models
            spec = (
                SpeculativeConfig(C=s.C, fanout=s.fanout, backup=s.backup or "neural", **s.speculative_kwargs())
                if s.K
                else None
            )
            if v.system == "ssd" and s.budget == "auto":  # sized by the engine from its measured timings
                spec = SpeculativeConfig(
                    C=s.C, backup=s.backup or "neural", budget="auto", schedule=s.schedule, **s.speculative_kwargs()
                )
            ssd = v.system == "ssd"
            # SD uses the (possibly low-bit) object as it is; SSD's worker loads the draft by its recipe and
            # quantises it there (a low-bit object cannot travel), unless the draft was built in memory
            by_recipe = ssd and m.draft_spec is not None
            draft = None if v.system == "ar" else m.draft_spec if by_recipe else m.draft
            try:
                self._engines[key] = LLM(
                    m.target,
                    draft,
                    strategy=v.system,
                    speculative=spec,
                    tokenizer=m.tokenizer,
                    threads=None if ssd else self.config.threads,
                    dtype=m.dtype,
                    draft_dtype=m.draft_dtype,
                    draft_quant=m.draft_quant if by_recipe else None,
                    compile=CompileConfig(max_len=self.config.compile_max_len) if s.compiled else None,
                )
                self._threads[key] = torch.get_num_threads()
            finally:
                torch.set_num_threads(self.base_threads)
        return self._engines[key]

    def _llamacpp_peer(self, v: Variant) -> LlamaCppPeer:
        """llama.cpp on the target's GGUF, loaded at the first use, with the target's thread count."""
        if v.system not in self._llamacpp:
            lookup = LOOKUP_NUM_PRED_TOKENS if v.system == "llamacpp-lookup" else None
            self._llamacpp[v.system] = LlamaCppPeer(
                gguf_path(self.config.target), threads=self.base_threads, seed=self.config.seed, lookup=lookup
            )
        return self._llamacpp[v.system]

    def release(self, v: Variant) -> None:
        """Close v's engine (SSD: stop its worker process; llama.cpp: free its model); it is rebuilt if needed
        again."""
        engine = self._engines.pop(self.engine_key(v), None)
        if engine is not None:
            engine.close()
        peer = self._llamacpp.pop(v.system, None)
        if peer is not None:
            peer.close()

    def unavailable(self, v: Variant) -> str | None:
        """Why this variant cannot run here, or None. Builds the engine (once) to find out."""
        if v.system in LLAMACPP_SYSTEMS:
            if v.settings.batch != 1:
                return "llama-cpp-python's Llama decodes one sequence at a time: it runs at batch size 1 only"
            missing = llamacpp_missing()
            if missing:
                return missing
            try:
                self._llamacpp_peer(v)
            except ValueError as err:  # no GGUF behind the target, a file llama.cpp refuses, ...
                return f"{type(err).__name__}: {err}"
            return None
        if v.system not in ("ar", "sd", "ssd"):
            if v.system == "hf-assisted" and self.models.draft is None:
                return "no draft model loaded"
            return None
        key = self.engine_key(v)
        if key not in self._unavailable:
            try:
                self._engine(v)
                self._unavailable[key] = None
            except ValueError as err:  # e.g. a strategy this engine does not offer yet
                self._unavailable[key] = f"{type(err).__name__}: {err}"
        return self._unavailable[key]

    def run(self, v: Variant, prompts: list[Prompt], params: SamplingParams) -> CallOutput:
        if v.system in ("ar", "sd", "ssd"):
            engine = self._engine(v)
            threads = self._threads.get(self.engine_key(v), self.base_threads)
            torch.set_num_threads(threads)
            try:
                gen = engine.generate([p.content for p in prompts], params)
            finally:
                torch.set_num_threads(self.base_threads)
            requests = [
                {**o.metrics.summary(), "token_ids": o.token_ids, "finish_reason": o.finish_reason} for o in gen
            ]
            if engine.strategy_in_use != v.system:  # SSD: the worker failed and a fallback went on
                fault = f"{engine.fault}; went on as {engine.strategy_in_use}"
                requests = [{**r, "engine_fault": fault} for r in requests]
            rounds = [json.loads(r.to_json()) for r in gen.metrics.rounds]
            # the engine counts rounds over its lifetime; a run folder numbers them within the call, so that a
            # resumed run (a fresh engine) records what an uninterrupted one does
            first = rounds[0]["round"] if rounds else 0
            rounds = [{**r, "round": r["round"] - first} for r in rounds]
            return CallOutput(requests, gen.metrics.wall_s, rounds, threads)
        ids = [self.encoder.encode(p.content) for p in prompts]
        if v.system in LLAMACPP_SYSTEMS:
            return self._run_llamacpp(v, ids, params)
        assistant = self.models.draft if v.system == "hf-assisted" else None
        outs, seconds = hf_generate(
            self.models.target,
            ids,
            params,
            self.encoder.eos_ids,
            self.encoder.pad_id,
            assistant,
            None if v.settings.adaptive else v.settings.K,
        )  # auto: its own
        requests = [
            # not streamed: the whole batch's call time is each request's E2EL, and TTFT is unknown
            {
                "prompt_tokens": len(i),
                "new_tokens": len(o.token_ids),
                "e2el_s": seconds,
                "tokens_per_s": len(o.token_ids) / seconds if seconds > 0 else 0.0,
                "token_ids": o.token_ids,
                "finish_reason": o.finish_reason,
            }
            for i, o in zip(ids, outs, strict=True)
        ]
        return CallOutput(requests, seconds, [], self.base_threads)

    def _run_llamacpp(self, v: Variant, ids: list[list[int]], params: SamplingParams) -> CallOutput:
        if len(ids) != 1:
            raise ValueError("llama-cpp-python's Llama decodes one sequence at a time: use --batch-size 1")
        peer = self._llamacpp_peer(v)
        out, metrics = peer.generate(ids[0], params, self.encoder.eos_ids)
        request = {**metrics.summary(), "token_ids": out.token_ids, "finish_reason": out.finish_reason}
        if peer.lookup is not None:
            request.update(lookup_num_pred_tokens=peer.lookup, draft_tokens=peer.draft_tokens)
        return CallOutput([request], metrics.e2el_s, [], peer.threads)

    def close(self) -> None:
        for engine in self._engines.values():
            engine.close()
        self._engines.clear()
        for peer in self._llamacpp.values():
            peer.close()
        self._llamacpp.clear()

"""The user-facing engine: `LLM(target, draft, strategy=...)`, `generate(prompts, params)` and `stream(...)`.

Every strategy runs in the one decode loop (engine.decode_loop) as a proposer (engine.strategies).
`generate` and `stream` drive the loop in the caller's thread; `engine.async_llm.AsyncLLM` drives it on a
thread of its own for requests that arrive over time (the server).
"""

from __future__ import annotations

import itertools
import logging
import secrets
import time
import warnings
from collections.abc import Iterator
from collections.abc import Sequence as Seq
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from engine.blocks import BlockModel
from engine.compile_config import CompileConfig, slot_plans
from engine.compiled import slot_model
from engine.config import EngineConfig, QuantConfig, SpeculativeConfig, replace_removed_quant_arguments
from engine.decode_loop import DecodeLoop
from engine.loading.devices import AUTO_DTYPE, TORCH_DTYPES, check_device, resolve_dtype
from engine.loading.models import engine_model
from engine.metrics import RunMetrics
from engine.outputs import Chunk, Generation
from engine.prompt_input import check_prompts, encode_chat, encode_ids, encode_text, eos_ids, is_single_prompt, pad_id
from engine.reproducibility import unreproducible_reason
from engine.sampling_params import SamplingParams
from engine.scheduler import MemoryLimit, SchedulerConfig
from engine.sequence import Sequence
from engine.strategies.ar import NoDraft
from engine.strategies.base import Proposer
from engine.strategies.sd import InProcessDraft
from theory.glossary import Strategy

log = logging.getLogger(__name__)
ROW_SEED_STEP = 0x9E3779B97F4A7C15  # rows sharing one SamplingParams get well-spread seeds


def row_seed(seed: int, index: int) -> int:
    """The seed of row `index` of a call whose prompts share one seed (row 0 keeps the seed itself)."""
    return (seed + index * ROW_SEED_STEP) % (1 << 63)


def _vocab_size(model: PreTrainedModel) -> int:
    """Rows of the input embedding, which low-bit quantisation of Linear layers leaves alone."""
    embeddings: Any = model.get_input_embeddings()  # torch types a module's attributes as Tensor | Module
    return int(embeddings.num_embeddings)


def _logit_width(model: PreTrainedModel) -> int:
    """Logits per position: the output head's out_features (nn.Linear and its low-bit replacements alike)."""
    head: Any = model.get_output_embeddings()  # torch types a module's attributes as Tensor | Module
    return int(head.out_features)


def _check_vocab(target: PreTrainedModel, draft: PreTrainedModel) -> None:
    vt, vd = _vocab_size(target), _vocab_size(draft)
    if vt != vd:
        raise ValueError(
            f"target and draft have different vocabularies ({vt} vs {vd} logits): speculative "
            "decoding needs a draft that shares the target's tokenizer"
        )


class LLM:
    """A target model, an optional draft, and a strategy (AR, SD, SSD).

    target / draft: an alias ("qwen-coder-1.5b", "qwen-coder-0.5b", "smollm2-135m"), a local
    transformers folder or .gguf file, or an already built PreTrainedModel (token-id prompts only
    unless `tokenizer` is given). Use as a context manager to free everything it started.
    strategy: AR, SD or SSD; by default SD when a draft is given and AR otherwise (a draft is never
    silently left unused).
    max_num_seqs / max_prefill_tokens / max_waiting: the scheduler's limits (None: no limit, so one
    generate() call runs all its prompts as one batch); a prompt longer than max_prefill_tokens is prefilled in
    chunks of that many tokens, one a step, between the rounds of the running sequences.
    dtype / draft_dtype: float dtype of a model loaded by name (a model object keeps its own); with low-bit
    weights, the dtype of the layers left in float. "auto" (the default) is bfloat16 where the device
    multiplies in it at speed (a CUDA GPU with bf16, a CPU with AVX-512 or AMX), else float32 on a CPU
    (float16 on an older GPU): `engine.loading.devices.resolve_dtype`; `llm.config.dtype` says what was chosen.
    target_quant / draft_quant: None (float weights), a scheme name ("int8", "int4"; the draft also
    "int8-dynamic") or a `QuantConfig` (scheme, int4 group size, output head): low-bit Linear layers on the
    CPU (engine.loading.quantize). A model given by name comes from the low-bit cache when there is one, else
    from its float32 weights quantised at load; a model object is quantised as a copy (the caller's object is
    left as it was). A low-bit target is the target: SD and SSD sample exactly what AR with that low-bit
    target samples.
    compile: True or a CompileConfig: every forward runs on a preallocated slot cache in fixed shapes, compiled
    once per shape with torch.compile (CUDA graphs on CUDA; engine.compiled): the tokens of the eager engine.
    tp: the target runs on this many tensor-parallel ranks (engine.tp): this process is rank 0 and samples;
    the engine starts the other ranks itself and stops them at close.
    prefix_caching: reuse the KV of prompt prefixes earlier requests computed (engine.blocks; on by default).
    kv_cache_memory: bytes the target's KV cache may take (None: no limit); requests are admitted against it, and
    one that could never fit is refused with a ValueError when it is made.
    Removed arguments (draft_int8, quant_group_size, target_head_quant, draft_head_quant) still work until
    0.3.0 with a DeprecationWarning naming their replacement (engine.config.REMOVED_QUANT_ARGUMENTS).
    """

    def __init__(
        self,
        target: str | Path | PreTrainedModel,
        draft: str | Path | PreTrainedModel | None = None,
        *,
        strategy: Strategy | str | None = None,
        speculative: SpeculativeConfig | None = None,
        dtype: str = AUTO_DTYPE,
        draft_dtype: str | None = None,
        target_quant: QuantConfig | str | None = None,
        draft_quant: QuantConfig | str | None = None,
        device: str = "cpu",
        threads: int | None = None,
        chat_template: bool = True,
        tokenizer=None,
        cache_dir: str | Path | None = None,
        max_num_seqs: int | None = None,
        max_prefill_tokens: int | None = None,
        max_waiting: int | None = None,
        compile: CompileConfig | bool = False,
        tp: int = 1,
        prefix_caching: bool = True,
        kv_cache_memory: int | None = None,
        **removed,
    ):
        if removed:  # arguments removed from the API, still taken until engine.config.REMOVED_IN
            target_quant, draft_quant, messages = replace_removed_quant_arguments(target_quant, draft_quant, removed)
            for message in messages:
                warnings.warn(message, DeprecationWarning, stacklevel=2)
        if strategy is None:
            strategy = Strategy.AR if draft is None else Strategy.SD
        dtype = resolve_dtype(dtype, device)  # the config records what loads, never "auto"
        draft_dtype = None if draft_dtype is None else resolve_dtype(draft_dtype, device)
        self.config = EngineConfig(
            target=str(getattr(target, "name_or_path", target)),
            draft=None if draft is None else str(getattr(draft, "name_or_path", draft)),
            strategy=Strategy(strategy),
            speculative=speculative or SpeculativeConfig(),
            dtype=dtype,
            draft_dtype=draft_dtype,
            device=device,
            threads=threads,
            chat_template=chat_template,
            cache_dir=None if cache_dir is None else str(cache_dir),
            target_quant=QuantConfig.of(target_quant),
            draft_quant=QuantConfig.of(draft_quant),
            compile=CompileConfig.of(compile),
            tp=tp,
            prefix_caching=prefix_caching,
            kv_cache_memory=kv_cache_memory,
        )
        scheduler = SchedulerConfig(max_num_seqs, max_prefill_tokens, max_waiting)
        if self.config.strategy is Strategy.SSD:
            from engine.ssd.placement import preflight

            preflight(self.config.speculative.placement)  # a taken port, an unguarded script: before loading
        if threads is not None:
            torch.set_num_threads(threads)
        self.device = check_device(device)  # a missing device is refused before any model loads
        self.loop: DecodeLoop | None = None
        config = self.config
        self._tp = None  # the tensor-parallel target's other ranks (engine.tp), when tp > 1
        target_model: PreTrainedModel
        if config.tp > 1:
            from engine.tp import start_target

            self._tp, loaded_tokenizer = start_target(target, config, self.device)
            target_model = self._tp.model
        else:
            target_model, loaded_tokenizer = engine_model(
                target, config.target_quant, dtype=TORCH_DTYPES[dtype], device=self.device, cache_dir=cache_dir
            )
        self.target: PreTrainedModel | None = target_model
        self.tokenizer = tokenizer or loaded_tokenizer
        self.draft: PreTrainedModel | None = None
        self._draft_given = None
        if draft is not None and config.strategy is not Strategy.AR:
            self.draft, _ = engine_model(
                draft,
                config.draft_quant,
                dtype=TORCH_DTYPES[config.draft_float_dtype],
                device=self.device,
                cache_dir=cache_dir,
            )
            _check_vocab(target_model, self.draft)
            # SSD's worker process rebuilds a draft given as a model from its weights (the exact
            # model passed, before quantisation, which the worker applies), and one given by alias /
            # path by loading it the same way.
            self._draft_given = draft if isinstance(draft, PreTrainedModel) else None
        self.eos_ids = eos_ids(target_model, self.tokenizer)
        self.pad_id = pad_id(self.tokenizer, self.eos_ids, _vocab_size(target_model))
        self.vocab_size = _logit_width(target_model)  # also for quantised heads
        self._seq_ids = itertools.count()
        self.serving = False  # True while an AsyncLLM drives the loop
        spec = config.speculative
        K = None if config.strategy is Strategy.AR else spec.K
        branches = sum(spec.fanouts) if config.strategy is Strategy.SSD else 0
        target_plan, draft_plan = slot_plans(config.compile, K, branches, max_num_seqs)
        # what the loop and the proposers feed: the models, on the static slot cache when compiled, the target
        # through its ranks when tensor-parallel (engine.kv_cache.new_state makes their states)
        self._fed_target = (
            self._tp
            if self._tp is not None
            else slot_model(
                target_model,
                target_plan,
                self.device,
                "target",
                prefix_caching=config.prefix_caching,
                max_bytes=config.kv_cache_memory,
            )
        )
        self._fed_draft = (
            None
            if self.draft is None
            else slot_model(self.draft, draft_plan, self.device, "draft", prefix_caching=config.prefix_caching)
        )
        self.loop = loop = DecodeLoop(
            self._fed_target,  # type: ignore[arg-type]  # typed nn.Module there; it takes any model
            # engine.kv_cache.new_state feeds (a model, SlotModel, BlockModel, TPTarget)
            NoDraft(self.vocab_size, self.device),
            pad_id=self.pad_id,
            device=self.device,
            scheduler=scheduler,
        )
        if max_num_seqs is not None and self.max_context is not None:  # what a KV-cache usage is a share of
            loop.stats.cache_capacity_tokens = max_num_seqs * self.max_context
        self._kv_limit: MemoryLimit | None = None
        self._kv_pool = pool = self._fed_target.pool if isinstance(self._fed_target, BlockModel) else None
        if config.kv_cache_memory is not None and pool is not None and pool.max_blocks is not None:
            self._kv_limit = MemoryLimit(
                (pool.max_blocks - 1) * pool.bytes_per_block,
                self._kv_bytes,  # - scratch
                "the target's KV cache",
            )
            loop.scheduler.limit_by_memory(self._kv_limit)
        self._start_proposer()

    def _kv_bytes(self, seq: Sequence) -> int:
        """The target's KV a request may take at its full length (prompt, max_new_tokens, a speculation)."""
        return self._kv_need(len(seq.prompt_ids) + seq.params.max_new_tokens + self.lookahead)

    def _kv_need(self, tokens: int) -> int:
        pool = self._kv_pool
        assert pool is not None  # only asked for under a budget, which the block pool has
        return -(-tokens // pool.block_size) * pool.bytes_per_block

    # -- construction -------------------------------------------------------------------------
    @property
    def _open_loop(self) -> DecodeLoop:
        """The decode loop; ValueError once the LLM is closed."""
        if self.loop is None:
            raise ValueError("this LLM is closed: build a new one")
        return self.loop

    def _start_proposer(self) -> None:
        strategy, spec, loop = self.config.strategy, self.config.speculative, self._open_loop
        if strategy is Strategy.AR:
            return  # the loop starts with NoDraft
        if strategy is Strategy.SD:
            if self._fed_draft is None:
                raise ValueError("strategy sd needs a draft model: pass draft=...")
            loop.proposer = InProcessDraft(
                self._fed_draft,  # type: ignore[arg-type]  # typed nn.Module there; it takes any model
                # engine.kv_cache.new_state feeds (a model, SlotModel, BlockModel)
                spec,
                self.pad_id,
                self.device,
            )
        elif strategy is Strategy.SSD:
            from engine.ssd.channel import open_channel
            from engine.ssd.memory import check_budget, memory_limit
            from engine.ssd.placement import draft_device_for
            from engine.strategies.ssd import DraftWorkerProposer

            if spec.budget != "auto" and self.draft is not None:  # "auto" sizes itself to the verify
                branches = (
                    spec.budget
                    if isinstance(spec.budget, int)
                    else max(sum(spec.fanouts), sum(spec.fanout_backup or ()))
                )
                # in process the draft sits on the target's device; its own process picks as the channel does
                draft_device = (
                    self.device
                    if spec.placement.in_process
                    else draft_device_for(self.device, spec.placement.draft_device)
                )
                tree = isinstance(self._fed_draft, BlockModel)  # branches as a tree over the row, not copies
                check_budget(self.draft, spec.K, branches, draft_device, tree)
                loop.scheduler.limit_by_memory(memory_limit(self.draft, spec.K, branches, draft_device, tree))
            # open_channel and DraftWorkerProposer type the draft they feed as nn.Module; they take any model
            # engine.kv_cache.new_state feeds (a model, SlotModel, BlockModel)
            opener = open_channel(
                self._fed_draft,  # type: ignore[arg-type]  # (above)
                self._draft_given,
                self.config,
                self.pad_id,
                self.device,
            )
            proposer = DraftWorkerProposer(
                opener,
                spec,
                self.vocab_size,
                self.pad_id,
                self.device,
                draft=self._fed_draft,  # type: ignore[arg-type]  # (above)
            )
            loop.proposer = proposer
            try:  # start the worker now, so that loading its model is not charged to the first request
                proposer.start()
            except proposer.faults as err:
                loop.fall_back(err, "did not start")
        else:
            raise ValueError(f"strategy {strategy.value} is not available; use ar, sd or ssd")
        loop.stats.strategy = loop.proposer.name

    # -- what a server needs to know ----------------------------------------------------------
    @property
    def model_name(self) -> str:
        return self.config.target

    @property
    def max_context(self) -> int | None:
        if self.target is None:
            raise ValueError("this LLM is closed: build a new one")
        limit = getattr(self.target.config, "max_position_embeddings", None)
        if self.config.compile is not None:
            # a row of the static cache holds max_len tokens; an SSD branch row drafts K past the speculation
            room = self.config.compile.max_len - (
                self.config.speculative.K if self.config.strategy is Strategy.SSD else 0
            )
            limit = min(limit or room, room)
        return limit

    @property
    def lookahead(self) -> int:
        """Context positions a request needs beyond prompt + max_new_tokens (a round's speculated tokens)."""
        return self.config.speculative.K + 1 if self.config.strategy is not Strategy.AR else 0

    def room(self, prompt_ids: list[int]) -> int | None:
        """The most new tokens a request with this prompt may ask for (None: no known limit)."""
        if self.max_context is None:
            return None
        return self.max_context - len(prompt_ids) - self.lookahead

    @property
    def strategy_in_use(self) -> str:
        """ "ar", "sd" or "ssd"; after an SSD worker fault, the fallback's name."""
        return self._open_loop.proposer.name

    @property
    def fault(self) -> str | None:
        """Why SSD's draft worker was replaced by its fallback (None if it never was)."""
        return self._open_loop.fault

    @property
    def proposer(self) -> Proposer:
        return self._open_loop.proposer

    # -- prompts ------------------------------------------------------------------------------
    def encode(self, prompt: str | Seq[int], chat: bool | None = None) -> list[int]:
        """Token ids of a prompt: text through the tokenizer (and, when `chat` — by default the engine's
        chat_template setting — through the chat template as one user message), ids as given."""
        if self.target is None:
            raise ValueError("this LLM is closed: build a new one")
        if isinstance(prompt, str):
            return encode_text(self.tokenizer, prompt, self.config.chat_template if chat is None else chat)
        return encode_ids(prompt, _vocab_size(self.target))

    def encode_chat(self, messages: Seq[dict]) -> list[int]:
        """Token ids of a conversation ([{"role": "system" | "user" | "assistant", "content": str}, ...])
        through the tokenizer's chat template, ready for the assistant's answer."""
        return encode_chat(self.tokenizer, messages)

    def make_sequence(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        index: int = 0,
        request_id: str | None = None,
        seed: int | None = None,
        arrival_s: float | None = None,
    ) -> Sequence:
        """A request ready to submit to the loop; ValueError if it cannot fit the model's context."""
        max_pos, lookahead = self.max_context, self.lookahead
        if max_pos is not None and len(prompt_ids) + params.max_new_tokens + lookahead > max_pos:
            raise ValueError(
                f"prompt {index} has {len(prompt_ids)} tokens; with max_new_tokens={params.max_new_tokens} "
                f"(+{lookahead} speculated) it exceeds the model's context of {max_pos}: "
                "shorten the prompt or lower max_new_tokens"
            )
        limit = self._kv_limit
        if limit is not None:
            need = self._kv_need(len(prompt_ids) + params.max_new_tokens + lookahead)
            if need > limit.available_bytes:
                raise ValueError(
                    f"prompt {index} with max_new_tokens={params.max_new_tokens} may need {need / 2**20:.1f} MiB of "
                    f"the target's KV cache, more than its budget of {limit.available_bytes / 2**20:.1f} MiB: raise "
                    "kv_cache_memory, or shorten the prompt or lower max_new_tokens"
                )
        seq_id = next(self._seq_ids)
        if seed is None:
            seed = params.seed if params.seed is not None else secrets.randbits(63)
        seq = Sequence(
            seq_id=seq_id,
            request_id=request_id or f"req-{seq_id}",
            index=index,
            prompt_ids=prompt_ids,
            params=params,
            eos_ids=self.eos_ids,
            seed=seed,
            arrival_s=time.perf_counter() if arrival_s is None else arrival_s,
            tokenizer=self.tokenizer,
            unreproducible=unreproducible_reason(self.config.strategy, self.config.speculative, params),
        )
        return seq

    def _sequences(self, prompts, params) -> list[Sequence]:
        if is_single_prompt(prompts):
            prompts = [prompts]
        check_prompts(prompts)
        shared = params is None or isinstance(params, SamplingParams)
        if params is None:
            params = SamplingParams()
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} sampling params for {len(prompts)} prompts: give one or one each")
        # One shared SamplingParams: rows get distinct streams derived from its seed. One each: their own seeds.
        base = params[0].seed if params[0].seed is not None else secrets.randbits(63)
        arrival = time.perf_counter()
        seqs = []
        for i, (prompt, p) in enumerate(zip(prompts, params, strict=True)):
            seed = row_seed(base, i) if shared else p.seed
            seqs.append(self.make_sequence(self.encode(prompt), p, index=i, seed=seed, arrival_s=arrival))
        return seqs

    # -- generation ---------------------------------------------------------------------------
    def _check_idle(self) -> None:
        if self.loop is None:
            raise ValueError("this LLM is closed: build a new one")
        if self.serving:
            raise ValueError("this LLM is being served by an AsyncLLM: send requests through it")

    def generate(
        self,
        prompts: str | Seq[int] | Seq[str | Seq[int]],
        params: SamplingParams | Seq[SamplingParams] | None = None,
    ) -> Generation:
        """Generate for a batch of prompts (joining the loop together, within the scheduler's limits)."""
        self._check_idle()
        seqs = self._sequences(prompts, params)
        start = time.perf_counter()
        recorder = self._open_loop.recorder
        records: list = []
        recorder.records = records
        try:
            for _ in self._drive(seqs):
                pass
        finally:
            recorder.records = None
        metrics = RunMetrics(
            strategy=self.config.strategy.value,
            K=0 if self.config.strategy is Strategy.AR else self.config.speculative.K,
            wall_s=time.perf_counter() - start,
            requests=[s.metrics for s in seqs],
            rounds=records,
        )
        return Generation([s.output() for s in seqs], metrics)

    def stream(
        self,
        prompts: str | Seq[int] | Seq[str | Seq[int]],
        params: SamplingParams | Seq[SamplingParams] | None = None,
    ) -> Iterator[Chunk]:
        """Like generate(), but yields each request's tokens as rounds emit them (`Chunk.index` says which
        prompt). Leaving the loop early aborts the requests still running."""
        self._check_idle()
        yield from self._drive(self._sequences(prompts, params))

    def _drive(self, seqs: list[Sequence]) -> Iterator[Chunk]:
        ids, loop = {s.request_id for s in seqs}, self._open_loop
        for seq in seqs:
            loop.submit(seq)
        try:
            while not all(s.finished for s in seqs):
                for chunk in loop.step():
                    if chunk.request_id in ids:
                        yield chunk
        finally:
            left = [s for s in seqs if not s.finished]
            for seq in left:
                loop.abort(seq.request_id)
            if left:
                loop.step()  # retires them

    # -- lifetime -----------------------------------------------------------------------------
    def close(self) -> None:
        """Free the models (and, for SSD, stop the draft worker)."""
        if self.loop is not None:
            self.loop.close()
        if self._tp is not None:
            self._tp.close()  # stops the other ranks
            self._tp = None
        self.loop = None
        self.target = None
        self.draft = None

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

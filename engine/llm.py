"""The user-facing engine: `LLM(target, draft, strategy=...)` and `generate(prompts, params)`."""

from __future__ import annotations

import logging
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel

from engine.config import EngineConfig, SpeculativeConfig
from engine.metrics import RequestMetrics, RunMetrics
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from engine.strategies.ar import AutoregressiveDecoder
from engine.strategies.base import Clock, Decoder
from engine.strategies.sd import SpeculativeDecoder
from theory.glossary import Strategy

log = logging.getLogger(__name__)

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class RequestOutput:
    index: int
    prompt_ids: list[int]
    token_ids: list[int]
    text: str | None  # None when the engine has no tokenizer (token-id prompts on bare models)
    finish_reason: str
    metrics: RequestMetrics


@dataclass
class Generation:
    """What generate() returns: one output per prompt, in order, and the run's metrics."""

    outputs: list[RequestOutput]
    metrics: RunMetrics

    def __iter__(self):
        return iter(self.outputs)

    def __len__(self) -> int:
        return len(self.outputs)

    def __getitem__(self, i: int) -> RequestOutput:
        return self.outputs[i]


def _vocab_size(model: PreTrainedModel) -> int:
    # The input embedding, which int8 quantisation of Linear layers leaves alone.
    return model.get_input_embeddings().num_embeddings


def _eos_ids(model: PreTrainedModel, tokenizer) -> frozenset[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return frozenset(ids)


class LLM:
    """A target model, an optional draft, and a strategy (AR, SD, SSD).

    target / draft: an alias ("qwen-coder-1.5b", "qwen-coder-0.5b", "smollm2-135m"), a local
    transformers folder or .gguf file, or an already built PreTrainedModel (token-id prompts only
    unless `tokenizer` is given). Use as a context manager to free everything it started.
    """

    def __init__(
        self,
        target: str | Path | PreTrainedModel,
        draft: str | Path | PreTrainedModel | None = None,
        *,
        strategy: Strategy | str = Strategy.AR,
        speculative: SpeculativeConfig | None = None,
        dtype: str = "float32",
        draft_dtype: str | None = None,
        draft_int8: bool = False,
        device: str = "cpu",
        threads: int | None = None,
        chat_template: bool = True,
        tokenizer=None,
        cache_dir: str | Path | None = None,
    ):
        self.config = EngineConfig(
            target=str(getattr(target, "name_or_path", target)),
            draft=None if draft is None else str(getattr(draft, "name_or_path", draft)),
            strategy=strategy,
            speculative=speculative or SpeculativeConfig(),
            dtype=dtype,
            draft_dtype=draft_dtype,
            draft_int8=draft_int8,
            device=device,
            threads=threads,
            chat_template=chat_template,
            cache_dir=None if cache_dir is None else str(cache_dir),
        )
        if threads is not None:
            torch.set_num_threads(threads)
        self.device = torch.device(device)
        self.target, self.tokenizer = self._load(target, dtype, cache_dir, tokenizer)
        self.draft = self._draft_given = None
        if draft is not None and self.config.strategy is not Strategy.AR:
            self.draft, _ = self._load(draft, draft_dtype or dtype, cache_dir, None)
            self._check_vocab()
            # SSD's worker process rebuilds a draft given as a model from its weights (the exact
            # model passed, before int8), and one given by alias / path by loading it the same way.
            self._draft_given = self.draft if isinstance(draft, PreTrainedModel) else None
            if draft_int8:
                from engine.models import int8_dynamic

                self.draft = int8_dynamic(self.draft)
        self.eos_ids = _eos_ids(self.target, self.tokenizer)
        pad = getattr(self.tokenizer, "pad_token_id", None)
        self.pad_id = pad if pad is not None else (min(self.eos_ids) if self.eos_ids else 0)
        self.decoder = self._decoder()

    # -- construction -------------------------------------------------------------------------
    def _load(self, spec, dtype: str, cache_dir, tokenizer):
        if isinstance(spec, PreTrainedModel):
            return spec.to(self.device).eval(), tokenizer
        from engine.models import load_model

        loaded = load_model(spec, dtype=TORCH_DTYPES[dtype], device=self.device, cache_dir=cache_dir)
        return loaded.model, tokenizer or loaded.tokenizer

    def _check_vocab(self) -> None:
        vt, vd = _vocab_size(self.target), _vocab_size(self.draft)
        if vt != vd:
            raise ValueError(
                f"target and draft have different vocabularies ({vt} vs {vd} logits): speculative "
                "decoding needs a draft that shares the target's tokenizer"
            )

    def _decoder(self) -> Decoder:
        strategy = self.config.strategy
        if strategy is Strategy.AR:
            return AutoregressiveDecoder(self.target, self.pad_id, self.device)
        if strategy is Strategy.SD:
            return SpeculativeDecoder(self.target, self.draft, self.config.speculative, self.pad_id, self.device)
        if strategy is Strategy.SSD:
            from engine.strategies.ssd import SpeculativeSpeculativeDecoder, open_channel

            spec = self.config.speculative
            opener = open_channel(self.draft, self._draft_given, self.config, spec, self.pad_id, self.device)
            return SpeculativeSpeculativeDecoder(self.target, opener, spec, self.pad_id, self.device, draft=self.draft)
        raise ValueError(f"strategy {strategy.value} is not available; use ar, sd or ssd")

    # -- generation ---------------------------------------------------------------------------
    def encode(self, prompt: str | Seq[int]) -> list[int]:
        """Token ids of a prompt: text through the tokenizer (and chat template), ids as given."""
        if isinstance(prompt, str):
            if not prompt.strip():
                raise ValueError("empty prompt: give some text (or token ids)")
            if self.tokenizer is None:
                raise ValueError("this engine has no tokenizer: pass prompts as lists of token ids")
            if self.config.chat_template and getattr(self.tokenizer, "chat_template", None):
                text = self.tokenizer.apply_chat_template(
                    [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
                )
                return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            return list(self.tokenizer(prompt)["input_ids"])
        ids = [int(t) for t in prompt]
        if not ids:
            raise ValueError("empty prompt: give at least one token id")
        vocab = _vocab_size(self.target)
        if min(ids) < 0 or max(ids) >= vocab:
            raise ValueError(f"prompt token ids must be in [0, {vocab}), got {min(ids)}..{max(ids)}")
        return ids

    def _check_batch(self, prompts, params) -> list[SamplingParams]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if len(prompts) == 0:
            raise ValueError("no prompts given: pass a list with at least one prompt")
        if params is None:
            params = SamplingParams()
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} sampling params for {len(prompts)} prompts: give one or one each")
        first = params[0]
        for p in params[1:]:
            if not first.same_distribution(p) or p.seed != first.seed:
                raise ValueError(
                    "one batch mixes incompatible sampling settings (temperature, top_k, top_p, seed "
                    "must agree within a call): split it into calls with equal settings"
                )
        return prompts, params

    def generate(
        self,
        prompts: str | Seq[int] | Seq[str | Seq[int]],
        params: SamplingParams | Seq[SamplingParams] | None = None,
    ) -> Generation:
        """Generate for a batch of prompts (one real batch through the models)."""
        prompts, params = self._check_batch(prompts, params)
        max_pos = getattr(self.target.config, "max_position_embeddings", None)
        lookahead = 0 if self.config.strategy is Strategy.AR else self.config.speculative.K + 1
        seqs = []
        for i, (prompt, p) in enumerate(zip(prompts, params)):
            ids = self.encode(prompt)
            if max_pos is not None and len(ids) + p.max_new_tokens + lookahead > max_pos:
                raise ValueError(
                    f"prompt {i} has {len(ids)} tokens; with max_new_tokens={p.max_new_tokens} "
                    f"(+{lookahead} speculated) it exceeds the model's context of {max_pos}: "
                    "shorten the prompt or lower max_new_tokens"
                )
            seqs.append(Sequence(index=i, prompt_ids=ids, params=p, eos_ids=self.eos_ids))

        generator = torch.Generator(device=self.device).manual_seed(params[0].seed)
        clock = Clock()
        records = self.decoder.run(seqs, params[0], generator, clock)
        metrics = RunMetrics(
            strategy=self.config.strategy.value,
            K=0 if self.config.strategy is Strategy.AR else self.config.speculative.K,
            wall_s=clock.now(),
            requests=[s.metrics for s in seqs],
            rounds=records,
        )
        outputs = [
            RequestOutput(
                index=s.index,
                prompt_ids=s.prompt_ids,
                token_ids=s.output_ids,
                text=self.tokenizer.decode(s.output_ids, skip_special_tokens=True) if self.tokenizer else None,
                finish_reason=s.finish_reason or "length",
                metrics=s.metrics,
            )
            for s in seqs
        ]
        return Generation(outputs, metrics)

    # -- lifetime -----------------------------------------------------------------------------
    def close(self) -> None:
        """Free the models (and, for SSD, stop the draft worker)."""
        if self.decoder is not None and hasattr(self.decoder, "close"):
            self.decoder.close()
        self.decoder = None
        self.target = None
        self.draft = None

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

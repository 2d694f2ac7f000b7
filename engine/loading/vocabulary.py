"""What must agree between a target and its draft: the vocabulary (logit rows, embedding rows, token ids)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from transformers import AutoConfig, AutoTokenizer, PreTrainedModel

from engine.loading.models import LoadedModel


@dataclass(frozen=True)
class Vocabulary:
    """What must agree between a target and its draft: logit rows, embedding rows, token ids."""

    name: str
    logits: int
    embeddings: int
    tokens: Mapping[str, int] | None  # None when there is no tokenizer (tiny test models)
    eos_token_id: int | None


def vocabulary(item: LoadedModel | PreTrainedModel | str | os.PathLike[str]) -> Vocabulary:
    """The vocabulary of a loaded model, a bare model, or a transformers folder (no weights read)."""
    if isinstance(item, LoadedModel):
        emb = item.model.get_input_embeddings().num_embeddings
        # out_features exists on nn.Linear and on its low-bit WeightOnlyLinear replacement alike.
        logits = item.model.get_output_embeddings().out_features
        tok = item.tokenizer
        if tok is None:
            return Vocabulary(item.name, logits, emb, None, None)
        return Vocabulary(item.name, logits, emb, tok.get_vocab(), tok.eos_token_id)
    if isinstance(item, PreTrainedModel):
        emb = item.get_input_embeddings().num_embeddings
        logits = item.get_output_embeddings().out_features
        return Vocabulary(type(item).__name__, logits, emb, None, None)
    folder = Path(item)
    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    return Vocabulary(folder.name, config.vocab_size, config.vocab_size, tok.get_vocab(), tok.eos_token_id)


def check_compatible(
    target: LoadedModel | PreTrainedModel | str | os.PathLike[str],
    draft: LoadedModel | PreTrainedModel | str | os.PathLike[str],
) -> None:
    """Raise ValueError unless target and draft share one vocabulary (speculation compares ids)."""
    t, d = vocabulary(target), vocabulary(draft)
    what = f"target {t.name} and draft {d.name} have different vocabularies"
    fix = "speculative decoding needs a draft that uses the target's tokenizer"
    if (t.logits, t.embeddings) != (d.logits, d.embeddings):
        raise ValueError(f"{what}: {t.logits} vs {d.logits} logits, {t.embeddings} vs {d.embeddings} embeddings; {fix}")
    if t.tokens is not None and d.tokens is not None:
        if t.tokens != d.tokens:
            differ = sorted(set(t.tokens.items()) ^ set(d.tokens.items()))[:3]
            raise ValueError(f"{what}: {len(t.tokens)} vs {len(d.tokens)} tokens, e.g. {differ}; {fix}")
        if t.eos_token_id != d.eos_token_id:
            raise ValueError(f"{what}: eos ids {t.eos_token_id} vs {d.eos_token_id}; {fix}")

"""Prompts to token ids, with checks on what a caller passes, before anything reaches the tokenizer or the model;
and the special ids a model's sequences end and are padded with.

A prompt is text (`str`) or a sequence of integer token ids. Unchecked, the mistakes refused here pass
silently or fail deep inside: float ids are truncated by int(), bytes are iterated as ids, a string with
a lone surrogate (bytes that were not UTF-8, decoded with surrogateescape) gives a TypeError from the
tokenizer. Each gets a ValueError that names the prompt and says what to do.
"""

from __future__ import annotations

import numbers
import operator
from collections.abc import Sequence

BYTES = (bytes, bytearray, memoryview)


def is_single_prompt(prompts: object) -> bool:
    """True for one prompt (text, bytes, or a sequence of numbers), False for a list of prompts."""
    if isinstance(prompts, (str, *BYTES)):
        return True
    if isinstance(prompts, Sequence) and len(prompts) > 0:
        first = prompts[0]
        return isinstance(first, numbers.Number) or _is_scalar_tensor(first)
    return False


def check_prompts(prompts: object) -> None:
    """The list of prompts itself: a non-empty sequence."""
    if not isinstance(prompts, Sequence) or isinstance(prompts, (str, *BYTES)):
        raise ValueError(
            f"prompts must be a text, a list of token ids, or a list of those; got {type(prompts).__name__}"
        )
    if len(prompts) == 0:
        raise ValueError("no prompts given: pass a list with at least one prompt")


def check_text(text: str, what: str = "the prompt") -> None:
    """Refuse text that cannot be encoded as UTF-8 (a lone surrogate, from bytes that were not UTF-8)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ValueError(
            f"{what} is not valid Unicode text: it holds the lone surrogate {text[err.start]!r} at character "
            f"{err.start} (bytes that were not UTF-8?); decode the bytes as UTF-8 (errors='replace' keeps the rest)"
        ) from None


def token_ids(prompt: object) -> list[int]:
    """A prompt given as token ids, as a list of ints; ValueError for bytes, floats, bools or non-sequences."""
    if isinstance(prompt, BYTES):
        raise ValueError(
            "a prompt was given as bytes: decode it to text first (data.decode('utf-8')), "
            "or pass a list of integer token ids"
        )
    try:
        items = list(prompt)
    except TypeError:
        raise ValueError(f"a prompt must be text or a list of integer token ids, got {type(prompt).__name__}") from None
    ids = []
    for position, item in enumerate(items):
        try:
            if isinstance(item, bool):
                raise TypeError
            ids.append(operator.index(item))  # ints, numpy and torch integers; never floats
        except TypeError:
            raise ValueError(
                f"prompt token ids must be integers, got {item!r} ({type(item).__name__}) at position {position}: "
                "convert them yourself (a float id is not rounded for you)"
            ) from None
    return ids


def encode_text(tokenizer, prompt: str, chat: bool) -> list[int]:
    """Token ids of a text prompt: through `tokenizer`, and with `chat` through its chat template (if it has one)
    as one user message."""
    check_text(prompt)
    if not prompt.strip():
        raise ValueError("empty prompt: give some text (or token ids)")
    if tokenizer is None:
        raise ValueError("this engine has no tokenizer: pass prompts as lists of token ids")
    if chat and getattr(tokenizer, "chat_template", None):
        return encode_chat(tokenizer, [{"role": "user", "content": prompt}])
    ids = list(tokenizer(prompt)["input_ids"])
    if not ids:
        raise ValueError(f"the prompt {prompt[:40]!r} encodes to no tokens with this tokenizer: give other text")
    return ids


def encode_ids(prompt: object, vocab_size: int) -> list[int]:
    """A prompt given as token ids, checked against a vocabulary of `vocab_size` ids."""
    ids = token_ids(prompt)
    if not ids:
        raise ValueError("empty prompt: give at least one token id")
    if min(ids) < 0 or max(ids) >= vocab_size:
        raise ValueError(f"prompt token ids must be in [0, {vocab_size}), got {min(ids)}..{max(ids)}")
    return ids


def encode_chat(tokenizer, messages: Sequence[dict]) -> list[int]:
    """Token ids of a conversation ([{"role": "system" | "user" | "assistant", "content": str}, ...])
    through the tokenizer's chat template, ready for the assistant's answer."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model has no chat template: send a plain completion prompt instead")
    if not messages or not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
        raise ValueError("messages must be a non-empty list of {role, content} with text content")
    for i, m in enumerate(messages):
        check_text(m["content"], f"message {i}'s content")
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def eos_ids(model, tokenizer) -> frozenset[int]:
    """The ids that end a sequence: the model's generation config's, its config's and the tokenizer's."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return frozenset(ids)


def pad_id(tokenizer, eos_ids: frozenset[int], n_embeddings: int) -> int:
    """The id padded positions carry (they are masked, so any id the embedding table has will do): the
    tokenizer's pad id when the model has a row for it, else the smallest eos id, else 0. A tokenizer may
    define a pad token past the model's vocabulary (an added token the embeddings were never resized for)."""
    for candidate in (getattr(tokenizer, "pad_token_id", None), *sorted(eos_ids or ())):
        if candidate is not None and 0 <= candidate < n_embeddings:
            return int(candidate)
    return 0


def _is_scalar_tensor(x: object) -> bool:
    return getattr(x, "ndim", None) == 0  # a torch or numpy scalar

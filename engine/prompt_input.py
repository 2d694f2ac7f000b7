"""Checks on what a caller passes as prompts, before anything reaches the tokenizer or the model.

A prompt is text (`str`) or a sequence of integer token ids. The mistakes refused here used to pass
silently or fail deep inside: float ids were truncated by int(), bytes were iterated as ids, a string
with a lone surrogate (bytes that were not UTF-8, decoded with surrogateescape) gave a TypeError from the
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
        raise ValueError(f"prompts must be a text, a list of token ids, or a list of those; got {type(prompts).__name__}")
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


def _is_scalar_tensor(x: object) -> bool:
    return getattr(x, "ndim", None) == 0  # a torch or numpy scalar

"""Flag values that several commands read alike: a whole number or "auto", and numbers in one word.

The plain readers raise ValueError with a message that says what the flag takes (for checks after parsing);
`argument_type` makes one an argparse `type=`, so that argparse prints that message and exits with status 2.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeVar

AUTO = "auto"
T = TypeVar("T")


def whole_or_auto(text: str | int, what: str) -> int | str:
    """'auto', or the value as an int; otherwise ValueError "<what>, got <text>"."""
    if isinstance(text, int) or text == AUTO:
        return text
    try:
        return int(text)
    except (TypeError, ValueError):
        raise ValueError(f"{what}, got {text!r}") from None


def numbers(text: str, kind: Callable[[str], T], what: str, separators: str = ",") -> list[T]:
    """One command-line word as numbers: '4' (list flags take one number a word) or the older one-word form
    '4,3,2' (any of `separators` between them, never before the first); otherwise ValueError "<what>, got <text>"."""
    if text.strip()[:1] in separators:  # '-1' is a negative number, not '1' after a separator
        raise ValueError(f"{what}, got {text!r}")
    spaced = text
    for separator in separators:
        spaced = spaced.replace(separator, " ")
    try:
        return [kind(v) for v in spaced.split()]
    except ValueError:
        raise ValueError(f"{what}, got {text!r}") from None


def flat(words: list[list[T]] | None) -> list[T] | None:
    """The values of a nargs='+' flag of `numbers` words as one list (`--fanout 4 2 2` and `--fanout 4,2,2` alike)."""
    return None if words is None else [v for word in words for v in word]


def argument_type(read: Callable[..., T], *args, **kwargs) -> Callable[[str], T]:
    """An argparse type=: `read(text, *args, **kwargs)`, its ValueError shown as the usage error."""

    def parse(text: str) -> T:
        try:
            return read(text, *args, **kwargs)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = read.__name__
    return parse

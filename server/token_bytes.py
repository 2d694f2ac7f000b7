"""A token's text and its raw bytes, as logprobs report them.

A byte-level BPE tokenizer (GPT-2's scheme: Qwen2.5, SmolLM2, Llama 3) may split one character's UTF-8 bytes over
several tokens: Qwen2.5's token 10813 is the bytes F0 9F, the first half of an emoji. Decoded alone such a token is
U+FFFD, whose UTF-8 (EF BF BD) would lose the bytes, so a token's `bytes` come from its vocabulary string mapped
back through the tokenizer's byte <-> unicode table; a client joins the bytes of successive tokens to rebuild the
characters. SentencePiece's byte-fallback tokens (`<0xF0>`) are one byte each. Other tokens, and added tokens
(kept as their text), give the UTF-8 of their decoded text.
"""

from __future__ import annotations

import json
import re
from enum import Enum
from typing import Any

BYTE_FALLBACK_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class ByteScheme(str, Enum):
    """How a tokenizer's vocabulary strings hold bytes that are not whole characters."""

    NONE = "none"  # every token is text
    BYTE_LEVEL = "byte_level"  # every byte is one of 256 printable characters (GPT-2's table)
    BYTE_FALLBACK = "byte_fallback"  # bytes outside the vocabulary are tokens <0x00>..<0xFF>


def byte_scheme(tokenizer: Any) -> ByteScheme:
    """The scheme of a transformers tokenizer, read from its decoder (a tokenizer without one: NONE)."""
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    if decoder is None:
        return ByteScheme.NONE
    state = json.loads(decoder.__getstate__())
    kinds = {part.get("type") for part in state.get("decoders", [state])}
    if "ByteLevel" in kinds:
        return ByteScheme.BYTE_LEVEL
    if "ByteFallback" in kinds:
        return ByteScheme.BYTE_FALLBACK
    return ByteScheme.NONE


class TokenStrings:
    """Text and raw bytes of token ids under one tokenizer (None: a bare model, whose tokens read `token_id:N`, as
    in vLLM). Built once per server: the tokenizer's scheme and tables are read here."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.scheme = byte_scheme(tokenizer) if tokenizer is not None else ByteScheme.NONE
        self._added = frozenset(getattr(tokenizer, "added_tokens_decoder", None) or ())
        self._byte_of: dict[str, int] = {}
        if self.scheme is ByteScheme.BYTE_LEVEL:
            from transformers.convert_slow_tokenizer import bytes_to_unicode

            self._byte_of = {char: byte for byte, char in bytes_to_unicode().items()}

    def text(self, token_id: int) -> str:
        return f"token_id:{token_id}" if self.tokenizer is None else self.tokenizer.decode([token_id])

    def raw(self, token_id: int) -> bytes:
        """The bytes this token adds to the output."""
        if self.scheme is not ByteScheme.NONE and token_id not in self._added:
            piece = self.tokenizer.convert_ids_to_tokens(token_id)
            if isinstance(piece, str):
                if self.scheme is ByteScheme.BYTE_LEVEL and piece and all(c in self._byte_of for c in piece):
                    return bytes(self._byte_of[c] for c in piece)
                match = BYTE_FALLBACK_TOKEN.fullmatch(piece)
                if self.scheme is ByteScheme.BYTE_FALLBACK and match:
                    return bytes([int(match.group(1), 16)])
        return self.text(token_id).encode("utf-8")

"""Chat logprobs' `bytes` are each token's own bytes, so a client can join tokens that split a character.

Tokenizers are built in memory: a byte-level BPE (GPT-2's byte table, as Qwen2.5's, whose token 10813 is F0 9F)
holding the emoji U+1F600 (F0 9F 98 80) as two tokens, a SentencePiece-style one with byte-fallback tokens, and a
word-level one without byte tokens.
"""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from server.token_bytes import ByteScheme, TokenStrings
from tests.server.conftest import running
from tests.server.fake import FakeEngine, FakeModel

VOCAB = 64
HEAD, TAIL = 10, 11  # the ids of the emoji's two halves
EMOJI = "\U0001f600"


def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    """Tokens are single printable ASCII characters (the byte table maps those to themselves), except HEAD = "ðŁ"
    (bytes F0 9F) and TAIL = "ĺĢ" (bytes 98 80)."""
    pieces = [chr(48 + i) for i in range(VOCAB)]
    pieces[HEAD], pieces[TAIL] = "ðŁ", "ĺĢ"
    backend = Tokenizer(models.BPE({piece: i for i, piece in enumerate(pieces)}, []))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend)


def byte_fallback_tokenizer() -> PreTrainedTokenizerFast:
    """SentencePiece's layout: `▁`-marked words and byte tokens <0x00>..<0xFF> for what the vocabulary lacks."""
    pieces = ["<unk>", "▁a", *(f"<0x{b:02X}>" for b in range(256))]
    backend = Tokenizer(
        models.BPE({piece: i for i, piece in enumerate(pieces)}, [], unk_token="<unk>", byte_fallback=True)
    )
    backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")


def word_level_tokenizer() -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.WordLevel({"<unk>": 0, "héllo": 1}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")


@pytest.fixture
def byte_level_server():
    with running(FakeModel(byte_level_tokenizer()), FakeEngine()) as server:
        yield server


def chat_logprobs(server) -> list[dict]:
    import httpx

    # The fake engine continues a prompt ending in id t with t+1, t+2; a word of n letters is id n, so a last word
    # of HEAD - 1 letters makes the answer HEAD, TAIL.
    body = {
        "model": "fake-model",
        "messages": [{"role": "user", "content": "a" * (HEAD - 1)}],
        "max_tokens": 2,
        "logprobs": True,
        "top_logprobs": 2,
    }
    response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["logprobs"]["content"]


def test_a_token_that_is_part_of_a_character_gives_its_raw_bytes(byte_level_server):
    head, tail = chat_logprobs(byte_level_server)
    assert head["bytes"] == [0xF0, 0x9F] and tail["bytes"] == [0x98, 0x80]


def test_the_bytes_of_successive_tokens_join_into_the_character(byte_level_server):
    head, tail = chat_logprobs(byte_level_server)
    assert bytes(head["bytes"] + tail["bytes"]).decode("utf-8") == EMOJI
    assert head["token"] == "\N{REPLACEMENT CHARACTER}"  # decoded alone the half is U+FFFD: its bytes are not that


def test_top_logprobs_entries_carry_their_own_bytes_too(byte_level_server):
    head, _ = chat_logprobs(byte_level_server)
    # the fake's top alternatives of token t are t, t+1: HEAD's are HEAD and TAIL
    assert [entry["bytes"] for entry in head["top_logprobs"]] == [[0xF0, 0x9F], [0x98, 0x80]]


def test_a_whole_character_token_of_a_byte_level_tokenizer_gives_its_utf8():
    tokens = TokenStrings(byte_level_tokenizer())
    assert tokens.scheme is ByteScheme.BYTE_LEVEL and tokens.raw(17) == b"A" == tokens.text(17).encode()


def test_a_byte_fallback_token_is_one_byte():
    tokens = TokenStrings(byte_fallback_tokenizer())
    assert tokens.scheme is ByteScheme.BYTE_FALLBACK
    assert tokens.raw(2 + 0xF0) == b"\xf0" and tokens.raw(1) == b" a"


def test_a_tokenizer_without_byte_tokens_gives_the_utf8_of_the_token_text():
    tokens = TokenStrings(word_level_tokenizer())
    assert tokens.scheme is ByteScheme.NONE and tokens.raw(1) == "héllo".encode()


def test_a_model_without_tokenizer_gives_the_bytes_of_its_token_names():
    assert TokenStrings(None).raw(7) == b"token_id:7"

"""Incremental detokenization (engine.detokenizer through engine.sequence): each round decodes only its new tokens,
yet the text and the streamed deltas are those a whole decode of the output at every round gives.

The reference here decodes the whole output after every token: the text is `decode(ids, skip_special_tokens=True)`
cut before the first stop string, and each round streams the text up to its end less a trailing incomplete
character (U+FFFD) and less the last len(longest stop string) - 1 characters, all of it once finished. Real
tokenizers: SmolLM2-135M's (byte-level BPE), through its Rust backend (DecodeStream) and through `decode` alone
(the offsets fallback); and a Llama-2-style SentencePiece tokenizer with byte fallback, built in memory.
"""

from __future__ import annotations

import os
from itertools import accumulate

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models
from tokenizers.pre_tokenizers import ByteLevel
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from engine.detokenizer import REPLACEMENT
from engine.loading import model_cache
from engine.loading.models import resolve_folder
from engine.loading.provision import SMOKE_MODEL
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence

SAMPLE = "Hello 😀 world, 世界 and ☕ coffee. Ünïcödé — 🤖👍🏽 done! 漢字かな混じり文 "
IM_START, IM_END, ENDOFTEXT = 1, 2, 0  # SmolLM2's special tokens


class DecodeOnly:
    """A tokenizer with only `decode`, as a slow tokenizer or a test double has (no Rust backend to stream);
    it records how many ids each call decodes."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self.decoded: list[int] = []

    def decode(self, ids, skip_special_tokens=False):
        self.decoded.append(len(ids))
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


@pytest.fixture(scope="module")
def smol():
    folder, _ = resolve_folder(SMOKE_MODEL, model_cache.resolve_cache_root(None, os.environ))
    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


@pytest.fixture(scope="module")
def byte_ids(smol):
    """SmolLM2 ids of single bytes >= 0x80 (parts of a multi-byte character)."""
    vocab = smol.get_vocab()
    ids = [vocab[c] for c in ByteLevel.alphabet() if c in vocab]
    return sorted(i for i in ids if smol.decode([i]) == REPLACEMENT)


def llama_style() -> PreTrainedTokenizerFast:
    """A SentencePiece-style tokenizer with byte fallback (Llama 2's decoder): words start with ▁, characters
    outside the vocabulary are byte tokens <0xNN>, and decode strips the text's first space."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "▁Hello": 3, "▁world": 4, "!": 5, "▁a": 6, "nd": 7}
    vocab |= {f"<0x{b:02X}>": len(vocab) + b for b in range(256)}
    backend = Tokenizer(models.BPE(vocab, [], unk_token="<unk>", byte_fallback=True))
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def llama_ids(tok, pieces: list[str]) -> list[int]:
    """Ids of vocabulary pieces, and of other characters as their UTF-8 bytes."""
    vocab, ids = tok.get_vocab(), []
    for piece in pieces:
        ids += [vocab[piece]] if piece in vocab else [vocab[f"<0x{b:02X}>"] for b in piece.encode()]
    return ids


def rounds_of(ids: list[int], sizes: list[int]) -> list[list[int]]:
    """`ids` cut into rounds of the given sizes, repeated as needed."""
    rounds, i, k = [], 0, 0
    while i < len(ids):
        size = sizes[k % len(sizes)]
        rounds.append(ids[i : i + size])
        i, k = i + size, k + 1
    return rounds


def stream(tokenizer, rounds: list[list[int]], params: SamplingParams, eos_ids=frozenset()):
    """Feed the rounds to a Sequence until it finishes; (the sequence, each round's text delta)."""
    seq = Sequence(0, "r", 0, [1], params, frozenset(eos_ids), 0, 0.0, tokenizer=tokenizer)
    deltas = []
    for tokens in rounds:
        if seq.finished:
            break
        deltas.append(seq.append(tokens, None, 0.0).text)
    return seq, deltas


def whole_decodes(tokenizer, rounds: list[list[int]], params: SamplingParams, eos_ids=frozenset()):
    """The reference: (each round's delta, the text, the finish reason, the tokens kept) from a whole decode of
    the output after every token. A stop string counts where it ends past the complete text of the first
    min_tokens tokens."""

    def decode(ids):
        return tokenizer.decode(ids, skip_special_tokens=True)

    look_back = max((len(s) for s in params.stop), default=1) - 1
    ids, sent, deltas, reason, cut, text = [], 0, [], None, None, ""
    for tokens in rounds:
        for token in tokens:
            ids.append(token)
            if (params.stop_on_eos and token in eos_ids) or token in params.stop_token_ids:
                reason = "stop"
            elif params.stop and len(ids) > params.min_tokens:
                text, floor = decode(ids), len(decode(ids[: params.min_tokens]).rstrip(REPLACEMENT))
                hits = [i for i in (text.find(s, max(0, floor - len(s) + 1)) for s in params.stop) if i >= 0]
                if hits:
                    reason, cut = "stop", min(hits)
            if reason is None and len(ids) >= params.max_new_tokens:
                reason = "length"
            if reason is not None:
                break
        text = decode(ids) if cut is None else decode(ids)[:cut]
        end = len(text)
        if reason is None:
            end = len(text.rstrip(REPLACEMENT))
            if params.stop:
                end = min(end, len(text) - look_back)
        end = max(end, sent)
        deltas.append(text[sent:end])
        sent = end
        if reason is not None:
            break
    return deltas, text, reason, ids


def assert_matches_whole_decodes(tokenizer, rounds, params, eos_ids=frozenset()):
    seq, deltas = stream(tokenizer, rounds, params, eos_ids)
    want_deltas, want_text, want_reason, want_ids = whole_decodes(tokenizer, rounds, params, eos_ids)
    assert seq.output_ids == want_ids
    assert seq.finish_reason == want_reason
    assert deltas == want_deltas
    assert seq.text == want_text == "".join(deltas)


PATHS = ["decode_stream", "offsets"]


def through(tok, path: str):
    return tok if path == "decode_stream" else DecodeOnly(tok)


def test_a_fast_tokenizer_streams_through_decode_stream_and_never_calls_decode(smol, monkeypatch):
    monkeypatch.setattr(smol, "decode", lambda *a, **k: pytest.fail("tokenizer.decode was called"))
    ids = smol(SAMPLE)["input_ids"]
    seq, deltas = stream(smol, rounds_of(ids, [1, 3]), SamplingParams(max_new_tokens=len(ids), stop=("zzz",)))
    assert "".join(deltas) == smol.backend_tokenizer.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("sizes", [[1], [2, 5], [4], [7, 1, 3]])
def test_multibyte_characters_split_across_tokens_stream_as_whole_characters(smol, path, sizes):
    ids = smol(SAMPLE * 3)["input_ids"]
    assert any(smol.decode([i]).endswith(REPLACEMENT) for i in ids)  # the sample splits characters
    params = SamplingParams(max_new_tokens=len(ids), stop_on_eos=False)
    assert_matches_whole_decodes(through(smol, path), rounds_of(ids, sizes), params)
    _, deltas = stream(through(smol, path), rounds_of(ids, sizes), params)
    assert REPLACEMENT not in "".join(deltas)


@pytest.mark.parametrize("path", PATHS)
def test_special_tokens_are_left_out_of_the_text(smol, path):
    ids = [IM_START] + smol("assistant\nHi 😀")["input_ids"] + [IM_END, ENDOFTEXT] + smol(" there")["input_ids"]
    params = SamplingParams(max_new_tokens=len(ids), stop_on_eos=False)
    seq, _ = stream(through(smol, path), rounds_of(ids, [2]), params)
    assert seq.text == "assistant\nHi 😀 there"
    assert_matches_whole_decodes(through(smol, path), rounds_of(ids, [2]), params)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("sizes", [[1], [3], [8]])
def test_a_stop_string_spanning_tokens_and_rounds_cuts_the_text_before_it(smol, path, sizes):
    ids = smol(SAMPLE)["input_ids"]
    params = SamplingParams(max_new_tokens=len(ids), stop=("and ☕ cof", "never seen"))
    seq, deltas = stream(through(smol, path), rounds_of(ids, sizes), params)
    assert seq.finish_reason == "stop" and seq.cut_at_stop
    assert seq.text == "".join(deltas) == SAMPLE[: SAMPLE.index("and ☕ cof")]
    assert_matches_whole_decodes(through(smol, path), rounds_of(ids, sizes), params)


@pytest.mark.parametrize("path", PATHS)
def test_a_stop_string_inside_one_token_cuts_mid_token_and_drops_the_rounds_later_tokens(smol, path):
    ids = smol(SAMPLE)["input_ids"]
    params = SamplingParams(max_new_tokens=len(ids), stop=("ff",))  # inside " coffee"
    seq, deltas = stream(through(smol, path), [ids], params)
    assert seq.text == "".join(deltas) == SAMPLE[: SAMPLE.index("ff")]
    assert "ff" in smol.decode(seq.output_ids) and "ff" not in smol.decode(seq.output_ids[:-1])
    assert len(seq.output_ids) < len(ids)


@pytest.mark.parametrize("path", PATHS)
def test_the_last_characters_that_may_begin_a_stop_string_are_held_back_until_the_end(smol, path):
    ids = smol("abc abd abe")["input_ids"]
    params = SamplingParams(max_new_tokens=len(ids), stop=("abz",))  # 2 characters held back
    _, deltas = stream(through(smol, path), rounds_of(ids, [1]), params)
    sent = list(accumulate(deltas))
    texts = [smol.decode(ids[:k]) for k in range(1, len(ids) + 1)]
    assert sent[:-1] == [t[: max(0, len(t) - 2)] for t in texts[:-1]]
    assert sent[-1] == texts[-1] == "abc abd abe"


@pytest.mark.parametrize("path", PATHS)
def test_a_length_finish_inside_a_character_ends_the_text_with_its_replacement(smol, path):
    ids = smol("Tea ☕")["input_ids"][:-1]  # the last of ☕'s three bytes left out
    params = SamplingParams(max_new_tokens=len(ids), stop_on_eos=False)
    seq, deltas = stream(through(smol, path), rounds_of(ids, [1]), params)
    assert seq.finish_reason == "length"
    assert seq.text == smol.decode(ids, skip_special_tokens=True) == "Tea " + REPLACEMENT
    assert "".join(deltas) == seq.text and deltas[-1].endswith(REPLACEMENT)


@pytest.mark.parametrize("path", PATHS)
def test_abort_streams_the_held_back_text(smol, path):
    ids = smol("one two three ☕")["input_ids"][:-1]  # ends inside ☕
    seq = Sequence(
        0,
        "r",
        0,
        [1],
        SamplingParams(max_new_tokens=64, stop=("three!",)),
        frozenset(),
        0,
        0.0,
        tokenizer=through(smol, path),
    )
    sent = seq.append(ids, None, 0.0).text
    assert sent == "one two th"  # the last 5 characters may begin "three!", and the last is incomplete
    last = seq.abort(0.0)
    assert last.finished and last.finish_reason == "abort"
    assert sent + last.text == seq.text == smol.decode(ids, skip_special_tokens=True)


def test_the_offsets_fallback_decodes_a_bounded_window_not_the_whole_output(smol):
    counting = DecodeOnly(smol)
    ids = smol(SAMPLE * 12)["input_ids"]
    assert len(ids) > 400
    seq, deltas = stream(counting, rounds_of(ids, [1, 4]), SamplingParams(max_new_tokens=len(ids), stop=("zq",)))
    assert "".join(deltas) == smol.decode(ids)
    assert max(counting.decoded) <= 16  # the longest character in SAMPLE spans a few tokens
    assert sum(counting.decoded) <= 8 * len(ids)


@pytest.mark.parametrize("path", PATHS)
def test_min_tokens_ignores_a_stop_string_complete_before_it_however_the_rounds_fall(smol, path):
    ids = smol("stop here, then stop again and more words")["input_ids"]
    params = SamplingParams(max_new_tokens=len(ids), min_tokens=3, stop=("stop",))
    texts = {stream(through(smol, path), rounds_of(ids, sizes), params)[0].text for sizes in ([1], [2], [5], [9])}
    assert texts == {"stop here, then "}


@pytest.mark.parametrize("path", PATHS)
def test_a_stop_token_ends_the_output_before_a_stop_string_in_its_own_text(smol, path):
    ids = smol("red green blue")["input_ids"]
    params = SamplingParams(max_new_tokens=len(ids), stop=(" blue",), stop_token_ids=(ids[-1],))
    seq, deltas = stream(through(smol, path), rounds_of(ids, [2]), params)
    assert seq.finish_reason == "stop" and not seq.cut_at_stop
    assert seq.text == "".join(deltas) == "red green blue"


def test_stop_strings_without_a_tokenizer_are_refused():
    with pytest.raises(ValueError, match="stop strings need a tokenizer"):
        Sequence(0, "r", 0, [1], SamplingParams(stop=("x",)), frozenset(), 0, 0.0)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("sizes", [[1], [2], [3, 1], [6]])
def test_sentencepiece_words_and_byte_fallback_characters_stream_as_the_whole_decode(path, sizes):
    tok = llama_style()
    ids = [1] + llama_ids(tok, ["▁Hello", "中", "文", "▁world", "!", "😀", "▁a", "nd", "é", "▁world"]) + [2]
    params = SamplingParams(max_new_tokens=len(ids), stop_on_eos=False)
    assert_matches_whole_decodes(through(tok, path), rounds_of(ids, sizes), params)
    assert stream(through(tok, path), rounds_of(ids, sizes), params)[0].text == "Hello中文 world!😀 andé world"


@pytest.mark.parametrize("path", PATHS)
def test_byte_fallback_cut_inside_a_character_keeps_the_characters_already_streamed(path):
    # The whole decode renders the run of byte tokens as U+FFFD per byte, "中" included ("����");
    # the streamed "中" stays, and the one incomplete byte reads U+FFFD.
    tok = llama_style()
    ids = llama_ids(tok, ["▁Hello", "中"]) + llama_ids(tok, ["文"])[:1]
    seq, deltas = stream(through(tok, path), rounds_of(ids, [1]), SamplingParams(max_new_tokens=len(ids)))
    assert tok.decode(ids) == "Hello" + REPLACEMENT * 4
    assert seq.text == "".join(deltas) == "Hello中" + REPLACEMENT


@pytest.mark.parametrize("path", PATHS)
def test_byte_fallback_run_broken_by_an_invalid_byte_keeps_the_characters_already_streamed(path):
    tok = llama_style()
    ids = llama_ids(tok, ["▁Hello", "中"]) + [tok.get_vocab()["<0x80>"]] + llama_ids(tok, ["▁world"])
    seq, deltas = stream(through(tok, path), rounds_of(ids, [1]), SamplingParams(max_new_tokens=len(ids)))
    assert seq.text == "".join(deltas) == "Hello中" + REPLACEMENT + " world"


@st.composite
def requests(draw, tokenizer, byte_ids, text_ids):
    """Token ids (any id, lone bytes of multi-byte characters, pieces of real text, special tokens), round sizes,
    and sampling parameters with stop strings that often occur in the text."""
    vocab_size = len(tokenizer)
    token = st.one_of(
        st.integers(0, vocab_size - 1),
        st.sampled_from(byte_ids),
        st.sampled_from(text_ids),
        st.sampled_from([ENDOFTEXT, IM_START, IM_END]),
    )
    ids = draw(st.lists(token, min_size=1, max_size=40))
    sizes = draw(st.lists(st.integers(1, 6), min_size=1, max_size=8))
    text = tokenizer.decode(ids, skip_special_tokens=True)
    stops = []
    for _ in range(draw(st.integers(0, 3))):
        if text and draw(st.booleans()):
            i = draw(st.integers(0, len(text) - 1))
            stops.append(text[i : i + draw(st.integers(1, 6))])
        else:
            stops.append(draw(st.text(alphabet=" ae😀世\n.", min_size=1, max_size=4)))
    stops = tuple(s for s in stops if REPLACEMENT not in s)
    max_new = draw(st.integers(1, len(ids)))
    params = SamplingParams(
        max_new_tokens=max_new,
        stop=stops,
        min_tokens=draw(st.integers(0, min(3, max_new))),
        stop_on_eos=draw(st.booleans()),
        stop_token_ids=tuple(draw(st.lists(st.sampled_from(ids), max_size=1))),
    )
    return rounds_of(ids, sizes), params


@pytest.mark.parametrize("path", PATHS)
def test_random_outputs_in_random_rounds_stream_exactly_what_whole_decodes_give(smol, byte_ids, path):
    text_ids = sorted(set(smol(SAMPLE)["input_ids"]))

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(requests(smol, byte_ids, text_ids))
    def check(request):
        rounds, params = request
        assert_matches_whole_decodes(through(smol, path), rounds, params, eos_ids=frozenset({IM_END}))

    check()

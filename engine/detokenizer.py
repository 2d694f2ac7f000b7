"""A request's output text, decoded as its tokens arrive: each round decodes only its new tokens and the few
before them, and stop strings are looked for only in the newest characters.

Two decoders, one technique (a window of the ids of the last final piece, as context for leading spaces, then the
ids not final yet; the new text is the window's text past the context's):
- a fast (Rust) tokenizer: the tokenizers library's `DecodeStream` over `tokenizer.backend_tokenizer`;
- any other (a slow tokenizer, a test double): the same through its own `decode`.

The text is `tokenizer.decode(output_ids, skip_special_tokens=True)` exactly wherever decoding more ids only
appends to the text once it ends in a complete character: byte-level BPE (GPT-2, Qwen, SmolLM, Llama 3) and
SentencePiece pieces. A byte-fallback decoder (Llama 2, Mistral) renders a whole run of byte tokens as one U+FFFD
per byte when the run holds an invalid byte or ends inside a character, so its whole decode can turn characters
already streamed back into U+FFFD; here they stay, and only the bytes that are broken read U+FFFD.
"""

from __future__ import annotations

import logging
from functools import partial

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

logger = logging.getLogger(__name__)

REPLACEMENT = "\ufffd"  # what a tokenizer decodes an incomplete UTF-8 character to


class IncrementalDecoder:
    """Decodes a growing list of token ids a bounded window at a time.

    `push` returns the text that became final (no later id changes it): it ends in a complete character. The ids
    after it are the pending ones; `tail()` is their text as the whole decode has it now (an incomplete character
    decodes to U+FFFD, which a later id may still complete).
    """

    def __init__(self, tokenizer) -> None:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        # transformers applies clean_up_tokenization_spaces after the backend's decode; DecodeStream would not.
        if isinstance(backend, Tokenizer) and not getattr(tokenizer, "clean_up_tokenization_spaces", False):
            self._backend: Tokenizer | None = backend
            self._stream: DecodeStream | None = DecodeStream(skip_special_tokens=True)
            self._decode = partial(backend.decode, skip_special_tokens=True)
        else:
            self._backend = self._stream = None
            self._decode = partial(tokenizer.decode, skip_special_tokens=True)
        self._window: list[int] = []  # the ids of the last final piece, then the pending ids
        self._read = 0  # where the pending ids begin in _window
        self._context: str | None = ""  # decode(_window[:_read]); None until needed
        self._tail: str | None = ""  # the pending ids' text; None until needed

    def push(self, ids: list[int]) -> str:
        """Add ids; the text that became final with them ("" while a character is incomplete)."""
        if self._stream is not None:
            try:
                piece = self._stream.step(self._backend, ids)
            except Exception as err:  # the tokenizers binding raises a bare Exception
                if "Invalid prefix" not in str(err):
                    raise
                # The window's text no longer begins with the context's (see _pending_text): go on by offsets.
                logger.debug("DecodeStream cannot follow this tokenizer's decoder (%s); decoding by offsets", err)
                self._stream = None
            else:
                self._window += ids
                if piece is None:
                    self._tail = None
                    return ""
                self._advance()
                return piece
        self._window += ids
        pending = self._pending_text()
        if pending and not pending.endswith(REPLACEMENT):
            self._advance()
            return pending
        self._tail = pending
        return ""

    def tail(self) -> str:
        """The pending ids' text ("" when every id is in final text)."""
        if self._tail is None:
            self._tail = self._pending_text()
        return self._tail

    def _pending_text(self) -> str:
        """The window's text past the context's. Where it does not begin with the context's (a byte-fallback
        decoder renders a run of byte tokens that holds an invalid byte as U+FFFD per byte, the context's bytes
        too), the pending ids' own text: the characters already final stay as they are."""
        text = self._decode(self._window)
        if self._context is None:
            self._context = self._decode(self._window[: self._read])
        if text.startswith(self._context):
            return text[len(self._context) :]
        return self._decode(self._window[self._read :])

    def _advance(self) -> None:
        """Every id is final: the ids just decoded become the context for the next ones."""
        self._window = self._window[self._read :]
        self._read = len(self._window)
        self._context, self._tail = None, ""


class OutputText:
    """A request's output text as its tokens arrive: what is final, what a later token may still change, what was
    streamed, and where a stop string cut it.

    Text that no later step reads (streamed, and before the stop-string look-back) is set aside in pieces, so a
    round touches only its own characters plus the longest stop string's length.
    """

    def __init__(self, tokenizer, stop: tuple[str, ...] = ()) -> None:
        self._decoder = IncrementalDecoder(tokenizer)
        self._stop = stop
        self._look_back = max((len(s) for s in stop), default=1) - 1  # characters a stop string may reach back
        self._done: list[str] = []  # final text before _open_start
        self._open = ""  # final text from _open_start on
        self._open_start = 0
        self._final_len = 0
        self._stable = 0  # with stop strings: the length of text no later token changes
        self._sent = 0  # characters streamed
        self._cut: int | None = None  # where a stop string begins, once one was found

    @property
    def cut_at_stop(self) -> bool:
        return self._cut is not None

    @property
    def text(self) -> str:
        """The whole text so far (cut before a stop string once one was found)."""
        text = "".join(self._done) + self._open + self._decoder.tail()
        return text if self._cut is None else text[: self._cut]

    def add(self, ids: list[int], check_stop: bool = False) -> bool:
        """Decode `ids`; with `check_stop`, True (and the text cut before it) when a stop string ends in their text.

        A match must end after the text that was complete before `ids` (an earlier one was found, or ignored
        under min_tokens, then), so each stop string s is looked for from len(s) - 1 characters before it.
        """
        before = self._stable
        piece = self._decoder.push(ids)
        self._open += piece
        self._final_len += len(piece)
        if not self._stop:
            return False
        region = self._open + self._decoder.tail()  # the text from _open_start on
        if check_stop:
            starts = (region.find(s, max(0, before - (len(s) - 1) - self._open_start)) for s in self._stop)
            found = [i for i in starts if i >= 0]
            if found:
                self._cut = self._open_start + min(found)
                return True
        self._stable = self._open_start + len(region.rstrip(REPLACEMENT))
        return False

    def delta(self, finished: bool) -> str:
        """The text to stream now: all of it once finished, else what no later token can change or cut (a trailing
        incomplete character and the last len(longest stop string) - 1 characters are held back)."""
        region = self._open + self._decoder.tail()
        if self._cut is not None:
            region = region[: self._cut - self._open_start]
        end = self._open_start + len(region)
        if not finished:
            end = self._open_start + len(region.rstrip(REPLACEMENT))
            if self._stop:
                end = min(end, self._open_start + len(region) - self._look_back)
        end = max(end, self._sent)
        delta = region[self._sent - self._open_start : end - self._open_start]
        self._sent = end
        self._set_aside()
        return delta

    def _set_aside(self) -> None:
        """Move final text that neither the stream nor a stop-string search reads again out of _open."""
        keep_from = self._sent if not self._stop else min(self._sent, self._stable - self._look_back)
        start = min(keep_from, self._final_len)
        if start > self._open_start:
            self._done.append(self._open[: start - self._open_start])
            self._open = self._open[start - self._open_start :]
            self._open_start = start

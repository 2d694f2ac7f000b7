"""From an OpenAI request to what the engine takes: prompt token ids and SamplingParams.

Completions take raw text (no chat template) or token ids; chat completions go through the
tokenizer's chat template, system prompt included. Bad values raise ValueError, or an APIError naming the field
(a 400); a request that does not fit the context raises the APIError `context_length_exceeded`. A text prompt is
measured before it is tokenized whole: prefixes of growing size are tokenized until one holds more tokens than the
context, so a huge prompt costs about a context's worth of tokenizing, not its own size. These run off the event loop
(server.context.ServingContext.off_loop): tokenizing is the CPU-heavy part of a request's arrival.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http import HTTPStatus

from engine import SamplingParams
from server.engine_api import ServedModel
from server.errors import APIError, context_length_exceeded
from server.protocol import ChatCompletionRequest, CompletionRequest, SamplingRequest

DEFAULT_CHAT_TOKENS = 512  # max_tokens of a chat request that sets none (see default_max_tokens)
CHARS_PER_TOKEN = 4  # the first prefix measured: this many characters per token of the context
PREFIX_SLACK_TOKENS = 32  # a prefix cut inside a word may tokenize to a few more tokens than that part of the whole


def max_model_len(model: ServedModel) -> int | None:
    """The most tokens prompt + max_tokens may hold (the engine's room for an empty prompt: SD and SSD keep K + 1
    positions for a round's speculation), None when the model states no limit."""
    return model.room([])


def tokens_beyond(encode: Callable[[str], list[int]], text: str, most_tokens: int | None) -> int | None:
    """None, unless a prefix of `text` is seen to hold more than `most_tokens` tokens: then a floor of the whole's
    token count. Prefixes from (most_tokens + slack) × CHARS_PER_TOKEN characters, each twice the last, stop
    at the first too long; a text shorter than the first prefix is not tokenized at all."""
    size = None if most_tokens is None else (most_tokens + PREFIX_SLACK_TOKENS) * CHARS_PER_TOKEN
    while size is not None and size < len(text):
        prefix = text[:size]
        if prefix.strip():  # an all-blank prefix has no tokens to count
            count = len(encode(prefix))
            if count > most_tokens + PREFIX_SLACK_TOKENS:
                return count - PREFIX_SLACK_TOKENS
        size *= 2
    return None


def completion_prompt(model: ServedModel, request: CompletionRequest) -> list[int]:
    limit = max_model_len(model)
    with naming("prompt"):
        if isinstance(request.prompt, str):

            def encode(text: str) -> list[int]:
                return model.encode(text, chat=False)

            floor = tokens_beyond(encode, request.prompt, None if limit is None else limit - 1)
            if floor is not None:
                raise context_length_exceeded(limit, floor, None, "prompt")
            ids = encode(request.prompt)
        else:
            ids = model.encode(list(request.prompt))  # checks the ids against the vocabulary
    check_fits(model, ids, request.max_new_tokens, "prompt")
    return ids


def chat_prompt(model: ServedModel, request: ChatCompletionRequest) -> list[int]:
    limit = max_model_len(model)
    text = "\n".join(m.content for m in request.messages)  # the messages' text: the template only adds to it
    with naming("messages"):
        floor = tokens_beyond(lambda t: model.encode(t, chat=False), text, None if limit is None else limit - 1)
        if floor is not None:
            raise context_length_exceeded(limit, floor, None, "messages")
        ids = model.encode_chat([m.as_template_message() for m in request.messages])
    if request.max_new_tokens is not None:
        check_fits(model, ids, request.max_new_tokens, "messages")
    return ids


def check_fits(model: ServedModel, prompt_ids: list[int], max_tokens: int, param: str) -> None:
    """The APIError `context_length_exceeded` unless prompt + max_tokens fit the model's context."""
    limit = max_model_len(model)
    if limit is not None and len(prompt_ids) + max_tokens > limit:
        raise context_length_exceeded(limit, len(prompt_ids), max_tokens, param)


def default_max_tokens(model: ServedModel, prompt_ids: list[int]) -> int:
    """Chat without max_tokens: DEFAULT_CHAT_TOKENS, or less where the context has less room left.

    OpenAI's default is the rest of the context; on a CPU that can mean minutes of generation, so the
    default is capped. The room is the engine's (SD and SSD keep K + 1 positions for a round's speculation).
    """
    room = model.room(prompt_ids)
    if room is None:
        return DEFAULT_CHAT_TOKENS
    if room < 1:
        raise context_length_exceeded(max_model_len(model), len(prompt_ids), None, "messages")
    return min(room, DEFAULT_CHAT_TOKENS)


@contextmanager
def naming(param: str) -> Iterator[None]:
    """A ValueError raised inside (the engine's word on a prompt: empty, ids outside the vocabulary) becomes a 400
    whose `param` is `param`."""
    try:
        yield
    except ValueError as err:
        raise APIError(HTTPStatus.BAD_REQUEST, str(err), param=param) from err


def sampling_params(request: SamplingRequest, max_new_tokens: int, logprobs: int | None) -> SamplingParams:
    """The engine's SamplingParams for one request (OpenAI's defaults: temperature 1, top_p 1)."""
    if request.min_tokens > max_new_tokens:  # the one check that needs max_tokens, which a chat may leave out
        raise APIError(
            HTTPStatus.BAD_REQUEST,
            f"min_tokens ({request.min_tokens}) must not exceed max_tokens ({max_new_tokens})",
            param="min_tokens",
        )
    return SamplingParams(
        temperature=1.0 if request.temperature is None else request.temperature,
        top_k=request.top_k_or_none,
        top_p=None if request.top_p is None or request.top_p == 1 else request.top_p,
        max_new_tokens=max_new_tokens,
        seed=request.seed,
        stop=tuple(request.stop),
        stop_token_ids=tuple(request.stop_token_ids or ()),
        logprobs=logprobs,
        logprobs_mode=request.logprobs_mode,
        sampling_mode=request.sampling_mode,
        stop_on_eos=not request.ignore_eos,
        min_tokens=request.min_tokens,
    )


def completion_request(model: ServedModel, request: CompletionRequest) -> tuple[list[int], SamplingParams]:
    """Prompt ids and SamplingParams of a completion (ValueError / APIError for a bad one)."""
    return completion_prompt(model, request), sampling_params(request, request.max_new_tokens, request.logprobs)


def chat_request(model: ServedModel, request: ChatCompletionRequest) -> tuple[list[int], SamplingParams]:
    """Prompt ids and SamplingParams of a chat completion (ValueError / APIError for a bad one)."""
    prompt_ids = chat_prompt(model, request)
    max_new = request.max_new_tokens or default_max_tokens(model, prompt_ids)
    return prompt_ids, sampling_params(request, max_new, request.logprobs_n)

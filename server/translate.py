"""From an OpenAI request to what the engine takes: prompt token ids and SamplingParams.

Completions take raw text (no chat template) or token ids; chat completions go through the
tokenizer's chat template, system prompt included. Bad values raise ValueError (a 400).
"""

from __future__ import annotations

from engine import SamplingParams
from server.engine_api import ServedModel
from server.protocol import ChatCompletionRequest, CompletionRequest, SamplingRequest

DEFAULT_CHAT_TOKENS = 512  # max_tokens of a chat request that sets none (see default_max_tokens)


def completion_prompt(model: ServedModel, request: CompletionRequest) -> list[int]:
    if isinstance(request.prompt, str):
        return model.encode(request.prompt, chat=False)
    return list(request.prompt)


def chat_prompt(model: ServedModel, request: ChatCompletionRequest) -> list[int]:
    return model.encode_chat([m.as_template_message() for m in request.messages])


def default_max_tokens(model: ServedModel, prompt_ids: list[int]) -> int:
    """Chat without max_tokens: DEFAULT_CHAT_TOKENS, or less where the context has less room left.

    OpenAI's default is the rest of the context; on a CPU that can mean minutes of generation, so the
    default is capped. The room is the engine's (SD and SSD keep K + 1 positions for a round's speculation).
    """
    room = model.room(prompt_ids)
    if room is None:
        return DEFAULT_CHAT_TOKENS
    if room < 1:
        raise ValueError(f"the messages have {len(prompt_ids)} tokens, and the model's context of "
                         f"{model.max_context} leaves no room for an answer: shorten them")
    return min(room, DEFAULT_CHAT_TOKENS)


def sampling_params(request: SamplingRequest, max_new_tokens: int, logprobs: int | None) -> SamplingParams:
    """The engine's SamplingParams for one request (OpenAI's defaults: temperature 1, top_p 1)."""
    return SamplingParams(
        temperature=1.0 if request.temperature is None else request.temperature,
        top_k=request.top_k_or_none,
        top_p=None if request.top_p is None or request.top_p == 1 else request.top_p,
        max_new_tokens=max_new_tokens,
        seed=request.seed,
        stop=tuple(request.stop),
        logprobs=logprobs,
        stop_on_eos=not request.ignore_eos,
    )

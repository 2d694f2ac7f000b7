"""OpenAI request bodies as pydantic models: types are strict, ranges checked, unknown fields ignored.

What the engine cannot do is refused here with a 400 that names the field (several prompts, n > 1, echo,
penalties, logit bias, tools and tool_choice, functions, structured output, audio, predicted output, vLLM's
guided decoding and beam search), rather than silently ignored. A field is refused only when it asks for
something: its neutral value (null, "text", tool_choice "none", ...) is accepted.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from engine.sampling_params import MAX_LOGPROBS, MAX_SEED, LogprobsMode, SamplingMode

MAX_STOP_STRINGS = 4  # OpenAI's limit
DEFAULT_COMPLETION_TOKENS = 16  # OpenAI's default max_tokens for /v1/completions

# Fields this server cannot honour: what each may be without asking for anything, and why the rest is refused.
NOT_SUPPORTED = {
    "response_format": (
        (None, {"type": "text"}),
        'structured output is not supported: leave it out or use {"type": "text"}',
    ),
    "tool_choice": ((None, "none"), 'tools are not supported: leave it out or use "none"'),
    "functions": ((None, []), "function calling is not supported"),
    "function_call": ((None, "none"), "function calling is not supported"),
    "audio": ((None,), "audio output is not supported"),
    "modalities": ((None, ["text"]), 'only text output is supported: leave it out or use ["text"]'),
    "prediction": ((None,), "predicted outputs are not supported"),
    "guided_json": ((None,), "guided decoding is not supported"),
    "guided_regex": ((None,), "guided decoding is not supported"),
    "guided_choice": ((None,), "guided decoding is not supported"),
    "guided_grammar": ((None,), "guided decoding is not supported"),
    "structured_outputs": ((None,), "structured output is not supported"),
    "use_beam_search": ((None, False), "beam search is not supported"),
    "repetition_penalty": ((None, 1, 1.0), "penalties are not supported: leave it at 1"),
    "min_p": ((None, 0, 0.0), "min_p is not supported: leave it at 0"),
}


class _Request(BaseModel):
    # JSON as Python reads it allows NaN and Infinity: no field takes them
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


class StreamOptions(_Request):
    include_usage: bool = False


class SamplingRequest(_Request):
    """Parameters shared by completions and chat completions."""

    model: str
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    # An extension (vLLM's): None, 0 or -1 mean "off", as in vLLM's clients.
    top_k: int | None = Field(None, ge=-1)
    seed: int | None = Field(None, ge=0)
    stop: list[str] = []
    n: int = Field(1, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False  # an extension (vLLM's)
    min_tokens: int = Field(0, ge=0)  # an extension (vLLM's): EOS and stop tokens held back until then
    stop_token_ids: list[int] | None = None  # an extension (vLLM's)
    logprobs_mode: LogprobsMode = LogprobsMode.RAW  # an extension: "processed_logprobs" for the sampled distribution
    # An extension: "invariant" for drafter-invariant sampling (the same text for a seed with AR, SD or SSD)
    sampling_mode: SamplingMode = SamplingMode.STANDARD
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    response_format: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    audio: Any = None
    modalities: Any = None
    prediction: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    structured_outputs: Any = None
    use_beam_search: Any = None
    repetition_penalty: Any = None
    min_p: Any = None

    @field_validator(*NOT_SUPPORTED)
    @classmethod
    def _not_supported(cls, value: Any, info: ValidationInfo) -> Any:
        neutral, why = NOT_SUPPORTED[info.field_name]
        if value in neutral:  # compared by ==: {"type": "text"} and 1.0 are neutral as written
            return value
        raise ValueError(why)

    @field_validator("logprobs_mode", "sampling_mode", mode="before")
    @classmethod
    def _mode(cls, mode: Any, info: ValidationInfo) -> LogprobsMode | SamplingMode:
        """One of the field's enum's values (strict mode takes no string for an enum by itself)."""
        kind = cls.model_fields[info.field_name].annotation
        try:
            return kind(mode)
        except ValueError:
            raise ValueError(f"must be one of {', '.join(m.value for m in kind)}") from None

    @field_validator("seed")
    @classmethod
    def _seed_fits(cls, seed: int | None) -> int | None:
        if seed is not None and seed > MAX_SEED:
            raise ValueError(f"must be at most 2**63 - 1, got {seed}: take it modulo 2**63")
        return seed

    @field_validator("stream_options")
    @classmethod
    def _stream_options_need_stream(cls, options: StreamOptions | None, info: ValidationInfo) -> StreamOptions | None:
        if options is not None and not info.data.get("stream"):
            raise ValueError("only allowed with stream: true")
        return options

    @field_validator("stop_token_ids")
    @classmethod
    def _stop_token_ids(cls, ids: list[int] | None) -> list[int] | None:
        if ids is not None and any(t < 0 for t in ids):
            raise ValueError("token ids must be >= 0")
        return ids

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_strings(cls, stop: Any) -> list[str]:
        strings = [stop] if isinstance(stop, str) else [] if stop is None else stop
        if not isinstance(strings, list) or not all(isinstance(s, str) for s in strings):
            raise ValueError("must be a string or a list of strings")
        if len(strings) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(strings)}")
        if any(not s for s in strings):
            raise ValueError("stop strings must not be empty")
        return strings

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int) -> int:
        if n > 1:
            raise ValueError(f"n={n} is not supported (only n=1): send {n} requests instead")
        return n

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalty(cls, penalty: float | None) -> float | None:
        if penalty:
            raise ValueError("penalties are not supported: leave them at 0")
        return penalty

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        if bias:
            raise ValueError("logit_bias is not supported")
        return bias

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def top_k_or_none(self) -> int | None:
        return None if self.top_k is None or self.top_k <= 0 else self.top_k


class CompletionRequest(SamplingRequest):
    """POST /v1/completions: one prompt, as text or as token ids."""

    prompt: Any
    max_tokens: int | None = Field(None, ge=1)
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    best_of: int | None = Field(None, ge=1)
    suffix: str | None = None

    @property
    def max_new_tokens(self) -> int:
        return DEFAULT_COMPLETION_TOKENS if self.max_tokens is None else self.max_tokens

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, prompt: Any) -> str | list[int]:
        """A string or a list of token ids; a list holding exactly one of those is unwrapped."""
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return prompt
        if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
            raise ValueError(
                f"got {len(prompt)} prompts; only one prompt per request is supported: send one request per prompt"
            )
        if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            if not prompt:
                raise ValueError("empty prompt: give some text or at least one token id")
            return prompt
        raise ValueError("must be a string or a list of token ids (integers)")

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, echo: bool) -> bool:
        if echo:
            raise ValueError("echo is not supported")
        return echo

    @field_validator("best_of")
    @classmethod
    def _no_best_of(cls, best_of: int | None) -> int | None:
        if best_of is not None and best_of > 1:
            raise ValueError(f"best_of={best_of} is not supported (only 1)")
        return best_of

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, suffix: str | None) -> str | None:
        if suffix:
            raise ValueError("suffix is not supported")
        return suffix


class ChatMessage(_Request):
    """One message; `developer` is OpenAI's newer name for `system`."""

    role: Literal["system", "developer", "user", "assistant"]
    content: str = ""

    @field_validator("content", mode="before")
    @classmethod
    def _text(cls, content: Any) -> str:
        """A string, or a list of text parts (joined); images and audio are refused."""
        if content is None or isinstance(content, str):
            return content or ""
        if isinstance(content, list) and all(isinstance(p, dict) for p in content):
            if all(p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
                return "".join(p["text"] for p in content)
            raise ValueError("only text content parts ({type: text, text: ...}) are supported")
        raise ValueError("must be a string or a list of text parts")

    def as_template_message(self) -> dict[str, str]:
        """The message as a chat template reads it (`developer` is `system` there)."""
        return {"role": "system" if self.role == "developer" else self.role, "content": self.content}


class ChatCompletionRequest(SamplingRequest):
    """POST /v1/chat/completions: messages through the tokenizer's chat template."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tools: list[Any] | None = None

    @field_validator("tools")
    @classmethod
    def _no_tools(cls, tools: list[Any] | None) -> list[Any] | None:
        if tools:
            raise ValueError("tools are not supported")
        return tools

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_need_logprobs(cls, top: int | None, info: ValidationInfo) -> int | None:
        # fields are checked in the order they are declared: `logprobs` before this one
        if top is not None and not info.data.get("logprobs"):
            raise ValueError("needs logprobs: true")
        return top

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def logprobs_n(self) -> int | None:
        """The engine's `logprobs`: None, or how many top alternatives to return with each token."""
        return (self.top_logprobs or 0) if self.logprobs else None

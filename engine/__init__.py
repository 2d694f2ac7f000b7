"""The generation engine: AR, synchronous SD and asynchronous SSD on transformers models.

A request's path: `LLM` (llm) or `AsyncLLM` (async_llm) -> the one decode loop (decode_loop: scheduler,
sequence) -> each round, a proposer (strategies/: ar, sd, ssd) drafts x and q (drafting; SSD's draft worker
in ssd/, behind a channel) -> the target verifies them (verifier, sampling, kv_cache) -> the sequence emits
its tokens (outputs) and the round is recorded (recorder, metrics). Models come from loading/ (catalogue,
provisioning, caches, GGUF, quantisation); settings are frozen dataclasses (config, sampling_params). With
`compile`, forwards run on a static slot cache (static_cache) in compiled buckets (compiled); with `tp`, the
target runs over tensor-parallel ranks (tp/). Every time the engine acts on goes through one stopwatch (timing:
CUDA events on a GPU), and what crosses between host and device each round goes through host (pinned,
non-blocking copies; one wait per read).

Names are imported on first use, so that `engine.config` or `engine.sampling_params` (plain
dataclasses) can be read by the CLI and the benchmark configuration without importing torch.
"""

from importlib import import_module

_EXPORTS = {
    "LLM": "engine.llm",
    "Generation": "engine.outputs",
    "RequestOutput": "engine.outputs",
    "Chunk": "engine.outputs",
    "TokenLogprob": "engine.outputs",
    "AsyncLLM": "engine.async_llm",
    "EngineStopped": "engine.async_llm",
    "EngineFailed": "engine.async_llm",
    "QueueFull": "engine.decode_loop",
    "ServingStats": "engine.metrics",
    "SamplingParams": "engine.sampling_params",
    "SamplingMode": "engine.sampling_params",
    "SpeculativeConfig": "engine.config",
    "QuantConfig": "engine.config",
    "load_model": "engine.loading.models",
    "Strategy": "theory.glossary",
    "Backup": "theory.glossary",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")

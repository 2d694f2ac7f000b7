"""Loading causal LMs: packaged aliases, local folders and GGUF files; tiny seeded models for tests.

`load_model("qwen-coder-1.5b")` provisions the alias into the cache the first time (minutes) and
afterwards loads the float32 safetensors from the cache in seconds, cast to the dtype asked for. The first
bfloat16 load keeps a bfloat16 copy in the cache folder, which later bfloat16 loads read (engine/bf16_copy.py).
`load_quantized(spec, "int8" | "int4", group_size)` (engine/lowbit_models.py, re-exported here) gives the
model with low-bit weight-only Linear layers (engine.quantize): from the low-bit cache (engine.lowbit_cache)
when it has the model, else quantised from the float32 weights at load.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from transformers.utils import logging as hf_logging

from engine import bf16_copy, model_cache, provision

logger = logging.getLogger(__name__)

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Any of these in a folder means it carries a tokenizer (fast, config-only or sentencepiece).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


@dataclass(frozen=True)
class LoadedModel:
    model: PreTrainedModel  # eval mode, requires_grad off
    tokenizer: PreTrainedTokenizerBase | None  # None for a folder saved without one
    name: str  # the alias, or the folder / file name
    source: Path  # the folder resolved (a cache folder's bfloat16 copy lives inside it)


def _checked(folder: Path, verify: bool) -> Path:
    try:
        model_cache.check_folder(folder, verify=verify)
    except model_cache.CorruptCacheError as err:
        raise model_cache.CorruptCacheError(
            f"refusing to load it: {err}; repair it with `{provision.repair_command(folder)}`"
        ) from err
    return folder


def check_device(device: str | torch.device) -> torch.device:
    """The torch device for `device`, refused with a ValueError unless this machine has it."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"unknown device {str(device)!r}; use cpu, cuda or cuda:N") from err
    if parsed.type == "cpu":
        return parsed
    backend = getattr(torch, parsed.type, None)  # torch.cuda, torch.mps, torch.xpu
    if parsed.type == "mps":
        backend = torch.backends.mps
    if backend is None or not hasattr(backend, "is_available"):
        raise ValueError(f"unsupported device {str(device)!r}; use cpu, cuda or cuda:N")
    if not backend.is_available():
        raise ValueError(
            f"device {str(device)!r} is not available here (this torch build or machine has no "
            f"{parsed.type.upper()} device); use --device cpu"
        )
    count = backend.device_count() if hasattr(backend, "device_count") else 1
    if parsed.index is not None and parsed.index >= count:
        raise ValueError(
            f"device {str(device)!r} does not exist: this machine has {count} {parsed.type} "
            f"device(s), {parsed.type}:0 to {parsed.type}:{count - 1}"
        )
    return parsed


AUTO_DTYPE = "auto"


def fast_bfloat16(device: torch.device) -> bool:
    """Whether torch multiplies bfloat16 matrices at speed on `device`: a CUDA device with bf16 support, or a
    CPU on which torch's oneDNN has bf16 kernels (AVX-512 or AMX on x86, BF16 on Arm). On an AVX2-only CPU
    torch falls back to a reference GEMM: measured on a 2-core AMD EPYC (Zen 3, AVX2), a 64-row bf16 linear of
    the 1.5B target's MLP took 179 ms against float32's 38, and its 160-token prefill 39.8 s against 6.6. A GPU
    that only emulates bf16 (before Ampere) does not count."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    if device.type == "cpu":
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return False


def resolve_dtype(dtype: str, device: str | torch.device = "cpu") -> str:
    """The float dtype to load in: `dtype` itself, or for "auto" bfloat16 where the device computes in it at
    speed (`fast_bfloat16`), else float16 on a GPU and float32 on a CPU. Unknown names raise ValueError."""
    if dtype in TORCH_DTYPES:
        return dtype
    if dtype != AUTO_DTYPE:
        raise ValueError(f"unknown dtype {dtype!r}; choose from {AUTO_DTYPE}, {', '.join(TORCH_DTYPES)}")
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        parsed = None  # refused where the device is used (check_device), after the configuration's own checks
    if parsed is not None and parsed.type == "cuda" and torch.cuda.is_available():
        chosen = "bfloat16" if fast_bfloat16(parsed) else "float16"
    elif parsed is not None and parsed.type == "cpu":
        chosen = "bfloat16" if fast_bfloat16(parsed) else "float32"
    else:
        chosen = "float32"  # a device this machine lacks: it is refused before anything loads
    logger.info("dtype auto: %s on %s%s", chosen, device,
                "" if chosen == "bfloat16" else " (no fast bfloat16 matrix multiply here)")
    return chosen


def resolve_folder(spec: str | os.PathLike[str], root: Path, *, verify: bool = False) -> tuple[Path, str]:
    """The transformers folder to load for `spec`, provisioning aliases and GGUF files on first use."""
    alias = str(spec)
    if alias in provision.PACKAGED:
        folder = root / provision.PACKAGED[alias].key
        if folder.exists():  # present but damaged: refuse rather than silently rebuild on load
            return _checked(folder, verify), alias
        return provision.provision(alias, root).folder, alias
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        folder = root / provision.gguf_file_key(model_cache.sha256_file(path))
        if folder.exists():
            return _checked(folder, verify), path.stem
        return provision.provision_gguf_file(path, root).folder, path.stem
    if path.is_dir() and (path / model_cache.MANIFEST_NAME).is_file():
        return _checked(path, verify), path.name
    if path.is_dir() and (path / "config.json").is_file():
        return path, path.name
    raise ValueError(
        f"cannot load {str(spec)!r}: expected a model alias ({', '.join(provision.PACKAGED)}), "
        "a local transformers causal-LM folder (with config.json), or a local .gguf file"
    )


@contextmanager
def _quiet_progress(show: bool) -> Iterator[None]:
    """Hide transformers' per-tensor "Loading weights" bar unless progress is logged; restore after."""
    was_on = hf_logging.is_progress_bar_enabled()
    if was_on and not show:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on and not show:
            hf_logging.enable_progress_bar()


def load_model(
    spec: str | os.PathLike[str] = provision.DEFAULT_TARGET,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    cache_dir: str | os.PathLike[str] | None = None,
    verify: bool = False,
) -> LoadedModel:
    """Load a causal LM and its tokenizer; `verify=True` re-hashes a cache folder's files first.

    A folder that transformers cannot read (malformed config.json, no or damaged weights, bad
    tokenizer files) and a device this machine lacks raise ValueError naming what to fix.
    """
    device = check_device(device)  # before minutes of loading
    root = model_cache.resolve_cache_root(cache_dir, os.environ)
    folder, name = resolve_folder(spec, root, verify=verify)
    t0 = time.perf_counter()
    logger.info("loading %s (%s) from %s ...", name, str(dtype).removeprefix("torch."), folder)
    weights, keep_copy = folder, False
    if dtype == torch.bfloat16 and (folder / model_cache.MANIFEST_NAME).is_file():
        # A cache folder (float32, checked by resolve_folder): its bf16 copy if listed, else write one.
        copy = bf16_copy.listed_copy(folder, model_cache.read_manifest(folder))
        weights, keep_copy = (copy, False) if copy is not None else (folder, True)
    # The folder is local: local_files_only keeps transformers from ever asking a hub.
    try:
        with _quiet_progress(logger.isEnabledFor(logging.INFO)):
            model = AutoModelForCausalLM.from_pretrained(weights, dtype=dtype, local_files_only=True)
    except (OSError, SafetensorError) as err:
        raise ValueError(
            f"cannot load the model in {weights}: {err}; it needs a valid config.json and complete "
            "*.safetensors weights (save it again with save_pretrained, or copy it again)"
        ) from err
    if keep_copy:
        logger.info("keeping a bfloat16 copy of %s in its cache folder (once) ...", name)
        bf16_copy.write_copy(folder, model)  # once per cache folder, before the model leaves the CPU
    model = model.to(device).eval().requires_grad_(False)
    tokenizer = None
    if any((folder / file).is_file() for file in TOKENIZER_FILES):
        try:
            tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        except (OSError, ValueError, TypeError) as err:
            raise ValueError(
                f"cannot load the tokenizer in {folder}: {err}; save its tokenizer again "
                "(tokenizer.save_pretrained) or remove its tokenizer files"
            ) from err
    logger.info("loaded %s in %.1f s (%s, %s)", name, time.perf_counter() - t0, str(dtype).removeprefix("torch."),
                device)
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, source=folder)


@dataclass(frozen=True)
class Vocabulary:
    """What must agree between a target and its draft: logit rows, embedding rows, token ids."""

    name: str
    logits: int
    embeddings: int
    tokens: Mapping[str, int] | None  # None when there is no tokenizer (tiny test models)
    eos_token_id: int | None


def vocabulary(item: LoadedModel | PreTrainedModel | str | os.PathLike[str]) -> Vocabulary:
    """The vocabulary of a loaded model, a bare model, or a transformers folder (no weights read)."""
    if isinstance(item, LoadedModel):
        emb = item.model.get_input_embeddings().num_embeddings
        # out_features exists on nn.Linear and on its low-bit WeightOnlyLinear replacement alike.
        logits = item.model.get_output_embeddings().out_features
        tok = item.tokenizer
        if tok is None:
            return Vocabulary(item.name, logits, emb, None, None)
        return Vocabulary(item.name, logits, emb, tok.get_vocab(), tok.eos_token_id)
    if isinstance(item, PreTrainedModel):
        emb = item.get_input_embeddings().num_embeddings
        logits = item.get_output_embeddings().out_features
        return Vocabulary(type(item).__name__, logits, emb, None, None)
    folder = Path(item)
    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    return Vocabulary(folder.name, config.vocab_size, config.vocab_size, tok.get_vocab(), tok.eos_token_id)


def check_compatible(
    target: LoadedModel | PreTrainedModel | str | os.PathLike[str],
    draft: LoadedModel | PreTrainedModel | str | os.PathLike[str],
) -> None:
    """Raise ValueError unless target and draft share one vocabulary (speculation compares ids)."""
    t, d = vocabulary(target), vocabulary(draft)
    what = f"target {t.name} and draft {d.name} have different vocabularies"
    fix = "speculative decoding needs a draft that uses the target's tokenizer"
    if (t.logits, t.embeddings) != (d.logits, d.embeddings):
        raise ValueError(
            f"{what}: {t.logits} vs {d.logits} logits, {t.embeddings} vs {d.embeddings} embeddings; {fix}"
        )
    if t.tokens is not None and d.tokens is not None:
        if t.tokens != d.tokens:
            differ = sorted(set(t.tokens.items()) ^ set(d.tokens.items()))[:3]
            raise ValueError(f"{what}: {len(t.tokens)} vs {len(d.tokens)} tokens, e.g. {differ}; {fix}")
        if t.eos_token_id != d.eos_token_id:
            raise ValueError(f"{what}: eos ids {t.eos_token_id} vs {d.eos_token_id}; {fix}")


def tiny_model(
    *,
    vocab_size: int = 32,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    seed: int = 0,
    max_position_embeddings: int = 512,
    logit_scale: float = 1.0,
) -> Qwen2ForCausalLM:
    """A random fp32 Qwen2 causal LM in eval mode; the same arguments give identical weights.

    Weights come from a private generator (the global RNG is left as it was). Embeddings are
    N(0, 1) and linear layers N(0, 1/fan_in), so activations stay O(1) and logits have a spread of
    about `logit_scale`: raise it for sharper, more greedy-like distributions.
    """
    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise ValueError(
            f"hidden_size ({hidden_size}) must be a multiple of num_heads ({num_heads}), "
            f"and num_heads a multiple of num_kv_heads ({num_kv_heads})"
        )
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=False,
        use_sliding_window=False,
    )
    with torch.random.fork_rng(devices=[]):  # construction draws from the global RNG: undo that
        model = Qwen2ForCausalLM(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():  # a fixed order, so a fixed draw sequence
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name.endswith(".bias"):
                param.zero_()
            elif param.dim() == 2 and "embed_tokens" in name:
                param.normal_(0.0, 1.0, generator=generator)
            else:
                std = (logit_scale if name.startswith("lm_head") else 1.0) / param.shape[1] ** 0.5
                param.normal_(0.0, std, generator=generator)
    return model.eval().requires_grad_(False)


def tiny_pair(
    *,
    vocab_size: int = 32,
    seed: int = 0,
    target_layers: int = 2,
    draft_layers: int = 1,
    logit_scale: float = 1.0,
) -> tuple[Qwen2ForCausalLM, Qwen2ForCausalLM]:
    """A tiny target and a draft made of its first `draft_layers` layers (same vocab, same head).

    Sharing embeddings, head and early layers makes the draft agree with the target often but
    not always, like a real small draft.
    """
    if not 1 <= draft_layers < target_layers:
        raise ValueError(
            f"need 1 <= draft_layers < target_layers, got draft_layers={draft_layers}, "
            f"target_layers={target_layers}"
        )
    target = tiny_model(vocab_size=vocab_size, seed=seed, num_layers=target_layers, logit_scale=logit_scale)
    draft = tiny_model(vocab_size=vocab_size, seed=seed, num_layers=draft_layers, logit_scale=logit_scale)
    # Every draft parameter name also exists in the target (layers 0..draft_layers-1).
    draft.load_state_dict(
        {name: t for name, t in target.state_dict().items() if name in draft.state_dict()}, strict=True
    )
    return target, draft


# The low-bit loaders live in engine/lowbit_models.py; imported last (it imports load_model from here) so
# that `from engine.models import load_quantized` keeps working everywhere.
from engine.lowbit_models import (  # noqa: E402
    DYNAMIC_INT8,
    cast_unquantized,
    int8_dynamic,
    is_quantized,
    load_quantized,
    quantize_model,
)

__all__ = [
    "AUTO_DTYPE", "DYNAMIC_INT8", "LoadedModel", "TOKENIZER_FILES", "TORCH_DTYPES", "Vocabulary",
    "cast_unquantized", "check_compatible", "check_device", "fast_bfloat16", "int8_dynamic", "is_quantized",
    "load_model", "load_quantized", "quantize_model", "resolve_dtype", "resolve_folder", "tiny_model", "tiny_pair",
    "vocabulary",
]

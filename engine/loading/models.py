"""Loading causal LMs: packaged aliases, local folders and GGUF files, in float or with low-bit weights.

`load_model("qwen-coder-1.5b")` provisions the alias into the cache the first time (minutes) and
afterwards loads the float32 safetensors from the cache in seconds, cast to the dtype asked for. The first
bfloat16 load keeps a bfloat16 copy in the cache folder, which later bfloat16 loads read (engine.loading.bf16_copy).
`load_quantized(spec, QuantConfig("int4"))` gives the model with low-bit weight-only Linear layers
(engine.loading.quantize): from the low-bit cache (engine.loading.lowbit_cache) when it has the model, else
quantised from the float32 weights at load.
"""

from __future__ import annotations

import copy
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from engine.config import QuantConfig
from engine.loading import bf16_copy, lowbit_cache, model_cache, provision
from engine.loading.devices import check_device
from engine.loading.quantize import cast_unquantized, int8_dynamic, is_quantized, quantize_model

logger = logging.getLogger(__name__)

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
def quiet_progress(show: bool) -> Iterator[None]:
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
        with quiet_progress(logger.isEnabledFor(logging.INFO)):
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
    logger.info(
        "loaded %s in %.1f s (%s, %s)", name, time.perf_counter() - t0, str(dtype).removeprefix("torch."), device
    )
    return LoadedModel(model=model, tokenizer=tokenizer, name=name, source=folder)


def _tokenizer_of(model: torch.nn.Module) -> PreTrainedTokenizerBase | None:
    folder = Path(str(getattr(model, "name_or_path", "") or ""))
    if str(folder) and folder.is_dir() and any((folder / f).is_file() for f in TOKENIZER_FILES):
        return AutoTokenizer.from_pretrained(folder, local_files_only=True)
    return None


def load_quantized(
    spec: str | os.PathLike[str],
    quant: QuantConfig | str,
    *,
    dtype: torch.dtype = torch.bfloat16,
    cache_dir: str | os.PathLike[str] | None = None,
    verify: bool = False,
) -> LoadedModel:
    """Load `spec` with low-bit weights on the CPU, as `quant` says (a scheme name alone takes QuantConfig's
    defaults: group size 32, the output head in float).

    The low-bit cache (engine.loading.lowbit_cache) is read when it has the model; otherwise the float32
    weights are loaded and quantised here. The layers left in float (embeddings, norms, output head) get
    `dtype`; `quant.head` ("int8" / "int4") quantises the output head too, untied from the embedding.
    Dynamic int8 has no low-bit cache form: it is always made from the float32 weights, which it keeps.
    """
    quant = QuantConfig.of(quant)  # bad settings refused before minutes of loading
    if quant.dynamic:
        loaded = load_model(spec, dtype=torch.float32, device="cpu", cache_dir=cache_dir, verify=verify)
        int8_dynamic(loaded.model, inplace=True)
        return loaded
    cached = lowbit_cache.load(str(spec), quant.scheme, quant.group_size, cache_dir, head_quant=quant.head)
    if cached is not None:
        cast_unquantized(cached, dtype)
        cached.eval().requires_grad_(False)
        tokenizer = _tokenizer_of(cached)
        logger.info("loaded %s %s from the low-bit cache", spec, quant.scheme)
        name = str(spec) if str(spec) in provision.PACKAGED else Path(spec).name
        return LoadedModel(
            model=cached, tokenizer=tokenizer, name=name, source=Path(str(getattr(cached, "name_or_path", "") or spec))
        )
    loaded = load_model(spec, dtype=torch.float32, device="cpu", cache_dir=cache_dir, verify=verify)
    t0 = time.perf_counter()
    quantize_model(loaded.model, quant, dtype=dtype)
    logger.info(
        "quantised %s to %s in %.1f s (no low-bit cache for it: saguaro models provision --lowbit builds one)",
        loaded.name,
        quant.scheme,
        time.perf_counter() - t0,
    )
    return loaded


def engine_model(
    spec: str | os.PathLike[str] | PreTrainedModel,
    quant: QuantConfig | None,
    *,
    dtype: torch.dtype,
    device: torch.device,
    cache_dir: str | os.PathLike[str] | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase | None]:
    """The model an engine runs for `spec`, and its tokenizer (None for a model object).

    A model object is used as it is (moved to `device`, eval mode), or with `quant` as a quantised copy (the
    caller's object is left as it was: it may be the draft, or a reference). A name is loaded in `dtype`, or
    with `quant` from the low-bit cache or quantised at load (`load_quantized`, on the CPU).
    """
    if isinstance(spec, PreTrainedModel):
        if quant is None:
            return spec.to(device).eval(), None
        if is_quantized(spec):
            raise ValueError(
                "this model object already has low-bit layers: pass its float weights "
                "with target_quant / draft_quant, or pass it without them"
            )
        return quantize_model(copy.deepcopy(spec), quant).eval(), None
    if quant is not None:
        loaded = load_quantized(spec, quant, dtype=dtype, cache_dir=cache_dir)
    else:
        loaded = load_model(spec, dtype=dtype, device=device, cache_dir=cache_dir)
    return loaded.model, loaded.tokenizer

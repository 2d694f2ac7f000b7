"""The on-disk model cache: one folder per converted model, trusted only through its manifest.

A cache folder is built in a temporary sibling (name starts with `TEMP_PREFIX`) and renamed into
place in one step, with `manifest.json` written last. So a folder under its final name either has
a complete manifest or was not made by us. The manifest records each file's size, sha256 and stat
stamps (mtime, ctime). Every use checks size and stamps (cheap) and re-hashes a file whose stamps
changed (a 7 GB fp32 model takes ~15 s), so a changed byte is never loaded; a file whose content
still matches gets its new stamps written back. `verify=True` re-hashes every file.

A build killed with SIGKILL leaves its temp folder behind; engine.loading.leftovers finds and removes
such folders.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from engine.loading import cache_lock

logger = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"
MARKER_NAME = ".saguaro-cache"  # written first: marks a folder as ours even without a manifest
TEMP_PREFIX = ".saguaro-tmp-"
LOCK_PREFIX = ".saguaro-lock-"
# "+" never occurs in a cache key, so one key's temp folders never match another key's glob.
TEMP_SEPARATOR = "+"
MANIFEST_FORMAT = 1
ENV_CACHE = "SAGUARO_CACHE"
HASH_CHUNK_BYTES = 8 << 20
_REPO_ROOT = Path(__file__).resolve().parents[2]


class ProvisioningError(ValueError):
    """A model cannot be provisioned or loaded; the message says what to do."""


class CorruptCacheError(ProvisioningError):
    """A cache folder exists but its files do not match its manifest (or it has none)."""


@dataclass(frozen=True)
class CachedFile:
    size: int
    sha256: str
    # stat stamps when the hash was last known good; None in manifests written before they existed
    mtime_ns: int | None = None
    ctime_ns: int | None = None

    def unchanged(self, st: os.stat_result) -> bool:
        """True when the file's stamps are the recorded ones (a write changes mtime and ctime)."""
        return (st.st_size, st.st_mtime_ns, st.st_ctime_ns) == (self.size, self.mtime_ns, self.ctime_ns)


@dataclass(frozen=True)
class Manifest:
    name: str
    source: Mapping[str, object]  # where the weights came from: GGUF sha256, packages, path
    files: Mapping[str, CachedFile]  # relative path -> size and hash
    created: str


def resolve_cache_root(cache_dir: str | os.PathLike[str] | None, env: Mapping[str, str]) -> Path:
    """The cache root: `cache_dir`, else `$SAGUARO_CACHE`, else ~/.cache/saguaro.

    `env` is passed in (normally `os.environ`) so that only the public entry points read it.
    """
    if cache_dir is not None:
        root = Path(cache_dir)
    elif env.get(ENV_CACHE):
        root = Path(env[ENV_CACHE])
    else:
        root = Path.home() / ".cache" / "saguaro"
    root = root.expanduser().resolve()
    # Gigabytes of weights inside the work tree would end up in commits and device transfers.
    if root == _REPO_ROOT or _REPO_ROOT in root.parents:
        raise ProvisioningError(
            f"model cache {root} is inside the repository {_REPO_ROOT}; choose a folder outside "
            f"it (--cache DIR or ${ENV_CACHE})"
        )
    return root


def progress_bar(total: int, desc: str, progress: bool | None, *, unit: str = "B") -> tqdm:
    """A tqdm bar on stderr; `progress` None shows it only when stderr is a terminal."""
    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        unit_scale=unit == "B",
        unit_divisor=1024 if unit == "B" else 1000,
        disable=None if progress is None else not progress,
        file=sys.stderr,
        dynamic_ncols=True,
    )


def sha256_file(path: Path, on_chunk: Callable[[int], object] | None = None) -> str:
    """The file's sha256; `on_chunk(n)` is called after each n bytes read (a progress bar's update)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK_BYTES):
            digest.update(chunk)
            if on_chunk is not None:
                on_chunk(len(chunk))
    return digest.hexdigest()


def read_manifest(folder: Path) -> Manifest:
    """Parse `folder/manifest.json`; a missing or malformed one raises CorruptCacheError."""
    path = folder / MANIFEST_NAME
    try:
        raw = json.loads(path.read_text())
        if raw["format"] != MANIFEST_FORMAT:
            raise ValueError(f"format {raw['format']!r}, expected {MANIFEST_FORMAT}")
        files = {
            rel: CachedFile(
                size=int(entry["size"]),
                sha256=str(entry["sha256"]),
                mtime_ns=None if entry.get("mtime_ns") is None else int(entry["mtime_ns"]),
                ctime_ns=None if entry.get("ctime_ns") is None else int(entry["ctime_ns"]),
            )
            for rel, entry in raw["files"].items()
        }
        return Manifest(name=str(raw["name"]), source=raw["source"], files=files, created=str(raw["created"]))
    except FileNotFoundError:
        raise CorruptCacheError(f"{folder} has no {MANIFEST_NAME}: it is not a complete cache folder") from None
    except (ValueError, KeyError, TypeError) as err:
        raise CorruptCacheError(f"{path} is unreadable ({err})") from err


def check_folder(folder: Path, *, verify: bool = False) -> Manifest:
    """The folder's manifest, after checking every listed file against it.

    Size and stat stamps are compared for every file; a file whose stamps differ (or every file,
    when `verify`) is re-hashed. A file that still hashes right gets its new stamps recorded.
    """
    manifest = read_manifest(folder)
    if not manifest.files:
        raise CorruptCacheError(f"{folder}/{MANIFEST_NAME} lists no files")
    restamped: dict[str, CachedFile] = {}
    for rel, expected in manifest.files.items():
        path = folder / rel
        if not path.is_file():
            raise CorruptCacheError(f"cache file {path} is missing")
        st = path.stat()  # taken before hashing: a write during the hash shows up next time
        if st.st_size != expected.size:
            raise CorruptCacheError(f"cache file {path} is {st.st_size} bytes but its manifest says {expected.size}")
        if verify or not expected.unchanged(st):
            if sha256_file(path) != expected.sha256:
                raise CorruptCacheError(
                    f"cache file {path} was changed after it was provisioned (its sha256 differs from the manifest)"
                )
            if not expected.unchanged(st):
                restamped[rel] = dataclasses.replace(expected, mtime_ns=st.st_mtime_ns, ctime_ns=st.st_ctime_ns)
    if restamped:
        manifest = dataclasses.replace(manifest, files={**manifest.files, **restamped})
        try:
            write_manifest(folder, manifest)
        except OSError as err:  # a read-only cache: correct, only re-hashed on every use
            logger.info("cannot record new stamps in %s (%s)", folder / MANIFEST_NAME, err)
    return manifest


def write_manifest(folder: Path, manifest: Manifest) -> None:
    """Write `folder/manifest.json` in one step (a temp file renamed over it)."""
    payload = {
        "format": MANIFEST_FORMAT,
        "name": manifest.name,
        "source": manifest.source,
        "created": manifest.created,
        "files": {
            rel: {"size": f.size, "sha256": f.sha256, "mtime_ns": f.mtime_ns, "ctime_ns": f.ctime_ns}
            for rel, f in manifest.files.items()
        },
    }
    handle, temp = tempfile.mkstemp(prefix=f"{TEMP_PREFIX}{MANIFEST_NAME}", dir=folder)
    try:
        os.chmod(temp, 0o644)  # mkstemp makes it 0600; the manifest is as readable as the weights
        with os.fdopen(handle, "w") as f:
            json.dump(payload, f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, folder / MANIFEST_NAME)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise


def is_ours(folder: Path) -> bool:
    return (folder / MARKER_NAME).is_file() or (folder / MANIFEST_NAME).is_file()


def _unwritable(root: Path, err: OSError) -> ProvisioningError:
    return ProvisioningError(
        f"cannot write to the model cache {root} ({err.strerror or err}: {err.filename or root}); "
        "make it a writable folder, "
        f"or choose another folder with --cache DIR or ${ENV_CACHE}"
    )


@contextlib.contextmanager
def key_lock(
    root: Path, key: str, *, wait: bool = True, timeout_s: float = cache_lock.DEFAULT_LOCK_TIMEOUT_S
) -> Iterator[bool]:
    """Hold an exclusive lock on one cache key, so only one process builds it at a time.

    Yields True once held; with `wait=False` it yields False at once if another holder has it.
    A held lock is waited for up to `timeout_s` seconds, naming its holder once (engine/loading/cache_lock.py);
    then cache_lock.LockTimeoutError (a ValueError) says which lock and what to do.
    """
    with contextlib.ExitStack() as stack:
        try:  # only taking the lock is wrapped: an OSError of the caller's body passes through as it is
            root.mkdir(parents=True, exist_ok=True)
            held = stack.enter_context(cache_lock.hold(root / f"{LOCK_PREFIX}{key}", wait=wait, timeout_s=timeout_s))
        except OSError as err:
            raise _unwritable(root, err) from err
        yield held


def remove_stale_temps(root: Path, key: str) -> None:
    """Delete temp folders of `key` left by an interrupted build. Call only under `key_lock`."""
    for stale in root.glob(f"{TEMP_PREFIX}{key}{TEMP_SEPARATOR}*"):
        if stale.is_dir() and is_ours(stale):
            logger.warning("removing %s left by an interrupted conversion", stale)
            shutil.rmtree(stale)


def discard_folder(folder: Path) -> None:
    """Remove a (damaged or replaced) cache folder that we made; refuse to touch anyone else's."""
    if not is_ours(folder):
        raise ProvisioningError(
            f"{folder} exists but was not made by saguaro (no {MANIFEST_NAME} or {MARKER_NAME}); "
            "move it away or choose another cache folder"
        )
    # Rename first so that no reader sees a half-deleted folder under the final name.
    doomed = folder.with_name(f"{TEMP_PREFIX}{folder.name}{TEMP_SEPARATOR}discard-{uuid.uuid4().hex[:8]}")
    os.rename(folder, doomed)
    shutil.rmtree(doomed)


@contextlib.contextmanager
def building(root: Path, key: str) -> Iterator[Path]:
    """A fresh temp folder for `key`; deleted if the body raises. Call only under `key_lock`."""
    try:
        temp = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{key}{TEMP_SEPARATOR}", dir=root))
    except OSError as err:
        raise _unwritable(root, err) from err
    (temp / MARKER_NAME).write_text("built by saguaro (engine/loading/model_cache.py)\n")
    try:
        yield temp
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise


def hash_files(folder: Path, name: str, progress: bool | None = None) -> dict[str, CachedFile]:
    """Manifest entries for every file under `folder` but its manifest, synced to disk first.

    `progress`: a bar of the bytes hashed, labelled `name`, on stderr (None: only on a terminal).
    """
    files: dict[str, CachedFile] = {}
    paths = sorted(p for p in folder.rglob("*") if p.is_file() and p.relative_to(folder).as_posix() != MANIFEST_NAME)
    with progress_bar(sum(p.stat().st_size for p in paths), f"{name}: sha256", progress) as bar:
        for path in paths:
            with open(path, "rb") as f:
                os.fsync(f.fileno())  # data on disk before the manifest vouches for it
            st = path.stat()
            files[path.relative_to(folder).as_posix()] = CachedFile(
                st.st_size, sha256_file(path, bar.update), st.st_mtime_ns, st.st_ctime_ns
            )
    return files


def publish(
    temp: Path, final: Path, name: str, source: Mapping[str, object], *, progress: bool | None = None
) -> Manifest:
    """Hash `temp`'s files, write its manifest last, and rename it to `final` in one step.

    `progress`: a bar of the bytes hashed on stderr (None: only when stderr is a terminal).
    """
    manifest = Manifest(
        name=name,
        source=dict(source),
        files=hash_files(temp, name, progress),
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    )
    write_manifest(temp, manifest)
    if final.exists():
        discard_folder(final)
    os.rename(temp, final)
    return manifest


def list_folders(root: Path) -> list[Path]:
    """Cache folders under `root` that we made (temp, lock and foreign entries left out)."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".") and is_ours(p))

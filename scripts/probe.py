"""A 40-second steadiness probe of this host (one thread): a 2048² matmul in the dtype the engine's auto picks here
and a 64 MiB float32 sum, in turn, with the median of each in every quarter of the 40 s. Run it alone, before and
after a held-out set: `.venv/bin/python scripts/probe.py`. It replaces reports/.../stop33/probe.py, which timed a
bfloat16 matmul: on an AVX2-only host (no fast bf16 GEMM in torch) one took about 52 s, and its quarters came out
empty."""

import statistics
import time

import torch

from engine.loading.devices import TORCH_DTYPES, resolve_dtype

torch.set_num_threads(1)
dtype = resolve_dtype("auto")
a = torch.randn(2048, 2048, dtype=TORCH_DTYPES[dtype])
b = torch.randn(2048, 2048, dtype=TORCH_DTYPES[dtype])
m = torch.randn(64 * 1024 * 1024 // 4)
matmul_ms, sum_ms = [], []
end = time.time() + 40
while time.time() < end:
    t0 = time.perf_counter()
    a @ b
    matmul_ms.append((time.perf_counter() - t0) * 1e3)
    t0 = time.perf_counter()
    m.sum()
    sum_ms.append((time.perf_counter() - t0) * 1e3)
q = len(matmul_ms) // 4
print(f"{dtype} matmul, {len(matmul_ms)} pairs")
for i in range(4):
    part = slice(i * q, (i + 1) * q)
    print(f"quarter {i}: matmul {statistics.median(matmul_ms[part]):.1f} ms, sum {statistics.median(sum_ms[part]):.1f} ms")

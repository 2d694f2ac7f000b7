"""A 40-second steadiness probe of this host (one thread): a 2048² matmul in the dtype the engine's auto picks here
and a 64 MiB float32 sum, in turn, with the median of each in every quarter of the 40 s. Run it alone, before and
after a set of timed runs: a host whose quarters differ by more than a few percent will not hold a calibration.
The dtype matters: on an AVX2-only host (no fast bfloat16 GEMM in torch) one bfloat16 2048² matmul takes about
52 s, so the probe times the dtype the engine would run.

    python -m benchmarks.host_steadiness [--seconds 40]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from engine.loading.devices import TORCH_DTYPES, resolve_dtype


def probe(seconds: float) -> tuple[str, list[float], list[float]]:
    """(dtype, matmul ms, sum ms), one pair after the other for `seconds`."""
    torch.set_num_threads(1)
    dtype = resolve_dtype("auto")
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(2048, 2048, generator=generator).to(TORCH_DTYPES[dtype])
    b = torch.randn(2048, 2048, generator=generator).to(TORCH_DTYPES[dtype])
    m = torch.randn(64 * 1024 * 1024 // 4, generator=generator)  # 64 MiB of float32
    matmul_ms, sum_ms = [], []
    end = time.time() + seconds
    while time.time() < end:
        t0 = time.perf_counter()
        a @ b
        matmul_ms.append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        m.sum()
        sum_ms.append((time.perf_counter() - t0) * 1e3)
    return dtype, matmul_ms, sum_ms


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=40.0, help="how long to probe")
    args = p.parse_args(argv)
    dtype, matmul_ms, sum_ms = probe(args.seconds)
    q = len(matmul_ms) // 4
    print(f"{dtype} matmul, {len(matmul_ms)} pairs")
    for i in range(4):
        part = slice(i * q, (i + 1) * q)
        if q == 0:
            print(f"quarter {i}: no pair finished (one matmul took longer than a quarter)")
            continue
        print(
            f"quarter {i}: matmul {statistics.median(matmul_ms[part]):.1f} ms, "
            f"sum {statistics.median(sum_ms[part]):.1f} ms"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

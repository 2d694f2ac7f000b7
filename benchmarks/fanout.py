"""Wall time of `theory.integer_fanout` against `theory.fanout.integer_fanout_dp`, the exact O((K+1)·B²) dynamic
programme it is checked against.

    python -m benchmarks.fanout [--dp-up-to 10000]

For B = 10^3 .. 10^6 and K = 4 and 7 (α = 0.8, r = 1, a = 1: docs/ssd.md's worked example at larger budgets)
it prints the time of one call of each, and whether the two schedules agree. The programme runs only up to
--dp-up-to (it takes about a minute at B = 10^5).
"""

from __future__ import annotations

import argparse
import time
from functools import partial

from theory import integer_fanout
from theory.fanout import integer_fanout_dp

ALPHA, R, SCALE = 0.8, 1.0, 1.0
BUDGETS = (10**3, 10**4, 10**5, 10**6)
KS = (4, 7)


def seconds(call) -> tuple[float, object]:
    """Wall time of one call, and its result."""
    start = time.perf_counter()
    result = call()
    return time.perf_counter() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dp-up-to", type=int, default=10**4, help="largest B to run the DP at (default 10^4)")
    args = parser.parse_args()
    print(f"alpha={ALPHA} r={R} scale={SCALE}")
    print(f"{'K':>2} {'B':>8} {'new_s':>9} {'dp_s':>9} {'same':>5}  schedule")
    for K in KS:
        for B in BUDGETS:
            new_s, F = seconds(partial(integer_fanout, ALPHA, R, K, B, SCALE))
            dp_s, same = "-", "-"
            if B <= args.dp_up_to:
                dp_time, reference = seconds(partial(integer_fanout_dp, ALPHA, R, K, B, SCALE))
                dp_s, same = f"{dp_time:.3f}", str(F.tolist() == reference.tolist())
            print(f"{K:>2} {B:>8} {new_s:>9.4f} {dp_s:>9} {same:>5}  {F.tolist()}")


if __name__ == "__main__":
    main()

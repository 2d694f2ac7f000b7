# The target's batch prefill with rows of one length (as `saguaro calibrate` timed it) against ragged rows
# (right-aligned, holes on the left, as a served batch joins), at the same batch and longest prompt (stop 39).
# Run alone on the machine: python prefill_ragged.py [BATCH LONGEST SHORTEST]  (default 7 86 51)
import statistics
import sys
import time

import torch

from engine import LLM
from engine.kv_cache import KVState, right_aligned


def main() -> None:
    b, longest, shortest = (int(x) for x in sys.argv[1:4]) if len(sys.argv) > 3 else (7, 86, 51)
    ids = [1000 + (i * 37) % 5000 for i in range(longest)]
    lengths = [round(longest - (longest - shortest) * i / max(1, b - 1)) for i in range(b)]
    with LLM("qwen-coder-1.5b", strategy="ar", dtype="auto", threads=1) as llm:
        model = llm.target
        print("dtype", next(model.parameters()).dtype, "rows", lengths, flush=True)
        shapes = {"equal": right_aligned([ids] * b, 0, torch.device("cpu")),
                  "ragged": right_aligned([ids[:n] for n in lengths], 0, torch.device("cpu"))}
        times = {k: [] for k in shapes}
        with torch.inference_mode():
            for rep in range(4):  # in turn; the first pass is a warm-up
                for name, (tokens, valid) in shapes.items():
                    state = KVState(model, b, torch.device("cpu"))
                    t0 = time.perf_counter()
                    state.extend(tokens, valid, logits_to_keep=1)
                    ms = (time.perf_counter() - t0) * 1e3
                    if rep:
                        times[name].append(ms)
                    print(rep, name, round(ms), flush=True)
        for name, t in times.items():
            print(name, "median", round(statistics.median(t)), [round(x) for x in t])


if __name__ == "__main__":
    main()

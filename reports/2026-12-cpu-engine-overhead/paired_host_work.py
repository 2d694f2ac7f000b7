"""The engine's host work per output token with its forwards taken out, AR, SD and SSD at batch 1: one short run of
each, printed as one JSON line. Run it from two checkouts in turn (README, "After the host cuts") so that this VM's
drift falls on both alike; the block KV cache's forward returns fixed logits at once
(saguaro.calibration.host_terms.instant_forwards), SSD's worker runs in the target's process.

    PYTHONPATH=<checkout> python reports/2026-12-cpu-engine-overhead/paired_host_work.py 2048 256
"""

import json
import sys
import time

import torch

from benchmarks.engine_overhead import shapes
from benchmarks.random_models import build
from engine import LLM, SamplingParams, SpeculativeConfig
from engine.config import DraftPlacement
from saguaro.calibration.host_terms import instant_forwards


def main() -> None:
    vocab, tokens = int(sys.argv[1]), int(sys.argv[2])
    torch.set_num_threads(1)
    t_shape, d_shape = shapes(vocab, 8, 2)
    target = build(t_shape, "cpu", torch.float32, seed=1)
    draft = build(d_shape, "cpu", torch.float32, seed=2)
    prompt = list(range(1, 33))
    params = SamplingParams(temperature=0, max_new_tokens=tokens, stop_on_eos=False, seed=1)
    out = {}
    with instant_forwards(vocab):
        for strategy in ("ar", "sd", "ssd"):
            spec = SpeculativeConfig(K=4, placement=DraftPlacement(in_process=True))
            drafted = None if strategy == "ar" else draft
            with LLM(target, drafted, strategy=strategy, speculative=spec, threads=1, device="cpu") as llm:
                llm.generate([prompt], params)  # the first shapes
                times = []
                for _ in range(3):
                    t0 = time.perf_counter()
                    llm.generate([prompt], params)
                    times.append(time.perf_counter() - t0)
            out[strategy] = min(times) * 1e3 / tokens  # ms of host work per output token
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()

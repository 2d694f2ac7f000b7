# Do the target's big forwards slow the draft worker's small builds that follow, with the target idle? (stop 39)
# The calibration's worker times six builds (batch 1, 8 branches, K 4, context 64, two untimed first) before the
# target's big work, right after it (a batch-8 copy of a 512-token cache, six 5-token forwards) and 30 s later.
# Run alone on the machine: python target_history.py
import statistics
import time

import torch

from engine import LLM
from engine.kv_cache import KVState
from saguaro.calibration import start_worker
from saguaro.calibration_rounds import ragged
from worker_history import draft_and_ids, small_builds  # beside this script


def main() -> None:
    recipe, ids = draft_and_ids()
    with LLM("qwen-coder-1.5b", strategy="ar", dtype="auto", threads=1) as llm, torch.inference_mode():
        w = start_worker(recipe, 1, ids, 4, 0.0)
        try:
            w.recv(600)
            w.ask("prefill", 521, True, 1)
            w.ask("context", 64)
            for _ in range(2):
                w.ask("build", 1, 8)
                w.recv()
            base = KVState(llm.target, 1, torch.device("cpu"))
            base.extend(torch.tensor([ids[:512]]), logits_to_keep=1)
            for round_ in range(2):
                before = small_builds(w, warm=0)
                rows = ragged(base, 8)
                t0 = time.perf_counter()
                for _ in range(6):
                    rows.extend(torch.tensor([ids[512:517]] * 8))
                    rows.rollback(torch.full((8,), 5, dtype=torch.long))
                big_s = time.perf_counter() - t0
                del rows
                after = small_builds(w, warm=0)
                time.sleep(30)
                later = small_builds(w, warm=0)
                for name, t in (("before", before), ("right after", after), ("30 s later", later)):
                    print(f"round {round_ + 1}, {name}: median {statistics.median(t):.0f} ms, {[round(x) for x in t]}",
                          flush=True)
                print(f"round {round_ + 1}: the target's big forwards took {big_s:.1f} s", flush=True)
        finally:
            w.close()


if __name__ == "__main__":
    main()

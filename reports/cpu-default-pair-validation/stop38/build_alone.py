# The calibration harness's cache build (saguaro.calibration, worker command "build") timed alone, no verify beside
# it: K 4, contexts 128, 256, 512 (stop 38; see README). Run alone on the machine.
# Stop 39: wrong as written. The contexts go up, a roll-back cannot lengthen the cache, and every build ran at 128
# tokens; KVState.rollback now refuses the negative roll-back (ValueError), so this script stops at "context 256".
# Usage: build_alone.py [BATCH [BRANCHES_PER_ROW ...]]  (default: batch 1, 4 and 16 branches a row)
import statistics
import sys
from engine.config import EngineConfig
from engine.strategies.ssd import draft_recipe
from saguaro.calibration import start_worker, _ms
def main():
    config = EngineConfig(target="qwen-coder-1.5b", draft="qwen-coder-0.5b", strategy="ssd", dtype="bfloat16",
                          draft_int8=True, threads=1)
    recipe = draft_recipe(None, config)
    ids = [1000 + (i * 37) % 5000 for i in range(600)]
    w = start_worker(recipe, 1, ids, 4, 0.0)
    print(w.recv(600))
    print("prefill", _ms(w.ask("prefill", 520, True, 1)))
    b = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    per_row = [int(x) for x in sys.argv[2:]] or [4, 16]
    for c in (128, 256, 512):
        print("context", w.ask("context", c))
        for B in per_row * 2:
            for _ in range(2):
                w.ask("build", b, B); w.recv()
            t = []
            for _ in range(6):
                w.ask("build", b, B); t += _ms(w.recv())
            print(c, b * B, round(statistics.median(t)), [round(x) for x in t], flush=True)
    w.close()


if __name__ == "__main__":
    main()

# Does a calibration worker's history slow its later small builds? (stop 39). No target runs: the harness's worker
# alone (saguaro.calibration's "build" command), batch 1, 8 branches, K 4, context 64, six builds after two untimed
# ones, in a fresh worker and in one that has just built 8 x 64 branches at context 512 (and rolled back to 64).
# Run alone on the machine: python worker_history.py
import statistics

from engine.config import EngineConfig
from engine.strategies.ssd import draft_recipe
from saguaro.calibration import _ms, start_worker


def draft_and_ids():
    """The default pair's draft as the calibration's worker loads it, and the probes' 600 token ids."""
    config = EngineConfig(target="qwen-coder-1.5b", draft="qwen-coder-0.5b", strategy="ssd", dtype="bfloat16",
                          draft_int8=True, threads=1)
    return draft_recipe(None, config), [1000 + (i * 37) % 5000 for i in range(600)]


def small_builds(w, warm: int = 2) -> list[float]:
    """Six timed builds at batch 1, 8 branches, after `warm` untimed ones."""
    for _ in range(warm):
        w.ask("build", 1, 8)
        w.recv()
    t = []
    for _ in range(6):
        w.ask("build", 1, 8)
        t += _ms(w.recv())
    return t


def main() -> None:
    recipe, ids = draft_and_ids()
    for order in ("fresh", "after big builds", "fresh", "after big builds"):
        w = start_worker(recipe, 1, ids, 4, 0.0)
        w.recv(600)
        w.ask("prefill", 521, True, 1)
        if order == "after big builds":
            w.ask("context", 512)
            for _ in range(4):
                w.ask("build", 8, 8)
                w.recv()
        w.ask("context", 64)
        t = small_builds(w)
        print(f"{order}: median {statistics.median(t):.0f} ms, {[round(x) for x in t]}", flush=True)
        w.close()


if __name__ == "__main__":
    main()

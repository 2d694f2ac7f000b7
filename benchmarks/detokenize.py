"""Per-round detokenization cost against output length, on the SmolLM2-135M tokenizer.

    python -m benchmarks.detokenize
    PYTHONPATH=<another checkout> python benchmarks/detokenize.py    # the same measurement of that checkout's engine

One request's output (English prose with some CJK and emoji, encoded once) is fed to `engine.sequence.Sequence`
round by round, as the decode loop does, and every `append` is timed: it decodes the round's tokens, looks for stop
strings and builds the chunk, so its time is the engine's detokenization cost per round. Rounds of 1 token (AR)
and of 4 (SD at K = 3 with every draft accepted), each without stop strings and with one that never occurs (which
makes every token's text searched). Printed per output length: the median over repeats of the mean time per round
over the last 32 rounds before that length (the cost of a round there), and of the whole request's total.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

from transformers import AutoTokenizer

import engine.sequence
from engine.loading import model_cache
from engine.loading.models import resolve_folder
from engine.loading.provision import SMOKE_MODEL
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence

PROSE = (
    "The speculative decoder drafts a few tokens with a small model, and the large model checks them all in one "
    "forward pass; every token it accepts costs a fraction of a full step. 在小批量时，引擎自身的工作决定速度。 "
    "When the forward is cheap, as on a GPU at small batch, the host's bookkeeping decides the speed ☕ so each "
    "round should touch only its own tokens 🚀, never the whole output again. "
)
LAST_ROUNDS = 32


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


def run(tokenizer, ids: list[int], per_round: int, stop: tuple[str, ...]) -> tuple[list[float], float]:
    """Seconds per append at the end of the request, and the whole request's seconds."""
    params = SamplingParams(max_new_tokens=len(ids), stop_on_eos=False, stop=stop)
    seq = Sequence(0, "r", 0, [1], params, frozenset(), 0, 0.0, tokenizer=tokenizer)
    times = []
    for i in range(0, len(ids), per_round):
        t0 = time.perf_counter()
        seq.append(ids[i : i + per_round], None, 0.0)
        times.append(time.perf_counter() - t0)
    if seq.text != tokenizer.decode(ids, skip_special_tokens=True):
        raise RuntimeError("the streamed text differs from the whole decode")
    return times[-LAST_ROUNDS:], sum(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 512, 4096], help="output lengths in tokens")
    parser.add_argument("--repeats", type=int, default=3, help="runs per setting (the median is printed)")
    args = parser.parse_args()
    if min(args.lengths) < 1 or args.repeats < 1:
        parser.error("lengths and repeats must be >= 1")

    folder, _ = resolve_folder(SMOKE_MODEL, model_cache.resolve_cache_root(None, os.environ))
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    text_ids = tokenizer(PROSE)["input_ids"]
    ids = (text_ids * (max(args.lengths) // len(text_ids) + 1))[: max(args.lengths)]

    print(f"engine.sequence: {engine.sequence.__file__}")
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; tokenizer {type(tokenizer).__name__} ({SMOKE_MODEL})")
    print(f"{'tokens':>6} {'per round':>9} {'stop':>5} {'us/round at length':>19} {'ms/request':>11}")
    for n in args.lengths:
        for per_round in (1, 4):
            for stop in ((), ("<never seen>",)):
                runs = [run(tokenizer, ids[:n], per_round, stop) for _ in range(args.repeats)]
                at_end = statistics.median(statistics.fmean(last) for last, _ in runs) * 1e6
                total = statistics.median(total for _, total in runs) * 1e3
                print(f"{n:>6} {per_round:>9} {'yes' if stop else 'no':>5} {at_end:>19.1f} {total:>11.2f}")


if __name__ == "__main__":
    main()

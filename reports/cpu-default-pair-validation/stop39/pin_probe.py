# saguaro calibrate with the target process pinned (PIN=1) to the cores the draft worker does not use, after the
# worker starts; PIN=0 leaves it as calibrate does (stop 39). Run alone:
#   PIN=0|1 python pin_probe.py calibrate --draft-int8 --batch 1 4 --context 64 --budget 8 --repeats 5 \
#       --link-tokens 0 --builds-alone --out pin/N-(un)pinned.jsonl
# python pin_probe.py --table pin/*.jsonl   prints each calibration's builds beside the verify and alone.
import os
import sys

import saguaro.commands.calibrate as command

start = command.start_worker


def pinned(*a, **kw):
    w = start(*a, **kw)
    from engine.ssd.process import _cores
    cores, _ = _cores(1)
    rest = sorted(set(os.sched_getaffinity(0)) - set(cores or []))
    if os.environ.get("PIN") == "1" and rest:
        for tid in os.listdir("/proc/self/task"):  # every thread of this process
            os.sched_setaffinity(int(tid), rest)
        print("target pinned to", rest, "worker on", cores, file=sys.stderr)
    return w


def table(paths):
    import json, statistics as st
    for path in paths:
        recs = [json.loads(line) for line in open(path)]
        for b in (1, 4):
            beside = [r["cache_build_ms"] for r in recs if r["strategy"] == "ssd" and r.get("cache_build_ms")
                      and r.get("level") is None and r["batch_size"] == b and r.get("branches") == 8 * b]
            alone = [r["cache_build_ms"] for r in recs if r.get("level") == "alone" and r["batch_size"] == b]
            print(path, "batch", b, "beside", [round(x) for x in beside], "alone", [round(x) for x in alone],
                  "median ratio", round(st.median(beside) / st.median(alone), 2))


if __name__ == "__main__" and sys.argv[1:2] == ["--table"]:
    table(sys.argv[2:])
elif __name__ == "__main__":
    command.start_worker = pinned
    from saguaro.cli import main
    sys.exit(main(sys.argv[1:]))

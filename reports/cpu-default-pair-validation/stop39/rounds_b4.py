# Stop 39: stop 38's batch-4 SSD rounds, measured against the simulator's at the validation's settings (the
# α source: the fast-backups folder's SD K 4; the level: the b4 folder's own SD). Offline, no timing of its own.
# Usage: python rounds_b4.py CALIBRATION.jsonl
import sys, glob, statistics as st
from pathlib import Path
sys.path.insert(0, "scripts")
import validate_ssd as v
from simulator.hits import from_records
from simulator.acceptance import PerPositionAcceptance
R = "reports/cpu-default-pair-validation/stop38/runs"
cal = Path(sys.argv[1])
timing0 = v.calibrations_by_temperature([cal])[0.0][1]
b1 = v.variants(Path(glob.glob(R + "/*-fast-backups")[0]))
ref = [rows for k, (s, rows) in b1.items() if s["system"] == "sd"][0]
hits = from_records(ref)
acc = PerPositionAcceptance(tuple(float(a) for a in hits.meta["alpha"]))
b4 = v.variants(Path(glob.glob(R + "/*-b4")[0]))
sd4 = [rows for k, (s, rows) in b4.items() if s["system"] == "sd"][0]
timing = timing0.leveled(sd4)
for k, (s, rows) in b4.items():
    if s["system"] != "ssd":
        continue
    res = v.predict(timing, s, rows, acc, hits, 4000, 0)
    meas_round = st.mean(r.round_ms for r in rows)
    meas_tok = sum(sum(r.emitted) for r in rows)
    print(k, "meas tok/s", round(v.measured_tokens_per_s(rows), 3), "pred", round(res.decode_tokens_per_s, 3))
    print("  measured: rounds", len(rows), "mean round ms", round(meas_round), "tokens/round", round(meas_tok / len(rows), 2),
          "mean batch", round(st.mean(r.batch_size for r in rows), 2), "all-hit", round(st.mean(all(r.hit) for r in rows), 3))
    print("  predicted: mean round ms", round(res.sim_ms / res.rounds), "tokens/round", round(res.tokens_per_round, 2),
          "mean batch", round(res.mean_batch, 2), "all-hit", res.batch_hit_rate, "hit", round(res.hit_rate, 3), res.breakdown_ms)
    full = [r for r in rows if r.batch_size == 4]
    print("  measured batch-4 rounds:", len(full), "round", round(st.mean(r.round_ms for r in full)), "tok/round",
          round(st.mean(sum(r.emitted) for r in full), 2), "verify", round(st.mean(r.verify_ms for r in full)),
          "wait", round(st.mean(r.wait_ms or 0 for r in full)), "build", round(st.mean(r.cache_build_ms or 0 for r in full)))
    for allhit in (True, False):
        sub = [r for r in full if all(r.hit) == allhit]
        if sub:
            print("    all-hit" if allhit else "    some miss", len(sub), "round", round(st.mean(r.round_ms for r in sub)),
                  "wait", round(st.mean(r.wait_ms or 0 for r in sub)), "build", round(st.mean(r.cache_build_ms or 0 for r in sub)),
                  "backup", round(st.mean(r.backup_ms or 0 for r in sub)), "tok", round(st.mean(sum(r.emitted) for r in sub), 2))
    tail = [r for r in rows if r.batch_size < 4]
    for name, sub in (("batch-4 rounds", full), ("tail rounds (batch < 4)", tail)):
        print(f"  {name}: {len(sub)}, {sum(sum(r.emitted) for r in sub) / sum(r.round_ms for r in sub) * 1e3:.2f} tok/s")

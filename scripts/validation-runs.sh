#!/usr/bin/env bash
# The held-out runs of reports/2026-12-cpu-prediction-accuracy: a calibration, the engine configurations on
# held-out HumanEval prompts, an SD reference on the served prompts, and SSD served at four rates.
# Run it alone on the machine (SSD needs its own core; anything else computing voids its figures).
# Settings: OUT (runs/validation), PARTS ("calibrate serve b4 b2 k t07 fast": which parts, in this order), DTYPE
# (the target's, for the calibration and every run alike: auto, bfloat16 where the CPU multiplies in it at speed),
# SERVE_RATES (the served SSD's request rates, "0.1 0.2 0.4 inf": scale them to the host's speed; an AVX2-only
# host running float32 is about four times slower, "0.025 0.05 0.1 inf"), CALIBRATE_BATCH (the calibration's batch
# sizes, "1 2 4 8": batch 8 for the served runs' builds, 2 for the AR step's knee and the small builds; without
# batch 2, an AVX2-only host's AR at batch 2 came out +54% and its batch-2 SSD rows 16-24% slow, 2026-12-03).
# Then: saguaro validate engine and saguaro validate serving on the folders (docs/validation.md).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$root/.venv/bin"
out="${OUT:-runs/validation}"
read -r -a parts <<< "${PARTS:-calibrate serve b4 b2 k t07 fast}"
prompts="$root/reports/2026-12-cpu-prediction-accuracy/prompts.jsonl"   # HumanEval/100-107
dtype="${DTYPE:-auto}"
model=(--dtype "$dtype" --draft-int8 --threads 1)
# interleaved: prompt by prompt across the variants, so that the machine's level (it moves by up to ~15% within
# the hour here) is the same for each run folder's SD variants, which level the calibration (saguaro validate)
engine=(--prompts "$prompts" -n 8 --max-new-tokens 128 --ignore-eos "${model[@]}" --warmup 1 --order interleaved
        --no-progress --out "$out")
mkdir -p "$out"
stamp() { echo "== $(date -u +%H:%M:%S) $*"; }

for part in "${parts[@]}"; do
    case "$part" in
    calibrate)
        stamp calibrate
        # batch 8: the served runs batch up to --max-num-seqs 8, whose builds (8 x budget branches) must be timed
        read -r -a batches <<< "${CALIBRATE_BATCH:-1 2 4 8}"
        "$bin/saguaro" calibrate --dtype "$dtype" --draft-int8 --batch "${batches[@]}" --out "$out/calibration.jsonl" ;;
    serve)  # the served prompts' SD reference (α and hits), then SSD served at four rates and concurrency 1
        stamp "SD reference on the served prompts"
        "$bin/saguaro" bench --systems sd -K 5 --prompts spec_bench --first -n 8 --max-new-tokens 64 --ignore-eos \
            --temperature 0 "${model[@]}" --warmup 1 --no-progress --out "$out" --name sd-reference-served
        stamp "SSD served"
        DTYPE="$dtype" OUT="$out/serving" TOKENS=64 N=8 RATES="${SERVE_RATES:-0.1 0.2 0.4 inf}" STRATEGIES=ssd \
            BUDGET=8 REFERENCE=0 bash "$root/scripts/bench-serving.sh" ;;
    b4)
        stamp "batch 4"
        "$bin/saguaro" bench --systems ar sd ssd -K 4 --budget 8 16 --schedule uniform --backup neural \
            --batch 4 --temperature 0 "${engine[@]}" --name b4 ;;
    b2)
        stamp "batch 2"
        "$bin/saguaro" bench --systems ar sd ssd -K 4 --budget 8 --schedule uniform --backup neural \
            --batch 2 --temperature 0 "${engine[@]}" --name b2 ;;
    k)
        stamp "AR, and K 2 3 5 at batch 1"
        "$bin/saguaro" bench --systems ar sd ssd -K 2 3 5 --budget 8 16 --schedule geometric --backup neural \
            --temperature 0 "${engine[@]}" --name k235 ;;
    t07)
        stamp "T 0.7 at batch 1"
        "$bin/saguaro" bench --systems sd ssd -K 3 5 --budget 8 --schedule geometric --backup neural random \
            --temperature 0.7 "${engine[@]}" --name t07 ;;
    fast)  # with SD at the same K, whose rounds set this folder's level
        stamp "fast backups at batch 1"
        "$bin/saguaro" bench --systems sd ssd -K 4 --budget 4 16 --schedule uniform --backup lookup random \
            --temperature 0 "${engine[@]}" --name fast-backups ;;
    *)
        echo "unknown part $part (calibrate serve b4 b2 k t07 fast)" >&2
        exit 2 ;;
    esac
done
stamp done

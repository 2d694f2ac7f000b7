#!/usr/bin/env bash
# Serving benchmark on the default pair: for each strategy, start `saguaro serve` on a free
# loopback port, load it with `saguaro bench --url` (concurrency 1; Poisson rates up to saturation; AR also
# at concurrency 8), stop it with SIGTERM; then `LLM.generate` one prompt at a time on the same prompts
# as the reference for concurrency 1. Run it alone on the machine (SSD needs its own core).
# Settings: TOKENS (32), N (8 requests per rate), RATES ("0.05 0.1 0.2 0.4 inf"), STRATEGIES ("ar sd ssd"),
# BUDGET (SSD's cache budget: 12, or auto), REFERENCE (1; 0 skips the LLM.generate run), OUT (runs), DTYPE (the
# target's: auto, bfloat16 where the CPU multiplies in it at speed, else float32). Each run folder lands in $OUT; `saguaro report $OUT/*-serve-* --out reports/NAME` draws them.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$root/.venv/bin"
out="${OUT:-runs}"
tokens="${TOKENS:-32}"
n="${N:-8}"
read -r -a rates <<< "${RATES:-0.05 0.1 0.2 0.4 inf}"
read -r -a strategies <<< "${STRATEGIES:-ar sd ssd}"
budget="${BUDGET:-12}"
model=(--dtype "${DTYPE:-auto}" --draft-int8 -K 4 --threads 1)
load=(--endpoint chat --prompts spec_bench --first --max-new-tokens "$tokens" --temperature 0 --ignore-eos
      --out "$out" --no-progress)
mkdir -p "$out"
pid=""
log=""
stop_server() {
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid"
        wait "$pid" || true
    fi
    pid=""
}
trap stop_server EXIT

start_server() {  # $1 = strategy; sets pid and url
    log="$out/serve-$1-$budget.log"
    "$bin/saguaro" serve --strategy "$1" "${model[@]}" --budget "$budget" --batch 8 --port 0 \
        --rounds-out "$out/serve-$1-$budget-rounds.jsonl" > "$log" 2>&1 &
    pid=$!
    for _ in $(seq 600); do
        url="$(sed -n 's/^saguaro serve: listening on //p' "$log")"
        [ -n "$url" ] && return 0
        kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; return 1; }
        sleep 1
    done
    echo "saguaro serve did not start within 600 s (see $log)" >&2
    return 1
}

for s in "${strategies[@]}"; do
    label="$s"
    [ "$s" = ssd ] && [ "$budget" != 12 ] && label="ssd-B$budget"
    start_server "$s"
    echo "== $s at $url"
    # Warm-up (discarded): the first forwards of a fresh process are slow.
    "$bin/saguaro" bench --url "$url/v1" --label "$label" --name "warmup-$s" --concurrency 1 -n 1 \
        "${load[@]}" --out "$out/warmup" > /dev/null
    "$bin/saguaro" bench --url "$url/v1" --label "$label" --name "serve-$s-c1" --concurrency 1 -n 4 "${load[@]}"
    if [ "$s" = ar ]; then
        "$bin/saguaro" bench --url "$url/v1" --label "$label" --name "serve-$s-c8" --concurrency 8 -n 8 "${load[@]}"
    fi
    "$bin/saguaro" bench --url "$url/v1" --label "$label" --name "serve-$s-rates" --rate "${rates[@]}" -n "$n" \
        --seed 1 "${load[@]}"
    stop_server
done
[ "${REFERENCE:-1}" = 1 ] || exit 0
echo "== LLM.generate reference (one prompt at a time, same prompts)"
"$bin/saguaro" bench --systems "${strategies[@]}" -n 4 --first --max-new-tokens "$tokens" --ignore-eos \
    "${model[@]}" --budget "$budget" --warmup 1 --name generate-ref --out "$out" --no-progress

#!/usr/bin/env bash
# Serving benchmark: for each strategy, start `saguaro serve` on a free loopback port, load it with
# `saguaro bench --url` (concurrency 1; Poisson rates up to saturation; AR also at concurrency 8), stop it with
# SIGTERM; then `LLM.generate` one prompt at a time on the same prompts as the reference for concurrency 1.
# With CLIENTS="saguaro guidellm" each server is also loaded by guidellm, an external client, with the very
# requests `saguaro bench` sent, at concurrency $COMPARE_CONCURRENCY and at Poisson rate $COMPARE_RATE, and
# `python -m saguaro.bench.guidellm compare` writes both clients' figures side by side (compare-<strategy>.md).
# Run it alone on the machine (SSD needs its own core).
# Settings: TOKENS (32), N (8 requests per rate), RATES ("0.05 0.1 0.2 0.4 inf"), STRATEGIES ("ar sd ssd"),
# BUDGET (SSD's cache budget: 12, or auto), REFERENCE (1; 0 skips the LLM.generate run), OUT (runs), DTYPE (the
# target's: auto, bfloat16 where the CPU multiplies in it at speed, else float32), TARGET and DRAFT (the default
# pair), CLIENTS ("saguaro"), COMPARE_CONCURRENCY (4), COMPARE_RATE (0.2), COMPARE_N (16), GUIDELLM (the guidellm
# program: .venv-guidellm/bin/guidellm, a side environment made by
# `python3 -m venv .venv-guidellm && .venv-guidellm/bin/pip install guidellm==0.8.1`), GUIDELLM_TOKENIZER (a local
# tokenizer folder: the SmolLM2-135M cache entry, `saguaro models provision --which smoke`). guidellm runs offline.
# Each run folder lands in $OUT; `saguaro report $OUT/*-serve-* --out reports/NAME` draws them.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$root/.venv/bin"
out="${OUT:-runs}"
tokens="${TOKENS:-32}"
n="${N:-8}"
read -r -a rates <<< "${RATES:-0.05 0.1 0.2 0.4 inf}"
read -r -a strategies <<< "${STRATEGIES:-ar sd ssd}"
read -r -a clients <<< "${CLIENTS:-saguaro}"
budget="${BUDGET:-12}"
models=()
[ -n "${TARGET:-}" ] && models+=(--target "$TARGET")
[ -n "${DRAFT:-}" ] && models+=(--draft "$DRAFT")
model=("${models[@]}" --dtype "${DTYPE:-auto}" --draft-int8 -K 4 --threads 1)
load=(--endpoint chat --prompts spec_bench --first --max-new-tokens "$tokens" --temperature 0 --ignore-eos
      --out "$out" --no-progress)
compare_c="${COMPARE_CONCURRENCY:-4}"
compare_rate="${COMPARE_RATE:-0.2}"
compare_n="${COMPARE_N:-16}"
guidellm="${GUIDELLM:-$root/.venv-guidellm/bin/guidellm}"
with_guidellm=0
for c in "${clients[@]}"; do [ "$c" = guidellm ] && with_guidellm=1; done
if [ "$with_guidellm" = 1 ]; then
    if [ ! -x "$guidellm" ]; then
        echo "no guidellm at $guidellm: python3 -m venv .venv-guidellm && .venv-guidellm/bin/pip install guidellm==0.8.1" >&2
        exit 2
    fi
    tokenizer="${GUIDELLM_TOKENIZER:-$("$bin/python" -c 'from engine.loading.provision import cache_folder; print(cache_folder("smollm2-135m"))')}"
    [ -f "$tokenizer/tokenizer.json" ] || { echo "no tokenizer in $tokenizer: saguaro models provision --which smoke" >&2; exit 2; }
fi
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

run_guidellm() {  # $1 = strategy, $2 = saguaro bench run folder of the same load, $3 = guidellm profile, $4 = name
    "$bin/python" -m saguaro.bench.guidellm data "$2" --max-new-tokens "$tokens" --out "$out/$4-data.jsonl" > /dev/null
    local served backend
    served="$("$bin/python" -c 'import sys, httpx; print(httpx.get(sys.argv[1] + "/v1/models").json()["data"][0]["id"])' "$url")"
    backend="{\"kind\": \"openai_http\", \"target\": \"$url\", \"model\": \"$served\", \"http2\": false,"
    backend+=" \"request_format\": \"/v1/chat/completions\", \"extras\": {\"body\": {\"temperature\": 0}}}"
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$guidellm" run --backend "$backend" \
        --tokenizer "kind=huggingface_auto,model=$tokenizer" --data "kind=json_file,path=$out/$4-data.jsonl" \
        --profile "$3" --constraint "kind=max_requests,count=$compare_n" --output "kind=json,path=$out/$4.json" \
        --disable-console-interactive > "$out/$4.log" 2>&1
}

compare_clients() {  # $1 = strategy, $2 = label
    local c_run r_run
    "$bin/saguaro" bench --url "$url/v1" --label "$2" --name "compare-$1-c$compare_c" --concurrency "$compare_c" \
        -n "$compare_n" "${load[@]}"
    c_run="$(ls -td "$out"/*compare-"$1"-c"$compare_c"* | head -1)"
    run_guidellm "$1" "$c_run" "kind=concurrent,streams=$compare_c" "guidellm-$1-c$compare_c"
    "$bin/saguaro" bench --url "$url/v1" --label "$2" --name "compare-$1-rate" --rate "$compare_rate" \
        -n "$compare_n" --seed 1 "${load[@]}"
    r_run="$(ls -td "$out"/*compare-"$1"-rate* | head -1)"
    run_guidellm "$1" "$r_run" "kind=poisson,rate=$compare_rate" "guidellm-$1-rate"
    "$bin/python" -m saguaro.bench.guidellm compare --saguaro "$c_run" "$r_run" \
        --guidellm "$out/guidellm-$1-c$compare_c.json" "$out/guidellm-$1-rate.json" --out "$out/compare-$1.md"
}

for s in "${strategies[@]}"; do
    label="$s"
    [ "$s" = ssd ] && [ "$budget" != 12 ] && label="ssd-B$budget"
    start_server "$s"
    echo "== $s at $url"
    # Warm-up (discarded): the first forwards of a fresh process are slow.
    "$bin/saguaro" bench --url "$url/v1" --label "$label" --name "warmup-$s" --concurrency 1 -n 1 \
        "${load[@]}" --out "$out/warmup" > /dev/null
    for c in "${clients[@]}"; do
        [ "$c" = saguaro ] || continue
        "$bin/saguaro" bench --url "$url/v1" --label "$label" --name "serve-$s-c1" --concurrency 1 -n 4 "${load[@]}"
        if [ "$s" = ar ]; then
            "$bin/saguaro" bench --url "$url/v1" --label "$label" --name "serve-$s-c8" --concurrency 8 -n 8 "${load[@]}"
        fi
        "$bin/saguaro" bench --url "$url/v1" --label "$label" --name "serve-$s-rates" --rate "${rates[@]}" -n "$n" \
            --seed 1 "${load[@]}"
    done
    [ "$with_guidellm" = 1 ] && compare_clients "$s" "$label"
    stop_server
done
[ "${REFERENCE:-1}" = 1 ] || exit 0
echo "== LLM.generate reference (one prompt at a time, same prompts)"
"$bin/saguaro" bench --systems "${strategies[@]}" -n 4 --first --max-new-tokens "$tokens" --ignore-eos \
    "${model[@]}" --budget "$budget" --warmup 1 --name generate-ref --out "$out" --no-progress

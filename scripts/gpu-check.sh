#!/usr/bin/env bash
# The offline GPU check: correctness first, then the numbers, on a machine with no network.
#
#   OUT=results-folder bash scripts/gpu-check.sh
#
# Needs only python3 with torch, transformers and numpy/scipy/pytest (a GPU image's own); installs and downloads
# nothing: the models are random weights of real shapes built on the device (benchmarks/random_models.py). Steps,
# each in its own process under a hard timeout, most telling first (benchmarks/gpu_check.py):
#   env      versions, the GPU, the KV-cache keyword      canary   the KV cache against full forwards
#   greedy   fp32 greedy SD and SSD = AR (worker in process, in its own process, dying mid-run: SD's exact output)
#   tests    tests/gpu on the device (greedy, chi-square exactness and its negative control, the link)
#   syncs    host synchronisations per decode step        timings  verify / draft step / cache build / backup
#   overhead AR / SD / SSD per token against what their own forwards allow (benchmarks/engine_overhead.py)
#   compiled eager against compiled forwards (CUDA graphs)  launch   eager against graph launch cost per layer
#   e2e-agree, e2e-random  AR / SD / SSD tokens/s at batch 1, 8, 32 on 1.5B/0.5B- and 7B/0.5B-shaped pairs, with
#            models forced to agree (α 1, SSD's best case) and with unrelated random weights at T 1 (its worst)
# All output goes to $OUT (default runs/gpu-check-<UTC time>): summary.md (one screen, written as it goes),
# results.json, pytest.log, check.log. Exit 0 only when every step passed. 8 minutes at most on a GPU (raise GPU_CHECK_BUDGET_S for every step to finish).
#
# Settings: GPU_CHECK_DEVICE=cpu  a dry run of the same code on tiny shapes (about 5 minutes on 2 cores)
#           GPU_CHECK_QUICK=1     the fewest configurations (the check's own test)
#           GPU_CHECK_BUDGET_S    the whole check's limit in seconds (default 470 on a GPU, 900 on a CPU)
#           GPU_CHECK_STEPS       a subset of the steps, e.g. "env canary greedy"
#           PYTHON                the interpreter (default .venv/bin/python when there is one, else python3)
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
case "${1:-}" in
    -h|--help) sed -n '2,24p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
device="${GPU_CHECK_DEVICE:-cuda}"
case "$device" in cuda|cuda:*|cpu) ;; *) echo "gpu-check: GPU_CHECK_DEVICE must be cuda or cpu, got $device" >&2; exit 2 ;; esac
python="${PYTHON:-}"
if [ -z "$python" ]; then
    if [ -x "$root/.venv/bin/python" ]; then python="$root/.venv/bin/python"; else python=python3; fi
fi
out="${OUT:-$root/runs/gpu-check-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$out" || { echo "gpu-check: cannot create $out" >&2; exit 2; }
quick=()
[ -n "${GPU_CHECK_QUICK:-}" ] && quick=(--quick)
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export GPU_CHECK_COMMIT="${GPU_CHECK_COMMIT:-$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)}"
# step:seconds on a GPU; a CPU dry run gets 1.8 times as long for each.
steps="env:20 canary:20 greedy:60 tests:75 syncs:25 overhead:60 timings:100 compiled:90 launch:40 e2e-agree:100 e2e-random:80"
if [ -n "${GPU_CHECK_STEPS:-}" ]; then  # a subset, in this order
    chosen=""
    for entry in $steps; do
        case " $GPU_CHECK_STEPS " in *" ${entry%%:*} "*) chosen="$chosen $entry" ;; esac
    done
    [ -n "$chosen" ] || { echo "gpu-check: GPU_CHECK_STEPS names no step of: $(echo "$steps" | sed "s/:[0-9]*//g")" >&2; exit 2; }
    steps="$chosen"
fi
if [ "$device" = cpu ]; then total="${GPU_CHECK_BUDGET_S:-900}"; scale=18; else total="${GPU_CHECK_BUDGET_S:-470}"; scale=10; fi
start=$SECONDS
failed=0
: > "$out/summary.md"
for entry in $steps; do
    step="${entry%%:*}"
    budget=$(( ${entry##*:} * scale / 10 ))
    left=$(( total - (SECONDS - start) ))
    if [ "$left" -lt 15 ]; then
        echo "- $step: not run, the check's $total s were spent" >> "$out/summary.md"; failed=1; continue
    fi
    [ "$budget" -gt "$left" ] && budget=$left
    echo "== $step ($budget s)" >> "$out/check.log"
    # The step stops adding configurations 10 s before its budget; the hard limit is 15 s after it.
    timeout --kill-after=5 $(( budget + 15 )) "$python" -m benchmarks.gpu_check "$step" --out "$out" \
        --device "$device" --budget-s "$(( budget - 10 ))" "${quick[@]}" >> "$out/check.log" 2>&1
    rc=$?
    case $rc in
        0) ;;
        124|137) echo "- $step: TIMED OUT after $(( budget + 15 )) s (check.log)" >> "$out/summary.md"; failed=1 ;;
        2) echo "- $step: refused (exit 2, check.log)" >> "$out/summary.md"; failed=1; break ;;
        *) echo "- $step: FAILED (exit $rc, check.log)" >> "$out/summary.md"; failed=1 ;;
    esac
done
echo "- whole check: $(( SECONDS - start )) s, $([ $failed -eq 0 ] && echo 'every step passed' || echo 'NOT every step passed')" >> "$out/summary.md"
cat "$out/summary.md" >&2
exit $failed

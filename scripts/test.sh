#!/usr/bin/env bash
# The test suite: creates/reuses .venv, installs pinned dependencies, lints (ruff) and type-checks (mypy), runs
# pytest. Extra arguments go to pytest (for example --run-slow for the real-model tests).
# Tests run in SAGUARO_TEST_WORKERS processes (pytest-xdist, one test file per process at a time; default 2,
# 0 for one process): most tests wait on child processes or model loads, so two share two cores well.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/venv.sh"
cd "$root"
py="$root/.venv/bin/python"
# Lint and type check first: seconds (mypy's first run in a checkout about 40 s on two cores); a failure here stops
# before the tests' minutes. Both are configured in pyproject.toml.
echo "saguaro test: ruff check ." >&2
"$py" -m ruff check . || {
    echo "saguaro test: ruff check failed: fix what it lists above (\`ruff check --fix .\` fixes the ones marked [*])" >&2
    exit 1
}
echo "saguaro test: ruff format --check ." >&2
"$py" -m ruff format --check . || {
    echo "saguaro test: ruff format --check failed: \`ruff format .\` formats the files it lists" >&2
    exit 1
}
echo "saguaro test: mypy (theory, simulator and the engine's public interfaces)" >&2
"$py" -m mypy || {
    echo "saguaro test: mypy failed: fix the type errors listed above" >&2
    exit 1
}
workers="${SAGUARO_TEST_WORKERS:-2}"
parallel=()
[ "$workers" != 0 ] && parallel=(-n "$workers" --dist loadfile)
exec "$py" -m pytest "${parallel[@]}" "$@"

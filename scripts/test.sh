#!/usr/bin/env bash
# The test suite: creates/reuses .venv, installs pinned dependencies, runs pytest.
# Extra arguments go to pytest (for example --run-slow for the real-model tests).
# Tests run in SAGUARO_TEST_WORKERS processes (pytest-xdist, one test file per process at a time; default 2,
# 0 for one process): most tests wait on child processes or model loads, so two share two cores well.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/venv.sh"
cd "$root"
workers="${SAGUARO_TEST_WORKERS:-2}"
parallel=()
[ "$workers" != 0 ] && parallel=(-n "$workers" --dist loadfile)
exec "$root/.venv/bin/python" -m pytest "${parallel[@]}" "$@"

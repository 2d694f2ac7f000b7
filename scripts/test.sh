#!/usr/bin/env bash
# The test suite: creates/reuses .venv, installs pinned dependencies, runs pytest.
# Extra arguments go to pytest (for example --run-slow for the real-model tests).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/venv.sh"
cd "$root"
exec "$root/.venv/bin/python" -m pytest "$@"

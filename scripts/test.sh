#!/usr/bin/env bash
# The README's test command and CI's: set up everything, then lint, type-check and run every test,
# the slow ones with real llama.cpp binaries included.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
bash scripts/setup.sh --test
"$PY" -m ruff check safe_llama tests benchmarks scripts
"$PY" -m ruff format --check safe_llama tests benchmarks scripts
"$PY" -m mypy
"$PY" -m pytest -q -p no:cacheprovider "$@"

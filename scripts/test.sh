#!/usr/bin/env bash
# The README's test command and CI's: the user install (what the unit and the install tests run), the
# development set-up (./.venv), then lint, type-check and every test, the slow ones with real llama.cpp
# binaries included. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/setup.sh --test
PY=$PWD/.venv/bin/python
"$PY" -m ruff check safe_llama tests benchmarks scripts setup.py
"$PY" -m ruff format --check safe_llama tests benchmarks scripts setup.py
"$PY" -m mypy
"$PY" -m pytest -q -p no:cacheprovider "$@"

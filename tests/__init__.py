"""safe-llama's tests, one folder per package of safe_llama/ (tests/model for safe_llama/model, ...)."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
FIXTURES = TESTS / "fixtures"

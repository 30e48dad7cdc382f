"""The scripts tests of supervise_child() run: the driver (the wrapper) and the fake llama.cpp
(tests/process/supervision.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.process.supervision import DRIVER, FAKE


@pytest.fixture
def scripts(tmp_path: Path) -> dict[str, Path]:
    paths = {"driver": tmp_path / "driver.py", "fake": tmp_path / "fake.py"}
    paths["driver"].write_text(DRIVER)
    paths["fake"].write_text(FAKE)
    return paths

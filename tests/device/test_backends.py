"""configs/backends.toml: how each backend meets a device's limits, as data, with the user's [backends] over it."""

from __future__ import annotations

from pathlib import Path

import pytest

from safe_llama.device.backends import backend_rules
from safe_llama.errors import ExitStatus, SafeLlamaError


def _env(tmp_path: Path, config: str | None = None) -> dict[str, str]:
    if config is not None:
        (tmp_path / "safe-llama").mkdir(exist_ok=True)
        (tmp_path / "safe-llama" / "config.toml").write_text(config)
    return {"XDG_CONFIG_HOME": str(tmp_path)}


def test_the_packaged_rules(tmp_path: Path) -> None:
    rules = backend_rules(_env(tmp_path))
    assert rules["openvino:GPU"].alloc_limit == "opencl" and rules["openvino:GPU"].vendor_ids == (0x8086,)
    assert rules["cuda"].alloc_limit == "none" and rules["cuda"].vendor_ids == (0x10DE,)
    assert {"cpu", "openvino:CPU", "openvino:NPU", "sycl", "hip", "vulkan", "metal"} <= set(rules)


def test_a_user_entry_replaces_the_packaged_one(tmp_path: Path) -> None:
    config = '[backends.vulkan]\nvendor_ids = []\nalloc_limit = "opencl"\nwhy = "my driver obeys OpenCL\'s figure"\n'
    rules = backend_rules(_env(tmp_path, config))
    assert rules["vulkan"].alloc_limit == "opencl" and "my driver" in rules["vulkan"].why
    assert rules["cuda"].alloc_limit == "none"  # the others stay


def test_a_bad_user_entry_names_the_file_and_key(tmp_path: Path) -> None:
    config = '[backends.vulkan]\nalloc_limit = "sometimes"\nwhy = "x"\n'
    with pytest.raises(SafeLlamaError) as err:
        backend_rules(_env(tmp_path, config))
    assert err.value.status == ExitStatus.BAD_CONFIG
    assert "config.toml: [backends]: [vulkan] alloc_limit: 'sometimes'" in err.value.message

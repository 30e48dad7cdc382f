"""profiles: the packaged device profiles, a user's shadowing one, an unknown or broken one, and the backends'
allocation rules with a user's [backends] entries over them."""

from __future__ import annotations

from pathlib import Path

import pytest

from safe_llama.device.llama_listing import MIB
from safe_llama.device.profiles import backend_rules, load_profile, load_profiles
from safe_llama.errors import ExitStatus, SafeLlamaError

UHD770_MAX_ALLOC = 4294959104


@pytest.fixture
def env(clean_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The real environment with a private cache and config."""
    env = {k: v for k, v in clean_env.items() if k != "XDG_CONFIG_HOME"}
    return {**env, "XDG_CACHE_HOME": str(tmp_path / "cache"), "XDG_CONFIG_HOME": str(tmp_path / "config")}


def test_packaged_profiles() -> None:
    uhd = load_profile("intel-uhd-770", {})
    assert (uhd.max_alloc_bytes, uhd.integrated, uhd.backend, uhd.vendor_id) == (
        UHD770_MAX_ALLOC,
        True,
        "openvino",
        0x8086,
    )
    assert uhd.memory_bytes is None  # an iGPU's memory is the host's
    h200 = load_profile("nvidia-h200", {})
    assert (h200.memory_bytes, h200.max_alloc_bytes, h200.backend) == (150109880320, None, "cuda")
    assert 150109880320 // MIB == 143155  # what --list-devices printed on that machine
    assert {p.key for p in load_profiles({})} >= {"intel-uhd-770", "nvidia-h200"}


def test_unknown_profile_lists_the_known_ones(env: dict[str, str]) -> None:
    with pytest.raises(SafeLlamaError) as err:
        load_profile("intel-uhd-7700", env)
    assert err.value.status == ExitStatus.BAD_CONFIG
    assert "intel-uhd-770" in err.value.message


def test_a_user_profile_shadows_the_packaged_one(env: dict[str, str]) -> None:
    mine = Path(env["XDG_CONFIG_HOME"]) / "safe-llama" / "devices" / "intel-uhd-770.toml"
    mine.parent.mkdir(parents=True)
    mine.write_text('backend = "sycl"\nmax_alloc_bytes = 1234\n')
    assert load_profile("intel-uhd-770", env).max_alloc_bytes == 1234
    broken = mine.with_name("broken.toml")
    broken.write_text("max_alloc_bytes = \n")
    with pytest.raises(SafeLlamaError) as err:
        load_profile("broken", env)
    assert err.value.status == ExitStatus.BAD_CONFIG


def _user_config(tmp_path: Path, config: str | None = None) -> dict[str, str]:
    if config is not None:
        (tmp_path / "safe-llama").mkdir(exist_ok=True)
        (tmp_path / "safe-llama" / "config.toml").write_text(config)
    return {"XDG_CONFIG_HOME": str(tmp_path)}


def test_backend_rules_without_a_user_config_are_the_backends_own(tmp_path: Path) -> None:
    rules = backend_rules(_user_config(tmp_path))
    assert rules["openvino:GPU"].alloc_limit == "opencl" and rules["openvino:GPU"].vendor_ids == (0x8086,)
    assert rules["cuda"].alloc_limit == "none" and rules["cuda"].vendor_ids == (0x10DE,)
    assert {"cpu", "openvino:CPU", "openvino:NPU", "sycl", "hip", "vulkan", "metal"} <= set(rules)


def test_a_user_backend_entry_replaces_the_backends_own(tmp_path: Path) -> None:
    config = '[backends.vulkan]\nvendor_ids = []\nalloc_limit = "opencl"\nwhy = "my driver obeys OpenCL\'s figure"\n'
    rules = backend_rules(_user_config(tmp_path, config))
    assert rules["vulkan"].alloc_limit == "opencl" and "my driver" in rules["vulkan"].why
    assert rules["cuda"].alloc_limit == "none"  # the others stay


def test_a_bad_user_backend_entry_names_the_file_and_key(tmp_path: Path) -> None:
    config = '[backends.vulkan]\nalloc_limit = "sometimes"\nwhy = "x"\n'
    with pytest.raises(SafeLlamaError) as err:
        backend_rules(_user_config(tmp_path, config))
    assert err.value.status == ExitStatus.BAD_CONFIG
    assert "config.toml: [backends]: [vulkan] alloc_limit: 'sometimes'" in err.value.message

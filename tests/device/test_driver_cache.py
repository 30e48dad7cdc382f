"""The cached `--list-devices` of the real pinned CPU build is run again when what decides the devices llama.cpp
sees changes: a GPU driver's module loaded, NVIDIA's driver version, an ICD file, a device node, or an environment
variable that hides or orders devices. Anything else keeps it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from safe_llama.device.drivers import ProbeRoots, driver_state
from safe_llama.device.probing import probe_llama
from tests.device.test_drivers import DRIVER_CHANGES, add_module, fake_roots


@pytest.fixture
def roots(tmp_path: Path) -> ProbeRoots:
    return fake_roots(tmp_path)


def _probe(llama_bin: Path, env: dict[str, str], cache: Path, roots: ProbeRoots) -> bool:
    """Whether the listing came from the cache."""
    probe = probe_llama(llama_bin / "llama-server", env=env, cache=cache, drivers=driver_state(roots))
    assert probe.listed.problem is None and probe.version is not None
    return probe.cached


@pytest.mark.slow
@pytest.mark.parametrize(
    "change",
    DRIVER_CHANGES,
)
def test_a_driver_appearing_runs_the_listing_again(
    change: Callable[[ProbeRoots], None], llama_bin: Path, clean_env: dict[str, str], roots: ProbeRoots, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    assert not _probe(llama_bin, clean_env, cache, roots)
    assert _probe(llama_bin, clean_env, cache, roots)
    change(roots)
    assert not _probe(llama_bin, clean_env, cache, roots)  # listed afresh: the driver may show a GPU now
    assert _probe(llama_bin, clean_env, cache, roots)  # and cached under the new state


@pytest.mark.slow
def test_other_modules_keep_the_cache(
    llama_bin: Path, clean_env: dict[str, str], roots: ProbeRoots, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    assert not _probe(llama_bin, clean_env, cache, roots)
    add_module(roots, "btrfs")
    (roots.dev_root / "null").touch()
    assert _probe(llama_bin, clean_env, cache, roots)


@pytest.mark.slow
def test_a_driver_going_away_runs_it_again(
    llama_bin: Path, clean_env: dict[str, str], roots: ProbeRoots, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    add_module(roots, "nvidia")
    assert not _probe(llama_bin, clean_env, cache, roots)
    (roots.sys_root / "module" / "nvidia").rmdir()
    assert not _probe(llama_bin, clean_env, cache, roots)


@pytest.mark.slow
@pytest.mark.parametrize("variable", ["CUDA_VISIBLE_DEVICES", "GGML_VK_VISIBLE_DEVICES"])
def test_the_listing_is_keyed_by_the_visible_devices(
    variable: str, llama_bin: Path, clean_env: dict[str, str], roots: ProbeRoots, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    env = {k: v for k, v in clean_env.items() if k != variable}
    assert not _probe(llama_bin, env, cache, roots)
    assert not _probe(llama_bin, {**env, variable: "1"}, cache, roots)
    assert _probe(llama_bin, {**env, variable: "1"}, cache, roots)
    assert not _probe(llama_bin, {**env, variable: "0,1"}, cache, roots)
    assert _probe(llama_bin, env, cache, roots)  # each setting keeps its own listing

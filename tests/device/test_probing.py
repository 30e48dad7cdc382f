"""probing: the probing shell with the real pinned builds, real pocl, fixture sysfs/cgroup trees, the caches
(the device profiles: test_profiles.py; the `safe-llama devices` command: tests/commands/test_devices.py)."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from safe_llama.cmdline.llama_args import parse
from safe_llama.commands.devices import render_text
from safe_llama.device import probe_vulkan, probing
from safe_llama.device.drivers import ProbeRoots
from safe_llama.device.limits import DeclaredLimits
from safe_llama.device.llama_listing import parse_list_devices
from safe_llama.device.probe_vulkan import VulkanReport
from safe_llama.device.probe_vulkan import report_from_dict as vulkan_from_dict
from safe_llama.device.probing import LlamaProbe, probe_devices, probe_llama
from tests import FIXTURES
from tests.device.test_probe_host import v2_tree
from tests.device.test_probe_sysfs import igpu_and_dgpu

GIB = 1 << 30
UHD770_MAX_ALLOC = 4294959104


@pytest.fixture
def env(clean_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The real environment with a private cache and config, and no OpenVINO device chosen."""
    env = {k: v for k, v in clean_env.items() if k not in ("GGML_OPENVINO_DEVICE", "XDG_CONFIG_HOME")}
    return {**env, "XDG_CACHE_HOME": str(tmp_path / "cache"), "XDG_CONFIG_HOME": str(tmp_path / "config")}


@pytest.fixture
def roots(tmp_path: Path) -> ProbeRoots:
    """The seed's machine as far as files go: an Intel iGPU and a dGPU; a service with MemoryMax=6G."""
    sys_root, dev_root = igpu_and_dgpu(tmp_path / "machine")
    proc, cgroup_root = v2_tree(tmp_path / "cgroup")
    return ProbeRoots(sys_root=sys_root, dev_root=dev_root, proc_cgroup=proc, cgroup_root=cgroup_root)


@pytest.mark.slow
def test_cpu_build_on_the_seed_machine(llama_bin: Path, env: dict[str, str], roots: ProbeRoots) -> None:
    report = probe_devices(binary=llama_bin / "llama-server", env=env, roots=roots)
    assert report.llama is not None and report.llama.version is not None
    assert report.llama.version.version == "0.6.0-dev"
    assert report.llama.listed.devices == ()
    assert (report.target.backend, report.target.llama_name) == ("cpu", None)
    assert [g.bdf for g in report.sysfs.gpus] == ["0000:00:02.0", "0000:03:00.0"]
    budget = report.host
    assert budget.cgroup_max is not None and budget.cgroup_max.value == 6 * GIB
    # 6 GiB limit - (2 GiB used - 512 MiB reclaimable), unless this machine has even less available
    assert budget.budget_bytes.value == min(6 * GIB - (2 * GIB - (512 << 20)), budget.available.value)
    assert any(d.platform == "Portable Computing Language" for d in report.opencl.devices)


@pytest.mark.slow
def test_slow_probes_are_cached_and_invalidated(
    llama_bin: Path, env: dict[str, str], roots: ProbeRoots, tmp_path: Path
) -> None:
    binary = tmp_path / "bin" / "llama-server"
    binary.parent.mkdir()
    shutil.copy2(llama_bin / "llama-server", binary)
    first = probe_devices(binary=binary, env=env, roots=roots)
    second = probe_devices(binary=binary, env=env, roots=roots)
    assert first.llama is not None and second.llama is not None
    assert (first.llama.cached, first.opencl_cached) == (False, False)
    assert (second.llama.cached, second.opencl_cached) == (True, True)
    assert second.llama.listed == first.llama.listed
    assert second.opencl == first.opencl
    cache = Path(env["XDG_CACHE_HOME"]) / "safe-llama" / "probe"
    for path in cache.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    os.utime(binary, ns=(1, 1))  # a rebuilt binary
    third = probe_devices(binary=binary, env=env, roots=roots)
    assert third.llama is not None and not third.llama.cached
    assert third.opencl_cached
    with_limit = probe_devices(binary=binary, env={**env, "POCL_MEMORY_LIMIT": "2"}, roots=roots)
    assert not with_limit.opencl_cached  # pocl reads it: another OpenCL set-up
    assert with_limit.llama is not None and not with_limit.llama.cached


@pytest.mark.slow
def test_a_corrupt_cache_is_a_miss(llama_bin: Path, env: dict[str, str], roots: ProbeRoots) -> None:
    cache = Path(env["XDG_CACHE_HOME"]) / "safe-llama" / "probe"
    probe_llama(llama_bin / "llama-server", env=env, cache=cache)
    for path in cache.iterdir():
        path.write_text("{not json")
    again = probe_llama(llama_bin / "llama-server", env=env, cache=cache)
    assert not again.cached
    assert probe_llama(llama_bin / "llama-server", env=env, cache=cache).cached


@pytest.mark.slow
def test_openvino_build(openvino_bin: Path, env: dict[str, str]) -> None:
    report = probe_devices(binary=openvino_bin / "llama-server", env=env)
    assert report.llama is not None
    (device,) = report.llama.listed.devices
    assert (device.name, device.openvino_device, device.selected) == ("OPENVINO0", "CPU", True)
    target = report.target
    assert (target.llama_name, target.backend, target.backend_device) == ("OPENVINO0", "openvino", "CPU")
    assert not target.limits_alloc  # OpenVINO on the CPU: SIZE_MAX
    assert target.on_host
    assert target.memory_bytes is not None and target.memory_bytes.value == device.total_bytes
    assert target.shares_host_memory
    assert target.opencl is None  # pocl is an OpenCL CPU device, not what OpenVINO's CPU plugin uses


@pytest.mark.slow
def test_openvino_refuses_a_gpu_it_does_not_have(openvino_bin: Path, env: dict[str, str]) -> None:
    report = probe_devices(binary=openvino_bin / "llama-server", env={**env, "GGML_OPENVINO_DEVICE": "GPU"})
    assert report.llama is not None
    assert report.llama.listed.openvino_available[0][0] == "CPU"
    target = report.target
    assert (target.backend, target.backend_device, target.requested_by) == (
        "openvino",
        "GPU",
        "GGML_OPENVINO_DEVICE",
    )
    assert any("refused GGML_OPENVINO_DEVICE=GPU" in w for w in target.warnings)
    assert target.limits_alloc and target.max_alloc_bytes is None


@pytest.mark.slow
def test_declared_and_profile_over_probed(openvino_bin: Path, env: dict[str, str]) -> None:
    report = probe_devices(
        binary=openvino_bin / "llama-server",
        command=parse("server", ["--device", "OPENVINO0"], env),
        env=env,
        declared=DeclaredLimits(profile="intel-uhd-770", memory_bytes=8 * GIB, host_memory_bytes=16 * GIB),
    )
    target = report.target
    assert target.max_alloc_bytes is not None and target.memory_bytes is not None
    assert (target.max_alloc_bytes.value, target.max_alloc_bytes.source) == (UHD770_MAX_ALLOC, "profile")
    assert (target.memory_bytes.value, target.memory_bytes.source) == (8 * GIB, "declared")
    assert (report.host.budget_bytes.value, report.host.budget_bytes.source) == (16 * GIB, "declared")
    text = render_text(report)
    assert "profile: " in text and "declared: --device-memory" in text


@pytest.mark.slow
def test_rpc_probe_names_a_worker_that_does_not_answer(llama_bin: Path) -> None:
    from safe_llama.device.probing import probe_rpc
    from tests.llama_run import free_port

    listed = probe_rpc(llama_bin / "llama-server", f"127.0.0.1:{free_port()}", env=dict(os.environ))
    assert listed.devices == () and listed.problem is not None and "Failed to connect to 127.0.0.1:" in listed.problem


@pytest.mark.slow  # the real OpenCL probe (pocl) runs beside the faked ones
def test_a_vulkan_gpu_without_nvml_reads_its_budget_again_not_the_listing(
    env: dict[str, str], roots: ProbeRoots, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fakes (the H200's recorded listing and Vulkan report stand in for probes that need that GPU, which this
    machine has not; NVML answers nothing): with the listing cached, the launch reads free memory again through
    the Vulkan probe's child (VK_EXT_memory_budget), not by running llama.cpp's --list-devices again."""
    h200 = FIXTURES / "nvidia-h200-vulkan"
    recorded = json.loads((h200 / "safe-llama-devices.json").read_text())
    listing = LlamaProbe("llama-server", "/x/llama-server", parse_list_devices((h200 / "list-devices.txt").read_text()),
                         None, cached=True, probed_at=0.0)  # fmt: skip
    listings: list[bool] = []
    probes: list[bool] = []

    def fake_listing(*_: object, refresh: bool = False, **__: object) -> LlamaProbe:
        listings.append(refresh)
        return listing

    def fake_vulkan(*, refresh: bool = False, **_: object) -> tuple[VulkanReport, bool]:
        probes.append(refresh)
        return vulkan_from_dict(recorded["vulkan"]), not refresh

    monkeypatch.setattr(probing, "probe_llama", fake_listing)
    monkeypatch.setattr(probe_vulkan, "probe_vulkan_cached", fake_vulkan)  # probing imports it where used
    report = probe_devices(binary=Path("/x/llama-server"), env=env, roots=roots)
    free = report.target.memory_free_bytes
    assert free is not None and (free.value, free.detail) == (150_092_709_888, "free now (VK_EXT_memory_budget)")
    assert (listings, probes) == ([False], [False, True])

"""Tests for safe_llama/commands/doctor.py: each check on fixture machines (values), the probe on fixture trees
(sysfs, /dev/dri, cgroup files, a group file), and the real machine with the pinned builds (slow)."""

from __future__ import annotations

import io
import json
import os
import stat
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from safe_llama.commands.doctor import (
    PINNED_OPENVINO,
    SEARCH_PATH,
    Binary,
    Build,
    Check,
    Directory,
    Machine,
    NodeAccess,
    check_binaries,
    check_directories,
    check_host_memory,
    check_neo_filter,
    check_opencl,
    check_openvino,
    check_render_nodes,
    exit_code,
    probe_machine,
    read_group_file,
    render_json,
    render_text,
    run_checks,
    run_doctor,
)
from safe_llama.device.drivers import ProbeRoots
from safe_llama.device.host_budget import HostBudget
from safe_llama.device.limits import Sourced
from safe_llama.device.llama_listing import LlamaDevice, LlamaVersion
from safe_llama.device.probe_opencl import OpenCLDevice, OpenCLReport
from safe_llama.device.probe_sysfs import PciGpu, RenderNode, SysfsReport
from safe_llama.paths import packaged_configs
from safe_llama.plan.policy import load_policy

GIB = 1 << 30
POLICY = load_policy(packaged_configs() / "planner.toml")
BIN = "/opt/llama/bin"
DIR_MODE = stat.S_IFDIR | 0o700


def version(text: str) -> LlamaVersion:
    return LlamaVersion(text, 0, "unknown", "GNU 12.2.0", "Linux x86_64")


def gpu(bdf: str, vendor_id: int = 0x8086, *, driver: str | None = "i915", node: str = "renderD128") -> PciGpu:
    vendor = {0x8086: "Intel", 0x10DE: "NVIDIA", 0x1A03: "ASPEED"}[vendor_id]
    return PciGpu(
        bdf=bdf,
        class_code=0x030000,
        vendor_id=vendor_id,
        device_id=0x4680,
        vendor=vendor,
        compute=vendor_id != 0x1A03,
        driver=driver,
        boot_vga=None,
        integrated=bdf.endswith(":00:02.0") if vendor_id == 0x8086 else None,
        render_nodes=(f"/dev/dri/{node}",),
    )


def cl_device(name: str, kind: str = "GPU", max_alloc: int = 4294959104) -> OpenCLDevice:
    return OpenCLDevice(
        platform="Intel(R) OpenCL Graphics", platform_vendor="Intel(R) Corporation", name=name, vendor="Intel",
        vendor_id=0x8086, device_type=kind, max_mem_alloc_size=max_alloc, global_mem_size=16 * GIB,
        host_unified_memory=True, driver_version="24.0", device_version="OpenCL 3.0", pci_bdf=None, pci_note="",
    )  # fmt: skip


def host(budget: int = 20 * GIB, *, rlimit: int | None = None) -> HostBudget:
    chosen = Sourced(budget, "probed", "RLIMIT_AS (ulimit -v)" if rlimit else "psutil: MemAvailable")
    return HostBudget(
        total=Sourced(32 * GIB, "probed", "psutil: physical RAM"),
        available=Sourced(budget, "probed", "psutil: MemAvailable"),
        cgroup_max=None,
        cgroup_current=None,
        rlimit_as=Sourced(rlimit, "probed", "RLIMIT_AS") if rlimit else None,
        budget_bytes=chosen,
        note="no cgroup memory controller",
    )


def healthy(**changes: Any) -> Machine:
    """A CPU-only machine with the three tools of one build and nothing wrong."""
    machine = Machine(
        env={},
        user="alice",
        groups=("alice",),
        listed_groups=(),
        binaries=tuple(Binary(tool, f"{BIN}/llama-{tool}", None) for tool in ("cli", "server", "completion")),
        builds=(Build(f"{BIN}/llama-server", SEARCH_PATH, version("0.6.0-dev"), (), None),),
        icd_files=("/etc/OpenCL/vendors/pocl.icd",),
        opencl=OpenCLReport((cl_device("pthread-cpu", "CPU"),), "ok", "1 device(s) on 1 platform(s): pocl"),
        opencl_cached=True,
        sysfs=SysfsReport((), (), "0 display-class PCI device(s)"),
        nodes=(),
        target=None,
        host=host(),
        directories=(
            Directory("cache", "/home/alice/.cache/safe-llama", True, True, False, True, DIR_MODE, True),
            Directory("config", "/home/alice/.config/safe-llama", False, False, False, True, None, True),
        ),
        config_problems=(),
        policy=POLICY,
    )
    return replace(machine, **changes)


def two_gpus(**changes: Any) -> Machine:
    """An Intel iGPU and an NVIDIA card, both with render nodes."""
    gpus = (gpu("0000:00:02.0"), gpu("0000:01:00.0", 0x10DE, driver="nvidia", node="renderD129"))
    nodes = (
        NodeAccess("/dev/dri/renderD128", "0000:00:02.0", True, "render", stat.S_IFCHR | 0o660),
        NodeAccess("/dev/dri/renderD129", "0000:01:00.0", True, "render", stat.S_IFCHR | 0o660),
    )
    sysfs = SysfsReport(gpus, tuple(RenderNode(n.path, n.pci_bdf, True) for n in nodes), "2 GPUs")
    return healthy(sysfs=sysfs, nodes=nodes, **changes)


def status(check: Check) -> tuple[str, str | None]:
    return check.status, check.fix


# ---------------------------------------------------------------------------------------------------
# The checks, one at a time
# ---------------------------------------------------------------------------------------------------


def test_a_healthy_cpu_machine_passes_and_skips_the_gpu_checks() -> None:
    checks = run_checks(healthy())
    assert {c.id: c.status for c in checks} == {
        "binaries": "pass",
        "openvino": "skip",
        "opencl": "pass",
        "render-nodes": "skip",
        "neo-filter": "skip",
        "directories": "pass",
        "host-memory": "pass",
    }
    assert exit_code(checks) == 0


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        pytest.param(
            {"binaries": tuple(Binary(t, None, "llama-x not found") for t in ("cli", "server", "completion")),
             "builds": ()},
            "fail", id="none",
        ),
        pytest.param(
            {"binaries": (Binary("cli", None, "not found"), Binary("server", f"{BIN}/llama-server", None),
                          Binary("completion", f"{BIN}/llama-completion", None))},
            "warn", id="one-missing",
        ),
        pytest.param(
            {"binaries": (Binary("cli", "/usr/bin/llama-cli", None), Binary("server", f"{BIN}/llama-server", None),
                          Binary("completion", f"{BIN}/llama-completion", None))},
            "warn", id="mixed-builds",
        ),
        pytest.param(
            {"builds": (Build(f"{BIN}/llama-server", SEARCH_PATH, None, (), None),)}, "warn", id="version-unknown"
        ),
    ],
)  # fmt: skip
def test_binaries(changes: dict[str, Any], expected: str) -> None:
    assert check_binaries(healthy(**changes)).status == expected


REFUSED = "refused GGML_OPENVINO_DEVICE=GPU: it is not an available OpenVINO device (available: CPU)"


@pytest.mark.parametrize(
    ("build", "expected", "words"),
    [
        pytest.param(Build("/ov/s", PINNED_OPENVINO, version("0.6.0-dev"), (), None), "pass", "fixed", id="fixed"),
        pytest.param(
            Build("/ov/s", PINNED_OPENVINO, version("0.4.1-dev"), (), None), "warn", "one allocation", id="seed-build"
        ),
        pytest.param(Build("/ov/s", PINNED_OPENVINO, None, (), None), "warn", "cannot tell", id="unknown"),
        pytest.param(Build("/ov/s", SEARCH_PATH, version("0.6.0-dev"), (), REFUSED), "fail", "refused", id="refused"),
    ],
)
def test_openvino_build(build: Build, expected: str, words: str) -> None:
    check = check_openvino(healthy(builds=(build,)))
    assert check.status == expected
    assert words in " ".join(check.details)


def test_openvino_build_found_by_its_devices() -> None:
    listed = LlamaDevice(
        "OPENVINO0", "GGML_OPENVINO_DEVICE=CPU (selected) - AMD EPYC", "openvino", 0, GIB, GIB, "AMD EPYC"
    )
    check = check_openvino(
        healthy(builds=(Build(f"{BIN}/llama-server", SEARCH_PATH, version("0.6.0-dev"), (listed,), None),))
    )
    assert check.status == "pass"


UHD_770 = OpenCLReport((cl_device("Intel(R) UHD Graphics 770"),), "ok", "1 device")


@pytest.mark.parametrize(
    ("machine", "expected"),
    [
        pytest.param(two_gpus(), "warn", id="gpus-but-no-opencl-gpu"),
        pytest.param(two_gpus(opencl=UHD_770), "pass", id="gpu-seen"),
        pytest.param(healthy(opencl=OpenCLReport((), "no-platforms", "no *.icd file")), "pass", id="cpu-only-no-icd"),
        pytest.param(healthy(opencl=OpenCLReport((), "error", "died of signal 11")), "warn", id="probe-crashed"),
        pytest.param(healthy(opencl=OpenCLReport((), "no-pyopencl", "not importable")), "warn", id="no-pyopencl"),
    ],
)
def test_opencl(machine: Machine, expected: str) -> None:
    assert check_opencl(machine).status == expected


def test_render_nodes_missing_in_a_container() -> None:
    machine = two_gpus()
    check = check_render_nodes(replace(machine, nodes=(), sysfs=replace(machine.sysfs, render_nodes=())))
    assert check.status == "fail" and "--device /dev/dri" in (check.fix or "")


def test_render_node_denied_to_a_user_not_in_render() -> None:
    machine = two_gpus()
    denied = (replace(machine.nodes[0], accessible=False), machine.nodes[1])
    assert status(check_render_nodes(replace(machine, nodes=denied))) == (
        "fail",
        "sudo usermod -aG render alice, then log out and in",
    )


def test_render_node_denied_until_the_next_login() -> None:
    machine = two_gpus(listed_groups=("render",))
    denied = tuple(replace(n, accessible=False) for n in machine.nodes)
    check = check_render_nodes(replace(machine, nodes=denied))
    assert check.status == "fail" and "this login predates it" in (check.fix or "")


def test_render_nodes_accessible() -> None:
    assert check_render_nodes(two_gpus()).status == "pass"


def test_neo_filter_needed_with_two_gpus() -> None:
    check = check_neo_filter(two_gpus())
    assert check.status == "warn"
    assert (check.fix or "").startswith("export NEOReadDebugKeys=1 FilterBdfPath=0000:00:02.0 (safe-llama sets")


def test_neo_filter_set() -> None:
    machine = two_gpus(env={"NEOReadDebugKeys": "1", "FilterBdfPath": "0000:00:02.0"})
    assert check_neo_filter(machine).status == "pass"


def test_neo_filter_not_needed_with_one_intel_gpu() -> None:
    one = healthy(sysfs=SysfsReport((gpu("0000:00:02.0"),), (), "1 GPU"))
    assert check_neo_filter(one).status == "pass"


def test_neo_filter_does_not_apply_without_intel() -> None:
    nvidia = healthy(sysfs=SysfsReport((gpu("0000:01:00.0", 0x10DE, driver="nvidia"),), (), "1 GPU"))
    assert check_neo_filter(nvidia).status == "skip"


@pytest.mark.parametrize(
    ("cache", "problems", "expected"),
    [
        pytest.param(replace(healthy().directories[0], symlink=True), (), "fail", id="symlink"),
        pytest.param(replace(healthy().directories[0], writable=False), (), "fail", id="read-only"),
        pytest.param(replace(healthy().directories[0], owned=False), (), "fail", id="someone-elses"),
        pytest.param(replace(healthy().directories[0], note="XDG_CACHE_HOME=c: relative"), (), "warn", id="relative"),
        pytest.param(healthy().directories[0], ("config.toml: Expected '=' (at line 1)",), "fail", id="bad-config"),
    ],
)  # fmt: skip
def test_directories(cache: Directory, problems: tuple[str, ...], expected: str) -> None:
    machine = healthy(directories=(cache, healthy().directories[1]), config_problems=problems)
    assert check_directories(machine).status == expected


@pytest.mark.parametrize(
    ("budget", "expected"),
    [
        pytest.param(host(20 * GIB), "pass", id="plenty"),
        pytest.param(host(GIB), "warn", id="small"),
        pytest.param(host(50 << 20), "fail", id="below-the-process-itself"),
        pytest.param(host(3 * GIB, rlimit=3 * GIB), "warn", id="ulimit-v"),
    ],
)
def test_host_memory(budget: HostBudget, expected: str) -> None:
    assert check_host_memory(healthy(host=budget)).status == expected


def test_exit_code_and_rendering() -> None:
    machine = two_gpus(binaries=tuple(Binary(t, None, "not found") for t in ("cli", "server", "completion")), builds=())
    checks = run_checks(machine)
    assert exit_code(checks) == 1
    text = render_text(checks)
    assert text.splitlines()[0].startswith("FAIL  llama.cpp binaries")
    assert "fix: export NEOReadDebugKeys=1 FilterBdfPath=0000:00:02.0" in text
    data = json.loads(render_json(checks))
    assert data["exit_code"] == 1 and data["failed"] == 1 and data["checks"][0]["id"] == "binaries"


def test_a_warning_alone_exits_0() -> None:
    assert exit_code(run_checks(two_gpus())) == 0


# ---------------------------------------------------------------------------------------------------
# Fixture machines: the probe on fixture trees
# ---------------------------------------------------------------------------------------------------


def pci_device(sys_root: Path, bdf: str, *, vendor: str, driver: str, render: str) -> None:
    entry = sys_root / "bus" / "pci" / "devices" / bdf
    entry.mkdir(parents=True)
    (entry / "class").write_text("0x030000\n")
    (entry / "vendor").write_text(vendor + "\n")
    (entry / "device").write_text("0x4680\n")
    drivers = sys_root / "bus" / "pci" / "drivers" / driver
    drivers.mkdir(parents=True, exist_ok=True)
    (entry / "driver").symlink_to(drivers)
    (entry / "drm" / render).mkdir(parents=True)


def fixture_machine(root: Path, *, memory_max: int) -> tuple[ProbeRoots, Path, dict[str, str]]:
    """An Intel iGPU and an NVIDIA GPU in sysfs, their render nodes in group 'render' (gid 4242), a
    cgroup v2 memory limit, no llama.cpp anywhere, caches and config under root."""
    sys_root, dev_root, etc_root, cgroup_root = root / "sys", root / "dev", root / "etc", root / "cgroup"
    pci_device(sys_root, "0000:00:02.0", vendor="0x8086", driver="i915", render="renderD128")
    pci_device(sys_root, "0000:01:00.0", vendor="0x10de", driver="nvidia", render="renderD129")
    (dev_root / "dri").mkdir(parents=True)
    for name in ("renderD128", "renderD129"):
        node = dev_root / "dri" / name
        node.touch(mode=0o660)
        os.chown(node, -1, 4242)
    etc_root.mkdir()
    (etc_root / "group").write_text(f"root:x:0:\nrender:x:4242:alice\n{os.getuid()}:x:{os.getgid()}:\n")
    cgroup_root.mkdir()
    (cgroup_root / "cgroup.controllers").write_text("cpu memory\n")
    (cgroup_root / "memory.max").write_text(f"{memory_max}\n")
    (cgroup_root / "memory.current").write_text(f"{GIB // 4}\n")
    (cgroup_root / "memory.stat").write_text("inactive_file 0\n")
    (root / "proc-cgroup").write_text("0::/\n")
    env = {
        "HOME": str(root),
        "USER": "alice",
        "PATH": str(root / "no-bin"),
        "XDG_CACHE_HOME": str(root / "cache"),
        "XDG_CONFIG_HOME": str(root / "config"),
        "SAFE_LLAMA_PREFIX": str(root / "opt"),  # nor a system-wide install
    }
    roots = ProbeRoots(sys_root=sys_root, dev_root=dev_root, proc_cgroup=root / "proc-cgroup", cgroup_root=cgroup_root)
    return roots, etc_root, env


def test_fixture_machine_two_gpus_a_cgroup_and_no_llama(tmp_path: Path) -> None:
    roots, etc_root, env = fixture_machine(tmp_path, memory_max=GIB + GIB // 2)
    machine = probe_machine(env=env, roots=roots, etc_root=etc_root)
    assert [n.group for n in machine.nodes] == ["render", "render"]
    assert machine.listed_groups == ("render",)
    assert machine.host.cgroup_max is not None and machine.host.cgroup_max.value == GIB + GIB // 2
    checks = {c.id: c for c in run_checks(machine)}
    assert checks["binaries"].status == "fail"
    assert checks["neo-filter"].status == "warn" and "FilterBdfPath=0000:00:02.0" in (checks["neo-filter"].fix or "")
    assert checks["host-memory"].status == "warn"  # 1.25 GiB of cgroup headroom: small
    assert "cgroup v2" in checks["host-memory"].summary
    assert checks["render-nodes"].status == ("pass" if os.getuid() == 0 else "fail")
    assert checks["directories"].status == "pass"  # missing: created on first use
    assert exit_code(tuple(checks.values())) == 1


def test_fixture_machine_with_a_broken_config(tmp_path: Path) -> None:
    roots, etc_root, env = fixture_machine(tmp_path, memory_max=8 * GIB)
    (tmp_path / "config" / "safe-llama").mkdir(parents=True)
    (tmp_path / "config" / "safe-llama" / "config.toml").write_text("[planner\n")
    check = check_directories(probe_machine(env=env, roots=roots, etc_root=etc_root))
    assert check.status == "fail" and check.summary.startswith(str(tmp_path / "config" / "safe-llama" / "config.toml"))


def test_read_group_file(tmp_path: Path) -> None:
    (tmp_path / "group").write_text("render:x:105:alice,bob\nvideo:x:44:\nbroken line\n")
    assert read_group_file(tmp_path / "group") == {105: ("render", ("alice", "bob")), 44: ("video", ())}
    assert read_group_file(tmp_path / "absent") == {}


# ---------------------------------------------------------------------------------------------------
# This machine, with the pinned builds
# ---------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_this_machine(llama_bin: Path, openvino_bin: Path, clean_env: dict[str, str]) -> None:
    out = io.StringIO()
    code = run_doctor(json_out=True, env=clean_env, out=out)
    data = json.loads(out.getvalue())
    checks = {c["id"]: c for c in data["checks"]}
    assert list(checks) == [
        "binaries", "openvino", "opencl", "render-nodes", "neo-filter", "directories", "host-memory",
    ]  # fmt: skip
    assert checks["binaries"]["status"] in ("pass", "warn")
    assert "0.6.0-dev" in checks["binaries"]["summary"]
    openvino = " ".join(checks["openvino"]["details"])
    assert str(openvino_bin / "llama-server") in openvino and "fixed, PR #29124" in openvino
    assert code == data["exit_code"]


@pytest.mark.slow
def test_this_machine_with_an_openvino_device_it_lacks(openvino_bin: Path, clean_env: dict[str, str]) -> None:
    env = {**clean_env, "GGML_OPENVINO_DEVICE": "NPU.7"}  # no machine here has it: OpenVINO aborts
    out = io.StringIO()
    assert run_doctor(json_out=True, env=env, out=out) == 1
    checks = {c["id"]: c for c in json.loads(out.getvalue())["checks"]}
    assert checks["openvino"]["status"] == "fail"
    assert "GGML_OPENVINO_DEVICE" in checks["openvino"]["fix"]

"""Tests for safe_llama/commands/devices.py: what `safe-llama devices` prints (the text report's sections, --json's
shape) and returns, from reports probed on fixture sysfs and cgroup trees without a binary, from hand-made
llama.cpp listings, and through the command itself (slow where it runs the pinned builds)."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from safe_llama.commands.devices import render_text, report_json, run_devices_command
from safe_llama.device.drivers import ProbeRoots
from safe_llama.device.limits import DeclaredLimits, Sourced
from safe_llama.device.llama_listing import MIB, ListedDevices, LlamaDevice, LlamaVersion
from safe_llama.device.probing import DeviceReport, LlamaProbe, probe_devices
from safe_llama.entry import run
from safe_llama.errors import ExitStatus, SafeLlamaError
from tests.device.test_probe_host import v2_tree
from tests.device.test_probe_sysfs import igpu_and_dgpu

GIB = 1 << 30


@pytest.fixture
def env(clean_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The real environment with a private cache and config, and no OpenVINO device chosen."""
    env = {k: v for k, v in clean_env.items() if k not in ("GGML_OPENVINO_DEVICE", "XDG_CONFIG_HOME")}
    return {**env, "XDG_CACHE_HOME": str(tmp_path / "cache"), "XDG_CONFIG_HOME": str(tmp_path / "config")}


@pytest.fixture
def no_binary(tmp_path: Path) -> dict[str, str]:
    """A private home, cache and config, and no llama.cpp anywhere (PATH has none, the prefix is empty)."""
    return {
        "PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"), "SAFE_LLAMA_PREFIX": str(tmp_path / "prefix"),
    }  # fmt: skip


@pytest.fixture
def report(tmp_path: Path, no_binary: dict[str, str]) -> DeviceReport:
    """The seed's machine as far as files go (an Intel iGPU and a dGPU; a service with MemoryMax=6G), no binary."""
    sys_root, dev_root = igpu_and_dgpu(tmp_path / "machine")
    proc, cgroup_root = v2_tree(tmp_path / "cgroup")
    roots = ProbeRoots(sys_root=sys_root, dev_root=dev_root, proc_cgroup=proc, cgroup_root=cgroup_root)
    declared = DeclaredLimits(host_memory_bytes=3 * GIB, max_alloc_bytes=2 * GIB)
    return probe_devices(binary=None, env=no_binary, roots=roots, declared=declared, binary_note="none here")


def sections(text: str) -> list[str]:
    return [part.splitlines()[0] for part in text.split("\n\n")]


def test_the_text_report_has_its_sections_in_order(report: DeviceReport) -> None:
    text = render_text(report, now=0.0)
    heads = sections(text)
    assert heads[0].startswith("Target: ") and heads[1] == "Host budget: 3.00 GiB  (declared: --host-memory)"
    assert heads[2] == "llama.cpp: llama.cpp's own device list is not known: none here"
    assert heads[3].startswith("Free memory now: ") and heads[4].startswith("OpenCL (")
    assert heads[5].startswith("PCI GPUs (sysfs): ") and len(heads) == 6  # no Vulkan section without a Vulkan device
    assert "  0000:00:02.0  " in text and "  0000:03:00.0  " in text
    assert "  cgroup limit      6.00 GiB  (6,442,450,944 B)" in text


def test_the_target_section(report: DeviceReport) -> None:
    def target_lines(**changes: object) -> list[str]:
        target = replace(report.target, **changes)  # type: ignore[arg-type]
        return render_text(replace(report, target=target)).split("\n\n")[0].splitlines()

    declared = target_lines(limits_alloc=True, max_alloc_bytes=Sourced(2 * GIB, "declared", "--max-alloc"))
    assert declared[1] == "  max allocation    2.00 GiB  (2,147,483,648 B)  declared: --max-alloc"
    assert declared[2].startswith("  memory          ") and declared[-1].startswith("  mapping         ")
    unknown = target_lines(limits_alloc=True, max_alloc_bytes=None)
    assert unknown[1] == "  max allocation  UNKNOWN (declare --max-alloc or --profile)"
    no_limit = target_lines(limits_alloc=False, warnings=("watch out",))
    assert no_limit[1] == "  max allocation  no per-allocation limit" and no_limit[-1] == "  WARNING         watch out"
    integrated = target_lines(integrated=Sourced(True, "profile", "intel-uhd-770"))
    assert "  integrated      integrated  profile: intel-uhd-770" in integrated


def _probe(devices: tuple[LlamaDevice, ...], *, cached: bool, problem: str | None = None) -> LlamaProbe:
    version = LlamaVersion("0.6.0-dev", 7000, "abc1234", None, None)
    return LlamaProbe("/bin/llama-server", "/opt/llama/bin/llama-server", ListedDevices(devices, problem), version,
                      cached, probed_at=100.0)  # fmt: skip


def test_the_llama_cpp_section(report: DeviceReport) -> None:
    gpu = LlamaDevice("CUDA0", "NVIDIA H200", "cuda", 0, 143155 * MIB, 140000 * MIB, "NVIDIA H200")
    cached = render_text(replace(report, llama=_probe((gpu,), cached=True)), now=130.0).split("\n\n")[2]
    assert cached.splitlines() == [
        "llama.cpp: /opt/llama/bin/llama-server  0.6.0-dev (build 7000, commit abc1234)  [--list-devices cached from "
        "30 s ago]",
        "  CUDA0      NVIDIA H200  (139.80 GiB, 136.72 GiB free)",
    ]
    fresh = render_text(replace(report, llama=_probe((), cached=False)), now=0.0).split("\n\n")[2]
    assert fresh.splitlines()[0].endswith("[--list-devices just run]")
    assert fresh.splitlines()[1] == "  (no device: CPU only)"
    broken = render_text(replace(report, llama=_probe((), cached=False, problem="it aborted"))).split("\n\n")[2]
    assert broken.splitlines()[1:] == ["  problem: it aborted"]
    clock_back = render_text(replace(report, llama=_probe((), cached=True)), now=50.0)
    assert "cached from 0 s ago" in clock_back  # a clock set back is not a negative age


def test_the_json_report_is_the_report_with_a_schema(report: DeviceReport) -> None:
    data = json.loads(report_json(report))
    assert data["schema"] == 1 and list(data)[1:] == [
        "target", "host", "llama", "llama_note", "opencl", "opencl_cached", "sysfs", "request", "declared",
        "profile", "rpc", "free", "vulkan", "vulkan_cached", "launches",
    ]  # fmt: skip
    assert data["launches"] == []
    assert data["llama"] is None and data["llama_note"] == "llama.cpp's own device list is not known: none here"
    assert data["host"]["budget_bytes"] == {"value": 3 * GIB, "source": "declared", "detail": "--host-memory"}
    assert [g["bdf"] for g in data["sysfs"]["gpus"]] == ["0000:00:02.0", "0000:03:00.0"]


def devices_command(capsys: pytest.CaptureFixture[str], env: dict[str, str], **given: object) -> str:
    call: dict[str, object] = {
        "llama_bin": None, "device": None, "openvino_device": None, "profile": None, "max_alloc": None,
        "device_memory": None, "integrated": None, "host_memory": None, "refresh": False, "json_out": False,
    }  # fmt: skip
    run_devices_command(**{**call, **given}, env=env)  # type: ignore[arg-type]
    return capsys.readouterr().out


def test_the_command_without_a_binary(capsys: pytest.CaptureFixture[str], no_binary: dict[str, str]) -> None:
    text = devices_command(capsys, no_binary, host_memory="2G", openvino_device="GPU")
    assert text.startswith("Target: ") and "[chosen by: GGML_OPENVINO_DEVICE]" in text.splitlines()[0]
    assert "\nHost budget: 2.00 GiB  (declared: --host-memory)\n" in text
    assert "\nllama.cpp: llama.cpp's own device list is not known: safe-llama: llama-server not found (" in text
    data = json.loads(devices_command(capsys, no_binary, json_out=True, integrated=True))
    assert data["llama"] is None and data["declared"]["integrated"] is True
    assert data["request"]["openvino_device"] is None and "GGML_OPENVINO_DEVICE" not in no_binary


def test_the_command_with_a_binary_that_is_not_there(
    capsys: pytest.CaptureFixture[str], no_binary: dict[str, str], tmp_path: Path
) -> None:
    with pytest.raises(SafeLlamaError) as err:
        devices_command(capsys, no_binary, llama_bin=str(tmp_path / "llama-server"))
    assert err.value.status == ExitStatus.NOT_FOUND and str(tmp_path / "llama-server") in err.value.message
    assert capsys.readouterr().out == ""


@pytest.mark.slow
def test_the_command_with_the_pinned_build_caches_its_listing(
    capsys: pytest.CaptureFixture[str], no_binary: dict[str, str], llama_bin: Path
) -> None:
    first = devices_command(capsys, no_binary, llama_bin=str(llama_bin))
    head = next(line for line in first.splitlines() if line.startswith("llama.cpp: "))
    assert head.startswith(f"llama.cpp: {llama_bin / 'llama-server'}  ") and head.endswith("[--list-devices just run]")
    again = devices_command(capsys, no_binary, llama_bin=str(llama_bin))
    assert "[--list-devices cached from " in again
    refreshed = devices_command(capsys, no_binary, llama_bin=str(llama_bin), refresh=True)
    assert "[--list-devices just run]" in refreshed


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = run(argv)
    out, err = capsys.readouterr()
    return code, out, err


def use_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    for key in list(os.environ):
        if key not in env:
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)


@pytest.mark.slow
def test_command_on_this_machine(
    openvino_bin: Path,
    env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Done when `safe-llama devices` shows pocl's limits, OPENVINO0 from the OpenVINO build, the budget."""
    use_env(monkeypatch, env)
    code, out, _ = run_cli(["devices", "--llama-bin", str(openvino_bin)], capsys)
    assert code == 0
    assert "Target: OPENVINO0 (openvino CPU)" in out
    assert "OPENVINO0  GGML_OPENVINO_DEVICE=CPU (selected)" in out
    assert "Portable Computing Language" in out and "max alloc" in out
    assert "Host budget:" in out
    code, out, _ = run_cli(["devices", "--llama-bin", str(openvino_bin), "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert data["target"]["llama_name"] == "OPENVINO0"
    assert data["host"]["budget_bytes"]["source"] == "probed"
    assert data["llama"]["cached"] is True
    pocl = next(d for d in data["opencl"]["devices"] if d["platform"] == "Portable Computing Language")
    assert pocl["max_mem_alloc_size"] > 0


@pytest.mark.slow
def test_command_with_declared_limits(
    llama_bin: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    use_env(monkeypatch, env)
    argv = ["devices", "--llama-bin", str(llama_bin), "--json", "--profile", "intel-uhd-770"]
    code, out, _ = run_cli([*argv, "--max-alloc", "2G", "--discrete"], capsys)
    assert code == 0
    target = json.loads(out)["target"]
    assert target["max_alloc_bytes"] == {"value": 2 * GIB, "source": "declared", "detail": "--max-alloc"}
    assert target["integrated"]["value"] is False


def test_command_rejects_a_bad_size(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    use_env(monkeypatch, env)
    code, _, err = run_cli(["devices", "--max-alloc", "lots"], capsys)
    assert code == ExitStatus.USAGE
    assert "--max-alloc" in err


def test_command_names_a_missing_binary(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    use_env(monkeypatch, env)
    code, _, err = run_cli(["devices", "--llama-bin", "/nonexistent/llama-server"], capsys)
    assert code == ExitStatus.NOT_FOUND
    assert "/nonexistent/llama-server" in err


@pytest.mark.slow
def test_no_binary_anywhere_still_reports(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    use_env(monkeypatch, {**env, "PATH": "", "SAFE_LLAMA_PREFIX": env["XDG_CACHE_HOME"] + "/no-install"})
    code, out, _ = run_cli(["devices", "--json", "--openvino-device", "GPU"], capsys)
    assert code == 0
    data = json.loads(out)
    assert data["llama"] is None
    assert "not found" in data["llama_note"]
    assert (data["target"]["backend"], data["target"]["backend_device"]) == ("openvino", "GPU")


def test_the_runner_passes_the_table_s_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from safe_llama.commands import devices

    calls: list[dict[str, object]] = []
    monkeypatch.setattr(devices, "run_devices_command", lambda **call: calls.append(call))
    settings = {"bin_dir": "/b", "device": "GPU0", "discrete": "1", "integrated": "1", "json": "1"}
    assert devices.main(settings, []) == 0
    assert calls == [{
        "llama_bin": "/b", "device": "GPU0", "openvino_device": None, "profile": None, "max_alloc": None,
        "device_memory": None, "integrated": False, "host_memory": None, "refresh": False, "json_out": True,
    }]  # fmt: skip

"""`safe-llama devices`: what safe-llama sees of this machine (the device a command line lands on, its limits
and their sources, llama.cpp's device list, OpenCL, sysfs, the host budget), as text or JSON.

Owns that rendering; the probing is device.devices'."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from safe_llama.cmdline.llama_args import parse
from safe_llama.cmdline.own_options import flag, integrated
from safe_llama.device import ledger
from safe_llama.device.binaries import find_binary
from safe_llama.device.declared import declared_limits
from safe_llama.device.host_budget import HostBudget
from safe_llama.device.limits import Sourced
from safe_llama.device.probe_free import FreeReport
from safe_llama.device.probe_opencl import OpenCLReport
from safe_llama.device.probe_sysfs import SysfsReport
from safe_llama.device.probe_vulkan import VulkanReport
from safe_llama.device.probing import DeviceReport, LlamaProbe, probe_devices
from safe_llama.device.reservations import Launch, others
from safe_llama.device.target_device import TargetDevice
from safe_llama.errors import SafeLlamaError
from safe_llama.paths import cache_dir
from safe_llama.units import human


def report_json(report: DeviceReport, launches: Sequence[Launch] = ()) -> str:
    data = {"schema": 1, **dataclasses.asdict(report), "launches": [dataclasses.asdict(x) for x in launches]}
    return json.dumps(data, indent=2)


def _sourced(value: Sourced[int] | None, none: str) -> str:
    if value is None:
        return none
    return f"{human(value.value):>10}  ({value.value:,} B)  {value.source}: {value.detail}"


def _render_target(t: TargetDevice) -> list[str]:
    name = t.llama_name or ("host CPU" if t.backend == "cpu" else "unknown")
    extra = f" {t.backend_device}" if t.backend_device else ""
    if t.limits_alloc:
        alloc = _sourced(t.max_alloc_bytes, "UNKNOWN (declare --max-alloc or --profile)")
    else:
        alloc = "no per-allocation limit"
    if t.integrated is None:
        integrated = "n/a (the host itself)" if t.shares_host_memory else "unknown"
    else:
        kind = "integrated" if t.integrated.value else "discrete"
        integrated = f"{kind}  {t.integrated.source}: {t.integrated.detail}"
    lines = [
        f"Target: {name} ({t.backend}{extra}) - {t.description}   [chosen by: {t.requested_by}]",
        f"  max allocation  {alloc}",
        f"  memory          {_sourced(t.memory_bytes, 'unknown')}",
    ]
    if t.memory_free_bytes is not None:
        lines.append(f"  free            {_sourced(t.memory_free_bytes, 'unknown')}")
    lines += [
        f"  integrated      {integrated}",
        f"  shares host RAM {'yes: the host budget bounds it too' if t.shares_host_memory else 'no'}",
        f"  PCI             {t.pci_bdf or 'unknown'}",
    ]
    if t.opencl is not None:
        lines.append(f"  OpenCL          {t.opencl.name} ({t.opencl.platform})")
    if t.vulkan is not None:
        vk = t.vulkan
        lines += [
            f"  Vulkan buffer   {_sourced(vk.max_buffer, '')}",
            f"  Vulkan alloc    {_sourced(vk.max_allocation, '')}",
            f"  Vulkan block    {_sourced(vk.block, '')}",
            f"  largest tensor  {_sourced(vk.max_tensor, '')}",
        ]
        if vk.free_bytes is not None:
            lines.append(f"  Vulkan budget   {human(vk.free_bytes):>10}  free (VK_EXT_memory_budget)")
    if t.neo_filter:
        lines.append("  NEO filter      " + " ".join(f"{k}={v}" for k, v in t.neo_filter.items()))
    lines.append(f"  mapping         {t.mapping_note}")
    lines.extend(f"  WARNING         {w}" for w in t.warnings)
    return lines


def _render_host(h: HostBudget) -> list[str]:
    budget = h.budget_bytes
    return [
        f"Host budget: {human(budget.value)}  ({budget.source}: {budget.detail})",
        f"  total           {_sourced(h.total, '')}",
        f"  available       {_sourced(h.available, '')}",
        f"  cgroup limit    {_sourced(h.cgroup_max, 'none')}",
        f"  cgroup usage    {_sourced(h.cgroup_current, 'unknown')}",
        f"  RLIMIT_AS       {_sourced(h.rlimit_as, 'unlimited')}",
        f"  cgroup          {h.note}",
    ]


def _render_llama(llama: LlamaProbe | None, note: str, now: float) -> list[str]:
    if llama is None:
        return [f"llama.cpp: {note}"]
    v = llama.version
    version = f"{v.version} (build {v.build}, commit {v.commit})" if v else "version unknown"
    age = f"cached from {max(now - llama.probed_at, 0):.0f} s ago" if llama.cached else "just run"
    lines = [f"llama.cpp: {llama.real_path}  {version}  [--list-devices {age}]"]
    for device in llama.listed.devices:
        lines.append(
            f"  {device.name:<10} {device.description}  ({human(device.total_bytes)}, {human(device.free_bytes)} free)"
        )
    if not llama.listed.devices and llama.listed.problem is None:
        lines.append("  (no device: CPU only)")
    if llama.listed.problem:
        lines.append(f"  problem: {llama.listed.problem}")
    return lines


def _render_free(free: FreeReport) -> list[str]:
    lines = [f"Free memory now: {free.note or 'not read'}"]
    for r in free.readings:
        lines.append(
            f"  {r.pci_bdf or '?':<13} {r.name}  {human(r.free_bytes)} free of {human(r.total_bytes)}  ({r.source})"
        )
    return lines


def _render_opencl(opencl: OpenCLReport, cached: bool) -> list[str]:
    lines = [f"OpenCL ({opencl.status}){' [cached]' if cached else ''}: {opencl.note}"]
    for device in opencl.devices:
        unified = {True: "host-unified", False: "discrete", None: "unified=?"}[device.host_unified_memory]
        pci = device.pci_bdf or f"unknown ({device.pci_note})"
        lines += [
            f"  {device.name} [{device.device_type}, {device.vendor} 0x{device.vendor_id:04x}, "
            f"{device.platform}, driver {device.driver_version}]",
            f"      max alloc {human(device.max_mem_alloc_size)} ({device.max_mem_alloc_size:,} B), "
            f"global {human(device.global_mem_size)}, {unified}, PCI {pci}",
        ]
    return lines


def _render_vulkan(vulkan: VulkanReport | None, cached: bool) -> list[str]:
    if vulkan is None:
        return []
    lines = [f"Vulkan ({vulkan.status}){' [cached]' if cached else ''}: {vulkan.note}"]
    for d in vulkan.devices:
        buffer = human(d.max_buffer_size) if d.max_buffer_size is not None else "n/a (no VK_KHR_maintenance4)"
        heaps = ", ".join(
            f"{human(h.size)}{' device-local' if h.device_local else ''}"
            + (f" ({human(max((h.budget or 0) - (h.usage or 0), 0))} free)" if h.budget is not None else "")
            for h in d.heaps
        )
        lines += [
            f"  #{d.index} {d.name} [{d.device_type}, 0x{d.vendor_id:04x}, Vulkan {d.api_version}]",
            f"      maxMemoryAllocationSize {human(d.max_memory_allocation_size)}, maxBufferSize {buffer}, "
            f"maxStorageBufferRange {human(d.max_storage_buffer_range)}",
            f"      heaps: {heaps or 'none'}; VK_EXT_memory_budget {'yes' if d.memory_budget else 'no'}",
        ]
    return lines


def _render_sysfs(sysfs: SysfsReport) -> list[str]:
    lines = [f"PCI GPUs (sysfs): {sysfs.note}"]
    for gpu in sysfs.gpus:
        flags = [f"driver {gpu.driver or 'none'}"]
        if gpu.boot_vga:
            flags.append("boot VGA")
        if gpu.integrated is not None:
            flags.append("integrated" if gpu.integrated else "discrete")
        if not gpu.compute:
            flags.append("no compute")
        lines.append(
            f"  {gpu.bdf}  {gpu.vendor} 0x{gpu.device_id:04x} class 0x{gpu.class_code:06x}  "
            f"{', '.join(flags)}  {' '.join(gpu.render_nodes)}"
        )
    for node in sysfs.render_nodes:
        access = "accessible" if node.accessible else "NOT accessible"
        lines.append(f"  {node.path}  {access}  {node.pci_bdf or ''}")
    return lines


def render_text(report: DeviceReport, *, now: float | None = None) -> str:
    """The report for people: the target and the host budget first, then what each probe saw."""
    sections = [
        _render_target(report.target),
        _render_host(report.host),
        _render_llama(report.llama, report.llama_note, time.time() if now is None else now),
        _render_free(report.free),
        _render_opencl(report.opencl, report.opencl_cached),
        _render_vulkan(report.vulkan, report.vulkan_cached),
        _render_sysfs(report.sysfs),
    ]
    return "\n\n".join("\n".join(section) for section in sections if section)


def run_devices_command(
    *,
    llama_bin: str | None,
    device: str | None,
    openvino_device: str | None,
    profile: str | None,
    max_alloc: str | None,
    device_memory: str | None,
    integrated: bool | None,
    host_memory: str | None,
    refresh: bool,
    json_out: bool,
    env: Mapping[str, str] = os.environ,
) -> None:
    """`safe-llama devices`: probe as a launch would (the same llama-server binary, the same target)."""
    from safe_llama.state import check_cache

    unusable = check_cache(cache_dir(env))
    if unusable is not None:
        sys.stderr.write(f"safe-llama: warning: {unusable}: nothing is cached\n")
    declared = declared_limits(
        profile=profile,
        max_alloc=max_alloc,
        device_memory=device_memory,
        integrated=integrated,
        host_memory=host_memory,
    )
    child_env = dict(env)
    if openvino_device:
        child_env["GGML_OPENVINO_DEVICE"] = openvino_device
    binary: Path | None = None
    note = ""
    try:
        binary = find_binary("server", env=env, explicit=llama_bin)
    except SafeLlamaError as err:
        if llama_bin:
            raise
        note = err.message
    report = probe_devices(
        binary=binary,
        command=parse("server", ["--device", device] if device else [], child_env),
        env=child_env,
        declared=declared,
        refresh=refresh,
        binary_note=note,
    )
    launches = ledger.read_all(env)
    if json_out:
        sys.stdout.write(report_json(report, launches) + "\n")
    else:
        sys.stdout.write(render_text(report) + "\n" + "\n".join(["", *_render_launches(launches)]) + "\n")


def _render_launches(launches: Sequence[Launch]) -> list[str]:
    """The other safe-llama launches in the ledger, what each holds where (device/ledger.py)."""
    found = others(launches, {}, device="", cgroup="").held_lines()
    return ["Other safe-llama launches (the ledger):", *(f"  {line}" for line in found or ("none",))]


def main(settings: Mapping[str, str], words: list[str]) -> int:
    """The command's runner (cmdline.own_options.COMMANDS): `devices`' options as entry.py read them."""
    run_devices_command(
        llama_bin=settings.get("bin_dir"),
        device=settings.get("device"),
        openvino_device=settings.get("openvino_device"),
        profile=settings.get("profile"),
        max_alloc=settings.get("max_alloc"),
        device_memory=settings.get("device_memory"),
        integrated=integrated(settings),
        host_memory=settings.get("host_memory"),
        refresh=bool(flag(settings, "refresh")),
        json_out=bool(flag(settings, "json")),
    )
    return 0

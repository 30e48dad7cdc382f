"""What safe-llama knows about the device llama.cpp will run on and the host's memory: the probing shell.

Owns running the probes (OpenCL, `--list-devices`/`--version`, sysfs, host), caching the slow ones under
cache_dir()/probe/, and the DeviceReport (the `devices`
command renders it). The decisions are target_device's (pure); must not plan (the planner takes the report's
values).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from safe_llama import state
from safe_llama.backends.registry import BACKENDS, backend_named
from safe_llama.cmdline import env_scan
from safe_llama.cmdline.llama_args import CommandLine, parse
from safe_llama.device.drivers import DEFAULT_ROOTS, ProbeRoots, driver_state
from safe_llama.device.free_memory import free_figure, match_reading
from safe_llama.device.host_budget import HostBudget, host_budget
from safe_llama.device.limits import NOTHING_DECLARED, DeclaredLimits, DeviceProfile, Sourced
from safe_llama.device.llama_listing import (
    DeviceRequest,
    ListedDevices,
    LlamaVersion,
    parse_list_devices,
    parse_version,
    resolve_request,
)
from safe_llama.device.probe_free import NO_READINGS, FreeReport, NvmlRead, read_free
from safe_llama.device.probe_host import probe_host
from safe_llama.device.probe_opencl import OpenCLReport, fingerprint, probe_opencl_isolated
from safe_llama.device.probe_opencl import report_from_dict as opencl_from_dict
from safe_llama.device.probe_opencl import report_to_dict as opencl_to_dict
from safe_llama.device.probe_sysfs import SysfsReport, probe_sysfs
from safe_llama.device.profiles import backend_rules, load_profile, load_profiles
from safe_llama.device.target_device import TargetDevice, resolve_target
from safe_llama.errors import SafeLlamaError
from safe_llama.paths import cache_dir

if TYPE_CHECKING:  # the Vulkan probe is imported only where a Vulkan device is listed or asked for
    from safe_llama.device.probe_vulkan import VulkanReport

# Environment variables that change what `--list-devices` prints (which devices exist, which OpenVINO
# device is selected). A cached listing is only valid for the same values.
LLAMA_ENV_PREFIXES = (
    "GGML_",
    "CUDA_",
    "HIP_",
    "ROCR_",
    "ONEAPI_",
    "ZE_",
    "SYCL_",
    "NEOReadDebugKeys",
    "FilterBdfPath",
    "OCL_ICD",
    "OPENCL_",
    "POCL_",
    "OV_",
    "VK_",
    "MESA_",
    "LD_LIBRARY_PATH",
    "NVIDIA_",
)


@dataclass(frozen=True)
class LlamaProbe:
    """llama.cpp's own view of the machine: its device listing and version, and whether they were cached."""

    binary: str
    real_path: str
    listed: ListedDevices
    version: LlamaVersion | None
    cached: bool
    probed_at: float  # time.time() of the run the listing came from


@dataclass(frozen=True)
class DeviceReport:
    """Everything probed for one launch: the target device, the host, and each probe's report."""

    target: TargetDevice
    host: HostBudget
    llama: LlamaProbe | None
    llama_note: str
    opencl: OpenCLReport
    opencl_cached: bool
    sysfs: SysfsReport
    request: DeviceRequest
    declared: DeclaredLimits
    profile: DeviceProfile | None
    rpc: ListedDevices | None = None  # the devices of the --rpc workers, as llama.cpp lists them
    free: FreeReport = NO_READINGS  # the vendors' free-memory readings, taken now
    vulkan: VulkanReport | None = None  # probed when llama.cpp lists a Vulkan device
    vulkan_cached: bool = False


# ------------------------------------------------------------------------------------ the slow probes


def _env_key(env: Mapping[str, str], prefixes: tuple[str, ...]) -> list[str]:
    return [f"{k}={v}" for k, v in sorted(env_scan.prefixed(env, prefixes).items())]


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


CACHE_FORMAT = 2  # 2: a listing's key kept whole


def _cache_load(path: Path, key: str) -> tuple[dict[str, Any], float] | None:
    """A cached payload and when it was written, if it was written under this key."""
    data = state.read_json(path)
    if (
        not isinstance(data, dict)
        or data.get("format") != CACHE_FORMAT
        or data.get("key") != key
        or not isinstance(data.get("payload"), dict)
        or not isinstance(data.get("written_at"), int | float)
    ):
        return None
    return data["payload"], float(data["written_at"])


def _cache_store(path: Path, key: str, payload: dict[str, Any]) -> None:
    # A cache that cannot be written only costs the next run a fresh probe.
    with contextlib.suppress(OSError):
        state.write_json(path, {"format": CACHE_FORMAT, "key": key, "written_at": time.time(), "payload": payload})


def probe_llama(
    binary: Path, *, env: Mapping[str, str], cache: Path, refresh: bool = False, drivers: str = ""
) -> LlamaProbe:
    """`<binary> --list-devices` and `--version`, cached by the binary's real path, size and mtime, the
    environment variables that change the listing, the drivers (`drivers`: driver_state) and the boot."""
    real = str(Path(binary).resolve())
    st = Path(real).stat()
    setting = "\n".join([real, *_env_key(env, LLAMA_ENV_PREFIXES)])
    key = f"{setting}\n{st.st_size}\n{st.st_mtime_ns}\n{_boot_id()}\n{drivers}"  # kept whole: compared whole
    # One file per binary and environment, so switching GGML_OPENVINO_DEVICE back and forth keeps both;
    # a rebuilt binary overwrites its own.
    where = cache / f"llama-{state.cache_name(setting)}.json"
    hit = None if refresh else _cache_load(where, key)
    if hit is not None:
        (payload, probed_at), cached = hit, True
    else:
        # A refused GGML_OPENVINO_DEVICE aborts; without this ggml attaches gdb to print a backtrace first.
        child_env = {**env_scan.whole(env), "GGML_NO_BACKTRACE": "1"}
        from safe_llama.device.proc import run_capture  # only a probe that runs (a cache miss) needs it

        listing = run_capture([real, "--list-devices"], env=child_env, timeout=60.0)
        version = run_capture([real, "--version"], env=child_env, timeout=30.0)
        payload = {
            "list_stdout": listing.stdout,
            "list_stderr": listing.stderr[-20000:],
            "list_returncode": listing.returncode,
            "version_text": version.stderr + version.stdout,
        }
        probed_at, cached = time.time(), False
        if not listing.timed_out:
            _cache_store(where, key, payload)
    listed = parse_list_devices(str(payload["list_stdout"]), str(payload["list_stderr"]))
    code = int(payload["list_returncode"])
    if listed.problem is not None and code != 0:
        how = f"died of signal {-code}" if code < 0 else f"exit status {code}"
        listed = dataclasses.replace(listed, problem=f"{listed.problem} ({how})")
    return LlamaProbe(
        binary=str(binary),
        real_path=real,
        listed=listed,
        version=parse_version(str(payload["version_text"])),
        cached=cached,
        probed_at=probed_at,
    )


def probe_rpc(binary: Path, servers: str, *, env: Mapping[str, str]) -> ListedDevices:
    """The RPC workers' devices as llama.cpp sees them (`<binary> --rpc SERVERS --list-devices`: it connects
    to each). Not cached: a worker's memory and presence change while the head's binary does not. A worker
    that does not answer aborts the listing: `problem` then names the endpoint llama.cpp could not reach."""
    from safe_llama.device.proc import run_capture  # a plan without workers does not need it

    listing = run_capture(
        [str(binary), "--rpc", servers, "--list-devices"], env={**env, "GGML_NO_BACKTRACE": "1"}, timeout=30.0
    )
    listed = parse_list_devices(listing.stdout, listing.stderr[-20000:])
    rpc = tuple(d for d in listed.devices if d.backend == "rpc")
    problem = listed.problem
    if problem is None and listing.returncode != 0:
        problem = f"exit status {listing.returncode}"
    failed = next((line for line in listing.stderr.splitlines() if "Failed to connect to" in line), None)
    if failed is not None:
        problem = failed[failed.index("Failed to connect to") :].strip()
    return ListedDevices(devices=rpc, problem=problem)


def probe_opencl_cached(
    *, env: Mapping[str, str], cache: Path, sysfs: SysfsReport, refresh: bool = False
) -> tuple[OpenCLReport, bool]:
    """The OpenCL probe (in a child process, see probe_opencl_isolated), cached under a key that changes
    with the ICD set-up and the GPUs sysfs shows with their drivers."""
    gpus = [f"{g.bdf}:{g.driver}:{','.join(g.render_nodes)}" for g in sysfs.gpus]
    key = state.digest("\n".join([fingerprint(env), *gpus]))
    where = cache / "opencl.json"
    hit = None if refresh else _cache_load(where, key)
    if hit is not None:
        try:
            return opencl_from_dict(hit[0]), True
        except (KeyError, TypeError):
            pass  # written by another version: probe again
    report = probe_opencl_isolated(env)
    if report.status != "error":
        _cache_store(where, key, opencl_to_dict(report))
    return report, False


def probe_devices(
    *,
    binary: Path | None,
    command: CommandLine | None = None,
    env: Mapping[str, str],
    declared: DeclaredLimits = NOTHING_DECLARED,
    refresh: bool = False,
    roots: ProbeRoots = DEFAULT_ROOTS,
    binary_note: str = "",
    opencl_always: bool = True,
    rpc_servers: str | None = None,
    nvml: NvmlRead | None = None,
) -> DeviceReport:
    """Everything about the device a llama.cpp command line (its parse, and the env it will run with) targets.

    `binary` is the llama.cpp tool to ask (None: skip llama.cpp's view, `binary_note` says why). Slow
    probes are cached under
    cache_dir(env)/probe/; `refresh` ignores the caches. With opencl_always False (the launch path),
    OpenCL is not probed when llama.cpp lists no device and sysfs shows no GPU: a CPU-only build on a
    machine without GPUs has no OpenCL limit that could apply. `rpc_servers`: the --rpc list, whose
    workers' devices are listed too (DeviceReport.rpc).
    """
    cache = cache_dir(env) / "probe"
    request = resolve_request(command if command is not None else parse("server", (), env), env)
    profile = load_profile(declared.profile, env) if declared.profile else None
    sysfs = probe_sysfs(sys_root=roots.sys_root, dev_root=roots.dev_root)
    host = probe_host(proc_cgroup=roots.proc_cgroup, cgroup_root=roots.cgroup_root)
    drivers = driver_state(roots)
    llama: LlamaProbe | None = None
    if binary is None:
        llama_note = f"llama.cpp's own device list is not known: {binary_note or 'no binary given'}"
    else:
        try:
            llama = probe_llama(binary, env=env, cache=cache, refresh=refresh, drivers=drivers)
            llama_note = llama.listed.problem or ""
        except (OSError, SafeLlamaError) as err:
            llama_note = f"could not run {binary} --list-devices: {err}"
    # a CPU-only build (or none found) on a machine without GPUs: no OpenCL limit could apply
    no_listed_gpu = llama is None or (not llama.listed.devices and not llama.listed.problem)
    cpu_only = no_listed_gpu and not sysfs.gpus
    if opencl_always or not cpu_only or request.devices not in (None, ("none",)):
        opencl, opencl_cached = probe_opencl_cached(env=env, cache=cache, sysfs=sysfs, refresh=refresh)
    else:
        opencl = OpenCLReport((), "not-probed", "not probed: llama.cpp lists no GPU and sysfs shows none")
        opencl_cached = False
    vulkan, vulkan_cached, gpus = None, False, [f"{g.bdf}:{g.driver}:{','.join(g.render_nodes)}" for g in sysfs.gpus]
    # probed when a device llama.cpp lists or the request names is capped by ggml-vulkan's limits
    listed_vulkan = any(backend_named(d.backend).vulkan_limits for d in (llama.listed.devices if llama else ()))
    vulkan_prefixes = [p for b in BACKENDS if b.vulkan_limits for p in b.prefixes]
    if listed_vulkan or any(p in str(request.devices) for p in vulkan_prefixes):
        from safe_llama.device.probe_vulkan import probe_vulkan_cached

        vulkan, vulkan_cached = probe_vulkan_cached(env=env, cache=cache, gpus=gpus, refresh=refresh)
    free = read_free(sysfs, llama.listed if llama is not None else None, roots.sys_root, nvml)

    def resolve(llama: LlamaProbe | None) -> TargetDevice:
        return resolve_target(
            request=request,
            listed=llama.listed if llama is not None else None,
            opencl=opencl,
            sysfs=sysfs,
            host_total=host.total_bytes,
            declared=declared,
            profile=profile,
            profiles=load_profiles(env) if profile is None else (),
            env=env,
            rules=backend_rules(env),
            free_now=free.readings,
            listing_age=time.time() - llama.probed_at if llama is not None else None,
            vulkan=vulkan,
            vulkan_now=vulkan is not None and not vulkan_cached,
        )

    target = resolve(llama)
    if binary is not None and llama is not None and llama.cached and needs_free_now(target):
        # no vendor interface answered for this GPU: what another program holds changes between launches, so the
        # free figure is read again now: VK_EXT_memory_budget in the Vulkan probe's child where the device has
        # it, else llama.cpp's own listing run again
        if target.vulkan is not None and target.vulkan.free_bytes is not None:
            from safe_llama.device.probe_vulkan import probe_vulkan_cached

            vulkan, vulkan_cached = probe_vulkan_cached(env=env, cache=cache, gpus=gpus, refresh=True)
        else:
            llama = probe_llama(binary, env=env, cache=cache, refresh=True, drivers=drivers)
        target = resolve(llama)
    return DeviceReport(
        target=target,
        host=host_budget(host, declared),
        llama=llama,
        llama_note=llama_note,
        opencl=opencl,
        opencl_cached=opencl_cached,
        sysfs=sysfs,
        request=request,
        declared=declared,
        profile=profile,
        rpc=probe_rpc(binary, rpc_servers, env=env) if binary is not None and rpc_servers else None,
        free=free,
        vulkan=vulkan,
        vulkan_cached=vulkan_cached,
    )


def needs_free_now(target: TargetDevice) -> bool:
    """A GPU with memory of its own whose free figure is not a vendor reading taken now."""
    integrated = target.integrated is not None and target.integrated.value
    return not target.on_host and not integrated and target.listed is not None and not target.free_is_vendor


def free_again(
    device: TargetDevice, binary: Path | None, env: Mapping[str, str], roots: ProbeRoots = DEFAULT_ROOTS
) -> tuple[Sourced[int], bool] | None:
    """The device's free memory read again now (after a failed start): the vendor's reading, else llama.cpp's
    listing run again (True: the figure is the listing's); None when neither knows the device."""
    if device.listed is None:
        return None
    sysfs = probe_sysfs(sys_root=roots.sys_root, dev_root=roots.dev_root)
    free = read_free(sysfs, ListedDevices((device.listed,)), roots.sys_root)
    reading, _ = match_reading(device.listed, device.pci, free.readings, env)
    if reading is not None:
        figure = free_figure(device.listed, reading, listing_age=None)
        return (figure, False) if figure is not None else None
    if binary is None:
        return None
    try:
        llama = probe_llama(binary, env=env, cache=cache_dir(env) / "probe", refresh=True, drivers=driver_state(roots))
    except (OSError, SafeLlamaError):
        return None
    again = next((d for d in llama.listed.devices if d.name == device.listed.name), None)
    figure = free_figure(again, None, listing_age=None)
    return (figure, True) if figure is not None else None


# ------------------------------------------------------------------------------------------ rendering

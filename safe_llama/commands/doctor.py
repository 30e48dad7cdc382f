"""`safe-llama doctor`: what is wrong with this machine's set-up for llama.cpp, one check per line, each
with a fix.

Owns the checks (a table of small pure functions of a `Machine` value, so tests pass fixture machines),
their rendering, and `probe_machine`, which gathers the Machine through the existing probes and their
caches. Must not load a model, start llama.cpp beyond the probes' cached `--version`/`--list-devices`, or
change anything on the machine.

Over 400 lines on purpose: it is a table of about twenty independent checks of 10-30 lines each, read
top to bottom; splitting the table would only scatter it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import sys
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TextIO

from safe_llama import trust
from safe_llama.cmdline.own_options import flag
from safe_llama.constants import TOOL_BINARY
from safe_llama.device.binaries import locate_binary
from safe_llama.device.drivers import ProbeRoots
from safe_llama.device.host_budget import HostBudget
from safe_llama.device.llama_listing import LlamaDevice, LlamaVersion
from safe_llama.device.probe_opencl import OpenCLReport
from safe_llama.device.probe_sysfs import SysfsReport
from safe_llama.device.probing import probe_devices, probe_llama
from safe_llama.device.profiles import load_profiles
from safe_llama.device.target_device import TargetDevice
from safe_llama.diagnosis.signatures import load_table
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.paths import cache_dir, config_dir, configs_dir, pinned_bin_dir
from safe_llama.plan.policy import Policy, load_policy
from safe_llama.plan.target import Probed, kv_splits
from safe_llama.state import check_entries
from safe_llama.units import human

Status = Literal["pass", "warn", "fail", "skip"]
INTEL = 0x8086
# Below this host budget only the smallest models and contexts start: worth a warning, not a failure.
SMALL_HOST_BUDGET = 2 << 30
GROUP_FILE = "group"  # under etc_root: who is in which group, as the next login will see it
SEARCH_PATH = "the search path"
PINNED_OPENVINO = "the pinned OpenVINO build"


@dataclass(frozen=True)
class Binary:
    tool: str
    path: str | None
    problem: str | None  # why there is none (not found, not executable)
    source: str | None = None  # why this one: --llama-bin, SAFE_LLAMA_BIN_DIR, PATH, the pinned build in ...


@dataclass(frozen=True)
class Build:
    """A llama.cpp binary asked for `--version` and `--list-devices` (through the probe's cache)."""

    path: str
    origin: str  # SEARCH_PATH or PINNED_OPENVINO
    version: LlamaVersion | None
    devices: tuple[LlamaDevice, ...]
    problem: str | None

    @property
    def backends(self) -> frozenset[str]:
        return frozenset(d.backend for d in self.devices)

    @property
    def openvino(self) -> bool:
        # an OpenVINO build that refuses its device lists nothing, but says why in OpenVINO's words
        return "openvino" in self.backends or self.origin == PINNED_OPENVINO or "OPENVINO" in (self.problem or "")


@dataclass(frozen=True)
class NodeAccess:
    path: str
    pci_bdf: str | None
    accessible: bool
    group: str | None  # the node's group, by name
    mode: int | None


@dataclass(frozen=True)
class Directory:
    role: str  # cache, config
    path: str
    exists: bool
    is_dir: bool
    symlink: bool
    writable: bool  # the directory, or the nearest existing parent that would hold it
    mode: int | None  # st_mode, file type bits included
    owned: bool
    note: str = ""  # e.g. a relative XDG variable that was ignored
    untrusted: str = ""  # trust.problem: a component someone else owns or can write (then it is not used)


@dataclass(frozen=True)
class Machine:
    """Everything the checks look at. Built by probe_machine; tests build it from fixture values."""

    env: Mapping[str, str]
    user: str
    groups: tuple[str, ...]  # this process's groups: what opening a device is checked against now
    listed_groups: tuple[str, ...]  # the groups the group file lists the user in: after a new login
    binaries: tuple[Binary, ...]
    builds: tuple[Build, ...]
    icd_files: tuple[str, ...]
    opencl: OpenCLReport
    opencl_cached: bool
    sysfs: SysfsReport
    nodes: tuple[NodeAccess, ...]
    target: TargetDevice | None  # where the default llama-server would run
    host: HostBudget
    directories: tuple[Directory, ...]
    config_problems: tuple[str, ...]
    policy: Policy | None
    bad_entries: tuple[str, ...] = ()  # state.check_entries: a cache entry of a wrong shape, one line each


@dataclass(frozen=True)
class Check:
    id: str
    title: str
    status: Status
    summary: str
    details: tuple[str, ...] = ()
    fix: str | None = None


# ---------------------------------------------------------------------------------------------------
# The checks: pure functions of a Machine
# ---------------------------------------------------------------------------------------------------


def _version_text(version: LlamaVersion | None) -> str:
    if version is None:
        return "version unknown"
    extra = f" (build {version.build}, commit {version.commit})" if version.build is not None else ""
    return f"{version.version}{extra}"


def check_binaries(m: Machine) -> Check:
    title = "llama.cpp binaries"
    found = [b for b in m.binaries if b.path]
    missing = [b for b in m.binaries if not b.path]
    fix = (
        "bash scripts/setup.sh (builds the pinned llama.cpp), or point SAFE_LLAMA_BIN_DIR or PATH at a llama.cpp build"
    )
    if not found:
        return Check(
            "binaries", title, "fail", "no llama.cpp binary found", tuple(b.problem or "" for b in m.binaries), fix
        )
    details = [f"{TOOL_BINARY[b.tool]}: {b.path}" + (f" (from {b.source})" if b.source else "") for b in found]
    details += [f"{TOOL_BINARY[b.tool]}: {b.problem}" for b in missing]
    default = next((b for b in m.builds if b.origin == SEARCH_PATH), None)
    version = _version_text(default.version if default else None)
    backends = ", ".join(sorted(default.backends)) if default and default.backends else "cpu only"
    summary = f"{len(found)} of {len(m.binaries)} found; {version}; devices: {backends}"
    if missing:
        return Check("binaries", title, "warn", summary, tuple(details), fix)
    directories = {os.path.dirname(b.path or "") for b in found}
    if len(directories) > 1:
        return Check(
            "binaries",
            title,
            "warn",
            summary + "; from different directories",
            tuple(details),
            "use the three tools of one build (SAFE_LLAMA_BIN_DIR=<its bin/>): mixed versions plan wrongly",
        )
    if default is not None and default.problem:
        details.append(f"--list-devices: {default.problem}")
        return Check("binaries", title, "warn", summary, tuple(details), "run it by hand to see why: --list-devices")
    if default is None or default.version is None:
        return Check(
            "binaries",
            title,
            "warn",
            summary + ": cannot tell the version",
            tuple(details),
            "check that `llama-server --version` prints 'version: ...'",
        )
    return Check("binaries", title, "pass", summary, tuple(details))


def check_openvino(m: Machine) -> Check:
    title = "OpenVINO build"
    builds = [b for b in m.builds if b.openvino]
    if not builds:
        return Check("openvino", title, "skip", "no OpenVINO-enabled llama.cpp build found")
    details: list[str] = []
    worst: Status = "pass"
    fixes: list[str] = []
    for build in builds:
        label = f"{build.path} ({build.origin}): {_version_text(build.version)}"
        if build.problem and "GGML_OPENVINO_DEVICE" in build.problem:
            details.append(f"{label}: {build.problem}")
            worst = "fail"
            fixes.append("set GGML_OPENVINO_DEVICE to one of the devices OpenVINO offers (or unset it: CPU)")
            continue
        if m.policy is None or build.version is None:
            details.append(f"{label}: cannot tell whether it splits the KV cache (version or policy unknown)")
            worst = "warn" if worst == "pass" else worst
            fixes.append("safe-llama treats an unknown build as having the single-allocation bug (the safe side)")
            continue
        probe = Probed(backend="openvino", host_budget=m.host.budget_bytes, binary_version=build.version.version)
        if kv_splits(probe, m.policy):
            details.append(f"{label}: splits the KV cache at the device's max allocation (fixed, PR #29124)")
        else:
            details.append(f"{label}: asks for the whole KV cache as one allocation (the single-allocation bug)")
            worst = "warn" if worst == "pass" else worst
            fixes.append(
                "use llama.cpp 0.6.0 or later (PR #29124); until then safe-llama plans around it "
                "(stateful execution, a smaller context)"
            )
    summary = {
        "pass": "no single-allocation bug",
        "warn": "the single-allocation bug, or cannot tell",
        "fail": "the OpenVINO backend refuses its device",
        "skip": "",
    }[worst]
    return Check("openvino", title, worst, summary, tuple(details), "; ".join(dict.fromkeys(fixes)) or None)


def _compute_gpus(m: Machine) -> list[str]:
    return [f"{g.bdf} {g.vendor} (driver {g.driver or 'none'})" for g in m.sysfs.gpus if g.compute]


def check_opencl(m: Machine) -> Check:
    title = "OpenCL"
    gpus = _compute_gpus(m)
    details = [f"ICD: {path}" for path in m.icd_files] or ["no *.icd file"]
    for d in m.opencl.devices:
        details.append(f"{d.name} [{d.device_type}, {d.platform}]: max allocation {human(d.max_mem_alloc_size)}")
    cached = " (cached)" if m.opencl_cached else ""
    driver_fix = (
        "install the GPU vendor's OpenCL driver (Intel: intel-opencl-icd), or declare the limit: "
        "--max-alloc / --profile"
    )
    if m.opencl.status == "error":
        return Check("opencl", title, "warn", f"the probe failed: {m.opencl.note}", tuple(details), driver_fix)
    if m.opencl.status == "no-pyopencl":
        return Check("opencl", title, "warn", m.opencl.note, tuple(details), "pip install pyopencl")
    cl_gpus = [d for d in m.opencl.devices if "GPU" in d.device_type.split("|")]
    if gpus and not cl_gpus:
        return Check(
            "opencl",
            title,
            "warn",
            f"{len(gpus)} GPU(s) in sysfs but no OpenCL GPU: their allocation limit cannot be probed{cached}",
            tuple(details + gpus),
            driver_fix,
        )
    if not m.opencl.devices:
        return Check("opencl", title, "pass", f"no OpenCL device, and no GPU that needs one{cached}", tuple(details))
    return Check("opencl", title, "pass", f"{m.opencl.note}{cached}", tuple(details))


def check_render_nodes(m: Machine) -> Check:
    title = "/dev/dri render nodes"
    gpus = _compute_gpus(m)
    if not gpus and not m.nodes:
        return Check("render-nodes", title, "skip", "no GPU and no render node: nothing to open")
    if gpus and not m.nodes:
        return Check(
            "render-nodes",
            title,
            "fail",
            f"{len(gpus)} GPU(s) but no render node under /dev/dri",
            tuple(gpus),
            "in a container, pass the device (docker/podman run --device /dev/dri); on a host, load the GPU's "
            "kernel driver",
        )
    details = []
    denied: list[NodeAccess] = []
    for node in m.nodes:
        mode = f"{stat.filemode(node.mode)} " if node.mode is not None else ""
        state = "accessible" if node.accessible else "NOT accessible"
        details.append(f"{node.path} {mode}group {node.group or '?'}: {state} (PCI {node.pci_bdf or 'unknown'})")
        if not node.accessible:
            denied.append(node)
    unbound = [g for g in m.sysfs.gpus if g.compute and g.driver is None]
    if denied:
        groups = sorted({n.group for n in denied if n.group})
        pending = [g for g in groups if g in m.listed_groups and g not in m.groups]
        if pending:
            fix = (
                f"you are in {', '.join(pending)} but this login predates it: log out and in (or `newgrp {pending[0]}`)"
            )
        elif groups:
            fix = f"sudo usermod -aG {groups[0]} {m.user}, then log out and in"
        else:
            fix = "give this user read-write access to the render node (its group: see ls -l /dev/dri)"
        return Check(
            "render-nodes",
            title,
            "fail",
            f"{len(denied)} of {len(m.nodes)} render node(s) not open-able by {m.user}",
            tuple(details),
            fix,
        )
    if unbound:
        names = ", ".join(g.bdf for g in unbound)
        return Check("render-nodes", title, "warn", f"no driver bound to {names}", tuple(details), "load its driver")
    return Check("render-nodes", title, "pass", f"{len(m.nodes)} render node(s), all accessible", tuple(details))


def check_neo_filter(m: Machine) -> Check:
    """Intel's runtime shows every GPU unless NEOReadDebugKeys=1 and FilterBdfPath pin it to the target's."""
    title = "NEO filter variables"
    intel = [g for g in m.sysfs.gpus if g.compute and g.vendor_id == INTEL]
    others = [g for g in m.sysfs.gpus if g.compute and g.vendor_id != INTEL]
    set_now = {k: m.env[k] for k in ("NEOReadDebugKeys", "FilterBdfPath") if k in m.env}
    details = [f"{k}={v}" for k, v in set_now.items()] or ["neither NEOReadDebugKeys nor FilterBdfPath is set"]
    target = m.target
    hiding = [w for w in (target.warnings if target else ()) if "FilterBdfPath" in w]
    if hiding:
        return Check(
            "neo-filter",
            title,
            "fail",
            hiding[0],
            tuple(details),
            f"unset FilterBdfPath, or set it to {target.pci_bdf if target else 'the target GPU'}",
        )
    wanted = dict(target.neo_filter) if target and target.neo_filter else {}
    if not wanted and intel and len(intel) + len(others) > 1:
        chosen = next((g for g in intel if g.integrated), intel[0])
        wanted = {"NEOReadDebugKeys": "1", "FilterBdfPath": chosen.bdf}
        details.append(f"several GPUs: an OpenVINO, SYCL or OpenCL run targets the Intel one, {chosen.bdf}")
    if not wanted:
        if not intel:
            return Check("neo-filter", title, "skip", "no Intel GPU: the NEO variables do not apply", tuple(details))
        return Check("neo-filter", title, "pass", "one GPU: no filter needed", tuple(details))
    filter_ok = m.env.get("NEOReadDebugKeys") == "1" and m.env.get("FilterBdfPath", "\0") in wanted["FilterBdfPath"]
    if filter_ok:
        return Check(
            "neo-filter", title, "pass", f"only {wanted['FilterBdfPath']} is visible to Intel's runtime", tuple(details)
        )
    exports = " ".join(f"{k}={v}" for k, v in wanted.items())
    return Check(
        "neo-filter",
        title,
        "warn",
        "several GPUs and no NEO filter: llama.cpp may run on another device (or the CPU)",
        tuple(details),
        f"export {exports} (safe-llama sets these itself for the runs it launches)",
    )


def check_directories(m: Machine) -> Check:
    title = "cache and config directories"
    problems: list[str] = []
    warnings: list[str] = []
    details = []
    for d in m.directories:
        state = "missing (created on first use)" if d.mode is None else stat.filemode(d.mode)
        details.append(f"{d.role}: {d.path} {state}" + (f"; {d.note}" if d.note else ""))
        if d.note:
            warnings.append(d.note)
        if d.untrusted:
            problems.append(f"{d.path} is not used: {d.untrusted}")
        elif d.symlink:
            problems.append(f"{d.path} is a symlink: safe-llama never writes through one")
        elif d.exists and not d.is_dir:
            problems.append(f"{d.path} is not a directory")
        elif not d.writable:
            problems.append(f"{d.path} is not writable by {m.user}")
        elif d.exists and not d.owned:
            problems.append(f"{d.path} belongs to another user")
    details += [f"config: {p}" for p in m.config_problems]
    problems += list(m.config_problems)
    details += [f"cache entry: {p}" for p in m.bad_entries]
    problems += [f"a bad cache entry: {p}" for p in m.bad_entries]
    if problems:
        return Check("directories", title, "fail", problems[0], tuple(details), _dir_fix(problems[0]))
    if warnings:
        return Check("directories", title, "warn", warnings[0], tuple(details), _dir_fix(warnings[0]))
    return Check("directories", title, "pass", "usable", tuple(details))


def _dir_fix(problem: str) -> str:
    if "bad cache entry" in problem:
        return "safe-llama forget (it clears every kind of cache entry; a launch also removes a bad one it meets)"
    if " is not used: " in problem:
        return (
            "make every folder on the path yours (or root's) and writable by no one else, "
            "or point XDG_CACHE_HOME / XDG_CONFIG_HOME at a private folder"
        )
    if "symlink" in problem or "not a directory" in problem:
        return "move it away; safe-llama recreates the directory"
    if "another user" in problem or "not writable" in problem:
        return "chown -R $USER of it, or point XDG_CACHE_HOME / XDG_CONFIG_HOME elsewhere"
    if "relative" in problem:
        return "give XDG_CACHE_HOME / XDG_CONFIG_HOME an absolute path"
    return "fix the file named above (safe-llama names the line)"


def check_host_memory(m: Machine) -> Check:
    title = "host memory budget"
    h = m.host
    budget = h.budget_bytes
    details = [
        f"RAM {human(h.total.value)}, available {human(h.available.value)}",
        f"cgroup limit: {human(h.cgroup_max.value) if h.cgroup_max else 'none'} ({h.note})",
        f"RLIMIT_AS: {human(h.rlimit_as.value) if h.rlimit_as else 'unlimited'}",
    ]
    summary = f"{human(budget.value)} ({budget.detail})"
    floor = 256 << 20
    if m.policy:  # the process itself with the bundled model's 262,144-token vocabulary at the context floor
        p = m.policy
        floor = p.per_backend(p.process_overhead, "cpu") + p.process_per_vocab_token * 262_144
        floor += p.process_per_cell * p.ctx_floor
    if budget.value < floor:
        return Check(
            "host-memory",
            title,
            "fail",
            summary + f": below the {human(floor)} a llama.cpp process needs to start",
            tuple(details),
            "free memory, or raise the limit that binds (named above)",
        )
    if h.rlimit_as is not None:
        return Check(
            "host-memory",
            title,
            "warn",
            summary + ": an address-space limit (ulimit -v)",
            tuple(details),
            "llama.cpp reserves address space it never uses: prefer a cgroup memory limit (systemd MemoryMax=) "
            "to ulimit -v; safe-llama sets MALLOC_ARENA_MAX for the runs it launches",
        )
    if budget.value < SMALL_HOST_BUDGET:
        return Check(
            "host-memory",
            title,
            "warn",
            summary + ": only small models and contexts fit",
            tuple(details),
            "free memory or raise the limit named above",
        )
    return Check("host-memory", title, "pass", summary, tuple(details))


CHECKS: tuple[Callable[[Machine], Check], ...] = (
    check_binaries,
    check_openvino,
    check_opencl,
    check_render_nodes,
    check_neo_filter,
    check_directories,
    check_host_memory,
)


def run_checks(m: Machine, checks: Sequence[Callable[[Machine], Check]] = CHECKS) -> tuple[Check, ...]:
    return tuple(check(m) for check in checks)


def exit_code(checks: Sequence[Check]) -> int:
    """Nothing failed (warnings and skips included): OK; a check failed: FAILED."""
    return int(ExitStatus.FAILED if any(c.status == "fail" for c in checks) else ExitStatus.OK)


# ---------------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------------


def render_text(checks: Sequence[Check]) -> str:
    counts = {s: sum(1 for c in checks if c.status == s) for s in ("pass", "warn", "fail", "skip")}
    lines = []
    for c in checks:
        lines.append(f"{c.status.upper():<5} {c.title:<30} {c.summary}")
        lines += [f"{'':<6}{d}" for d in c.details]
        if c.fix and c.status in ("warn", "fail"):
            lines.append(f"{'':<6}fix: {c.fix}")
    lines.append("")
    lines.append(
        f"{len(checks)} checks: {counts['pass']} passed, {counts['warn']} warned, {counts['fail']} failed, "
        f"{counts['skip']} skipped"
    )
    return "\n".join(lines) + "\n"


def render_json(checks: Sequence[Check]) -> str:
    body = {
        "schema": 1,
        "checks": [dataclasses.asdict(c) for c in checks],
        "failed": sum(1 for c in checks if c.status == "fail"),
        "warned": sum(1 for c in checks if c.status == "warn"),
        "exit_code": exit_code(checks),
    }
    return json.dumps(body, indent=1)


# ---------------------------------------------------------------------------------------------------
# The shell: gathering a Machine
# ---------------------------------------------------------------------------------------------------

SYSTEM_ROOTS = ProbeRoots()


def read_group_file(path: Path) -> dict[int, tuple[str, tuple[str, ...]]]:
    """gid -> (name, members) from a group(5) file; empty when unreadable."""
    groups: dict[int, tuple[str, tuple[str, ...]]] = {}
    try:
        text = path.read_text()
    except OSError:
        return groups
    for line in text.splitlines():
        parts = line.split(":")
        if len(parts) >= 4 and parts[2].isdigit():
            groups[int(parts[2])] = (parts[0], tuple(p for p in parts[3].split(",") if p))
    return groups


def _icd_files(env: Mapping[str, str], etc_root: Path) -> tuple[str, ...]:
    # the same directories the ICD loader reads (probe_opencl's rule), with /etc under etc_root
    override = env.get("OCL_ICD_VENDORS") or env.get("OPENCL_VENDOR_PATH")
    directories = (
        [Path(override)] if override else [etc_root / "OpenCL" / "vendors", Path(sys.prefix) / "etc/OpenCL/vendors"]
    )
    found: list[str] = []
    for directory in directories:
        if directory.is_file():
            found.append(str(directory))
        elif directory.is_dir():
            found += sorted(str(p) for p in directory.iterdir() if p.suffix == ".icd")
    return tuple(found)


def _directory(role: str, path: Path, variable: str, env: Mapping[str, str], uid: int) -> Directory:
    value = env.get(variable, "")
    note = f"{variable}={value} is relative, so it is ignored" if value and not os.path.isabs(value) else ""
    try:
        st = path.lstat()
    except OSError:
        parent = path.parent
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        return Directory(role, str(path), False, False, False, os.access(parent, os.W_OK | os.X_OK), None, True, note)
    return Directory(
        role=role,
        path=str(path),
        exists=True,
        is_dir=stat.S_ISDIR(st.st_mode),
        symlink=stat.S_ISLNK(st.st_mode),
        writable=os.access(path, os.W_OK | os.X_OK),
        mode=st.st_mode,
        owned=st.st_uid == uid,
        note=note,
        untrusted=trust.problem(path) or "",
    )


def _config_problems(env: Mapping[str, str]) -> tuple[tuple[str, ...], Policy | None]:
    from safe_llama.diagnosis.explain_words import load_words

    problems: list[str] = []
    policy = None
    user_config = config_dir(env) / "config.toml"
    try:
        # read here first: a syntax error in it would otherwise be reported against the packaged planner.toml
        if user_config.is_file():
            tomllib.loads(user_config.read_text())
        policy = load_policy(configs_dir(env) / "planner.toml", user_config)
    except (OSError, tomllib.TOMLDecodeError) as err:
        problems.append(f"{user_config}: {err}")
    except SafeLlamaError as err:
        problems.append(err.message.removeprefix("safe-llama: "))
    checks: list[Callable[[], object]] = [
        lambda: load_profiles(env),
        lambda: load_words(configs_dir(env) / "explain.toml"),
        lambda: load_table(Path(env["SAFE_LLAMA_SIGNATURES"]) if env.get("SAFE_LLAMA_SIGNATURES") else None),
    ]
    for load in checks:
        try:
            load()
        except SafeLlamaError as err:
            problems.append(err.message.removeprefix("safe-llama: "))
    return tuple(problems), policy


def _build(path: Path, origin: str, env: Mapping[str, str], cache: Path, refresh: bool) -> Build:
    try:
        probe = probe_llama(path, env=env, cache=cache, refresh=refresh)
    except (OSError, SafeLlamaError) as err:
        return Build(str(path), origin, None, (), f"could not run it: {err}")
    return Build(str(path), origin, probe.version, probe.listed.devices, probe.listed.problem)


def probe_machine(
    *,
    env: Mapping[str, str] = os.environ,
    roots: ProbeRoots = SYSTEM_ROOTS,
    etc_root: Path = Path("/etc"),
    refresh: bool = False,
) -> Machine:
    """The Machine as the probes see it (their caches reused: no model is read, llama.cpp runs only when
    its cached `--list-devices`/`--version` is stale). `roots` and `etc_root` point at fixture trees in tests."""
    uid = os.getuid()
    group_db = read_group_file(etc_root / GROUP_FILE)
    user = env.get("USER") or env.get("LOGNAME") or str(uid)
    binaries: list[Binary] = []
    for tool in TOOL_BINARY:
        try:
            path, source = locate_binary(tool, env=env)
            binaries.append(Binary(tool, str(path), None, source))
        except SafeLlamaError as err:
            binaries.append(Binary(tool, None, err.message.removeprefix("safe-llama: ")))
    cache = cache_dir(env) / "probe"
    server = next((b.path for b in binaries if b.tool == "server" and b.path), None)
    builds = [_build(Path(server), SEARCH_PATH, env, cache, refresh)] if server else []
    pinned_openvino = pinned_bin_dir("openvino", env) / TOOL_BINARY["server"]
    if pinned_openvino.is_file() and (server is None or Path(server).resolve() != pinned_openvino.resolve()):
        builds.append(_build(pinned_openvino, PINNED_OPENVINO, env, cache, refresh))
    report = probe_devices(
        binary=Path(server) if server else None, env=env, refresh=refresh, roots=roots, binary_note="no llama-server"
    )
    nodes = []
    for node in report.sysfs.render_nodes:
        try:
            st = os.stat(node.path)
            group, mode = group_db.get(st.st_gid, (str(st.st_gid), ()))[0], st.st_mode
        except OSError:
            group, mode = None, None
        nodes.append(NodeAccess(node.path, node.pci_bdf, node.accessible, group, mode))
    problems, policy = _config_problems(env)
    return Machine(
        env=dict(env),
        user=user,
        groups=tuple(group_db.get(g, (str(g), ()))[0] for g in sorted({os.getgid(), *os.getgroups()})),
        listed_groups=tuple(name for gid, (name, members) in sorted(group_db.items()) if user in members),
        binaries=tuple(binaries),
        builds=tuple(builds),
        icd_files=_icd_files(env, etc_root),
        opencl=report.opencl,
        opencl_cached=report.opencl_cached,
        sysfs=report.sysfs,
        nodes=tuple(nodes),
        target=report.target,
        host=report.host,
        directories=(
            _directory("cache", cache_dir(env), "XDG_CACHE_HOME", env, uid),
            _directory("config", config_dir(env), "XDG_CONFIG_HOME", env, uid),
        ),
        config_problems=problems,
        policy=policy,
        bad_entries=tuple(check_entries(cache_dir(env))),
    )


def run_doctor(
    *, json_out: bool = False, refresh: bool = False, env: Mapping[str, str] = os.environ, out: TextIO | None = None
) -> int:
    """`safe-llama doctor`: probe, check, print; 0 when nothing failed, 1 when a check failed."""
    checks = run_checks(probe_machine(env=env, refresh=refresh))
    (sys.stdout if out is None else out).write(render_json(checks) + "\n" if json_out else render_text(checks))
    return exit_code(checks)


def main(settings: Mapping[str, str], words: list[str]) -> int:
    """The command's runner (cmdline.own_options.COMMANDS): `doctor`'s options as entry.py read them."""
    return run_doctor(json_out=bool(flag(settings, "json")), refresh=bool(flag(settings, "refresh")))

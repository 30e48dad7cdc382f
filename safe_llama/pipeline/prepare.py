"""The commands' bodies: each gathers facts, calls the pure core, and renders one result.

Owns the order of the steps for a command; must not hold policy nor parse options itself.

Over 400 lines on purpose: the one road from a command line to a plan (prepare, replan) and the options and
result it carries; its parts with a concern of their own (remote_header, model_scan) are already out.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from safe_llama.cmdline.llama_args import CommandLine, misread_numbers, parse, rewrite
from safe_llama.cmdline.memory_flags import Draft, Layout, gpu_layers
from safe_llama.cmdline.model_source import ModelSource, resolve, resolve_hf
from safe_llama.cmdline.request import Request, to_request
from safe_llama.device.free_memory import match_reading
from safe_llama.device.host_budget import HostBudget
from safe_llama.device.limits import DeclaredLimits
from safe_llama.device.llama_listing import LlamaDevice
from safe_llama.device.reservations import (
    ARRIVING,
    NO_OTHERS,
    Launch,
    Others,
    device_key,
    host_limits_with,
    others,
    visible_of,
)
from safe_llama.device.target_device import TargetDevice
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.model.facts import ModelFacts
from safe_llama.model.facts_cache import facts_for
from safe_llama.model.kv import KvPlan
from safe_llama.paths import cache_dir, config_dir, configs_dir
from safe_llama.plan.lessons import Lessons
from safe_llama.plan.planner import Plan, plan
from safe_llama.plan.policy import load_policy
from safe_llama.plan.target import (
    Target,
    remote_devices,
    target_from,
    target_policy,
)
from safe_llama.units import human

if TYPE_CHECKING:
    from safe_llama.device.probe_free import NvmlRead
    from safe_llama.device.probing import DeviceReport


@dataclass(frozen=True)
class PlanOptions:
    """safe-llama's own planning options (from its command line, SAFE_LLAMA_* or the config file)."""

    ladder: tuple[str, ...] | None = None
    min_ctx: int | None = None
    declared: DeclaredLimits = field(default_factory=DeclaredLimits)
    llama_bin: str | None = None
    llama_bin_from: str = "--llama-bin"  # where llama_bin was set: the option, its variable, the config file
    llama_version: str | None = None  # planning for another build: its `--version`
    kv_split: bool | None = None  # force the allocation model: split at max alloc, or one buffer
    share: float | None = None  # --share: at most this part of the device's and the host's memory
    # the launch can hand its supervision off as it starts llama-server (attempts/at_spawn.eligible): under a
    # cgroup, on the CPU, the plan counts what that gives back (Probed.own_charge)
    hand_off_at_spawn: bool = False


DEFAULT_ATTEMPTS = 4


@dataclass(frozen=True)
class LaunchOptions:
    """The launch's options; beside PlanOptions so `plan` resolves them without importing the launcher."""

    plan: PlanOptions = field(default_factory=PlanOptions)
    predict: bool = True  # False: the first attempt runs the command line as given
    attempts: int = DEFAULT_ATTEMPTS
    remember: bool = True
    hand_off: bool = True  # False: the full supervisor stays once llama-server is ready (attempts/handoff.py)


@dataclass(frozen=True)
class Prepared:
    """A command line ready to launch: its model, its device's limits and the plan (or why none fits)."""

    cmd: CommandLine
    request: Request
    model_path: str
    facts: ModelFacts
    target: Target
    binary: Path | None
    plan: Plan | None
    error: SafeLlamaError | None  # NOTHING_FITS
    source: ModelSource | None = None  # None: no source given, the bundled model
    layout: Layout = field(default_factory=Layout)
    notes: tuple[str, ...] = ()  # about the command line (a draft not downloaded, a context too long)
    # said before the launch, one line each: options added to the user's command line (the bundled chat), a
    # secret others can read (key_warnings)
    announce: tuple[str, ...] = ()
    device: TargetDevice | None = None  # the probed device, to read its free memory again after a failure
    others: Others = NO_OTHERS  # the other safe-llama launches on this machine (the ledger) and what they reserved
    device_key: str = ""  # the device's key in the ledger (device.reservations.device_key)
    cgroup_dir: str = ""  # the cgroup folder whose limit the plan keeps to ("" none)
    bundled: bool = False  # the model is the bundled one (no source given, or its file under another name)


def _is_bundled(path: str, env: Mapping[str, str]) -> bool:
    from safe_llama.model.bundled import is_bundled_model

    return is_bundled_model(path, env)


def model_path_for(source: ModelSource | None, env: Mapping[str, str]) -> str:
    """The file to plan on: the source's (on disk: one not downloaded yet is read by remote_header.py), never
    the bundled model when a source is given."""
    if source is not None:
        assert source.path is not None, "a model not downloaded yet has no file to plan on"
        return source.path
    from safe_llama.model.bundled import bundled_model_path

    return str(bundled_model_path(env))


def _file_size(path: str | None) -> int:
    try:
        return os.stat(path).st_size if path else 0
    except OSError:
        return 0


def layout_for(
    req: Request, source: ModelSource | None, env: Mapping[str, str], *, remote_mmproj_bytes: int = 0
) -> tuple[Layout, tuple[str, ...]]:
    """The request's layout with the files it names read (draft facts, projector size); remote_mmproj_bytes:
    the projector llama.cpp downloads beside a model not downloaded yet (its size from the repository's list)."""
    notes: list[str] = []
    draft = None
    if req.draft is not None:
        draft_path = req.draft.model
        if req.draft.hf_repo:
            found = resolve_hf(req.draft.hf_repo, None, req.cmd.tool, env, mmproj=False)
            draft_path = found.path
            if found.path is None:
                notes.append(f"draft model {req.draft.hf_repo} is not downloaded yet: planned without it")
        if draft_path:
            draft = Draft(facts=facts_for(draft_path, env), options=req.draft.options)
    mmproj = req.mmproj or (source.mmproj if source is not None else None)
    mmproj_bytes = _file_size(mmproj) if mmproj else remote_mmproj_bytes
    return replace(req.layout, mmproj_bytes=mmproj_bytes, draft=draft), tuple(notes)


def key_warnings(cmd: CommandLine) -> tuple[str, ...]:
    """An API key others can read: given on the command line (every user sees it in `ps`, here and in
    llama-server's), or in an --api-key-file that group or others may read. One line each, naming the fix."""
    warnings = []
    key = cmd.settings.get("--api-key")
    if key is not None and key.source == "argv":
        warnings.append(
            "--api-key on the command line is visible to every user (ps): put the key in a file only you "
            "can read (chmod 600) and give --api-key-file FILE, or set LLAMA_API_KEY"
        )
    named = cmd.value("--api-key-file")
    if isinstance(named, str):
        try:
            mode = os.stat(named).st_mode
        except OSError:
            return tuple(warnings)  # llama-server says a missing file itself
        if mode & 0o044:
            who = "group and others" if mode & 0o040 and mode & 0o004 else "others" if mode & 0o004 else "its group"
            warnings.append(
                # the file's path is a secret option's value (configs/secrets.toml): not named
                f"the --api-key-file is readable by {who} (mode {mode & 0o777:04o}): chmod 600 it"
            )
    return tuple(warnings)


def prepare(
    tool: str, args: Sequence[str], env: Mapping[str, str], options: PlanOptions, *, binary: Path | None = None
) -> Prepared:
    """Facts about the model and the device, and the plan (or why nothing fits). `binary`: the llama.cpp
    tool already found by the caller (the launcher), so it is not looked up twice. Where NVIDIA's driver is
    loaded, its free-memory read starts first, in a child, and is collected when the devices are probed."""
    from safe_llama.device.probe_free import NvmlRead, nvidia_driver_loaded

    nvml = NvmlRead() if nvidia_driver_loaded() else None
    try:
        return _prepare(tool, args, env, options, binary, nvml)
    finally:
        if nvml is not None:
            nvml.cancel()  # nothing left to do once its result was taken


def _prepare(
    tool: str, args: Sequence[str], env: Mapping[str, str], options: PlanOptions, binary: Path | None,
    nvml: NvmlRead | None,
) -> Prepared:  # fmt: skip
    from safe_llama.device import ledger
    from safe_llama.device.binaries import find_binary
    from safe_llama.device.probing import probe_devices

    cmd = parse(tool, args, env)
    rpc = cmd.value("--rpc")
    servers = rpc if isinstance(rpc, str) and rpc else None
    source = resolve(cmd, env)
    announce: tuple[str, ...] = ()
    not_downloaded = source is not None and not source.on_disk  # its header is read where llama.cpp downloads it
    if not not_downloaded:
        path = model_path_for(source, env)
    bundled = source is None or (not not_downloaded and _is_bundled(path, env))
    if bundled:  # the bundled model, however named: in a chat, what it needs for each reply to end
        from safe_llama.cmdline.bundled_chat import chat_options, load_chat_defaults

        added, line = chat_options(
            tool, args, env, load_chat_defaults(configs_dir(env) / "bundled-model.toml", cache_dir(env))
        )
        if line is not None:
            args, announce = [*args, *added], (line,)
            cmd = parse(tool, args, env)
    announce += misread_numbers(cmd) + key_warnings(cmd)
    req = to_request(cmd)
    remote_mmproj = 0
    if not_downloaded:
        from safe_llama.pipeline.remote_header import read_remote

        assert source is not None
        remote = read_remote(source, cmd, env)
        path, facts, remote_mmproj = remote.url, remote.facts, remote.mmproj_bytes
        announce = (remote.line(source.spec, cmd.tool), *announce)
    else:
        facts = facts_for(path, env)
    layout, notes = layout_for(req, source, env, remote_mmproj_bytes=remote_mmproj)
    try:
        binary = binary or find_binary(tool, env=env, explicit=options.llama_bin, explicit_from=options.llama_bin_from)
    except SafeLlamaError:
        if options.llama_bin:
            raise
        binary = None  # planning without a binary: the declared limits and the host budget only
    # before the probes: what is resident now is charged by then
    launches, children, resident = ledger.snapshot(env, but=os.getpid())
    report = probe_devices(
        binary=binary, command=cmd, env=env, declared=options.declared, opencl_always=False, rpc_servers=servers,
        nvml=nvml,
    )  # fmt: skip
    listed_rpc: tuple[LlamaDevice, ...] = ()
    if servers is not None:
        if report.rpc is None:
            raise SafeLlamaError(
                f"safe-llama: --rpc {servers}: no llama.cpp binary to list the workers' devices", ExitStatus.USAGE
            )
        if report.rpc.problem is not None or not report.rpc.devices:
            raise SafeLlamaError(
                f"safe-llama: --rpc {servers}: {report.rpc.problem or 'no worker device listed'}",
                ExitStatus.WORKER_UNAVAILABLE,
            )
        listed_rpc = report.rpc.devices
    workers = remote_devices(listed_rpc, options.declared.rpc_memory)
    target = replace(probed_target(report, options, env), remote=workers)
    launches += _arrived(env, launches)
    # a hand-off at the spawn counted only where this launch is alone (the ledger shows no other in its group, none
    # arriving): launches that share a group each count their full supervisor, as before (attempts/at_spawn.py)
    group = report.host.cgroup_dir or ""
    alone = not any(launch.cgroup == group or launch.state == ARRIVING for launch in launches)
    if options.hand_off_at_spawn and alone and tool == "server" and target.backend == "cpu" and not target.on_gpu:
        from safe_llama.device.probe_host import own_anon_bytes

        if any(limit.kind == "cgroup" for limit in target.limits_on_host):
            target = replace(target, own_charge=own_anon_bytes() or 0)
    reading, _ = match_reading(report.target.listed, report.target.pci, report.free.readings, env)
    key = device_key(
        target.backend, target.device, reading.uuid if reading else None, report.target.pci_bdf
    ) if target.on_gpu else ""  # fmt: skip
    gpu_use = dict(reading.processes) if reading is not None and reading.processes is not None else None
    if gpu_use and launches and ledger.foreign(list(gpu_use)):
        gpu_use = None  # NVML's pids are another namespace's: matched to no launch
    seen = others(launches, visible_of(children, resident, gpu_use), device=key, cgroup=report.host.cgroup_dir or "")
    target = _shared(target, seen, options.share, report.host)
    prepared = Prepared(
        cmd, req, path, facts, target, binary, None, None, source, layout, notes, announce, report.target, seen, key,
        report.host.cgroup_dir or "", bundled,
    )  # fmt: skip
    return replan(prepared, options, Lessons(), env)


def probed_target(report: DeviceReport, options: PlanOptions, env: Mapping[str, str]) -> Target:
    """The planner's view of a probed device: what every plan made on this machine starts from (a launch's,
    `plan`'s, each of `models`' places)."""
    version = options.llama_version or (report.llama.version.version if report.llama and report.llama.version else None)
    return target_from(
        report.target,
        report.host,
        binary_version=version,
        profile=report.profile,
        kv_split=options.kv_split,
        malloc_arena_max_set="MALLOC_ARENA_MAX" in env,
    )


def _arrived(env: Mapping[str, str], known: Sequence[Launch]) -> tuple[Launch, ...]:
    """The launches that started while this one probed (read again after the probes: they hold nothing yet)."""
    from safe_llama.device import ledger

    seen = {launch.pid for launch in known}
    return tuple(
        launch
        for launch in ledger.read_all(env, but=os.getpid())
        if launch.state == ARRIVING and launch.pid not in seen
    )


def _shared(target: Target, seen: Others, share: float | None, host: HostBudget) -> Target:
    """The target less what other launches reserved and do not hold yet, and within the share: --share's, else
    an equal part with the launches that started together and have not planned yet."""
    from safe_llama.device import ledger

    why = "--share" if share is not None else f"{1 + seen.arriving} launches started together"
    share = share if share is not None else seen.implied_share()
    if seen.device is None and not seen.host_cgroup and not seen.host_ram and share is None:
        return target
    ceilings = {"ram": host.total.value} | ({"cgroup": host.cgroup_max.value} if host.cgroup_max is not None else {})
    own = ledger.resident([os.getpid()]).get(os.getpid(), 0) if share is not None else 0
    limits = host_limits_with(target.limits_on_host, seen, share, ceilings, why, own)
    budget = min((limit.budget for limit in limits), key=lambda s: s.value)
    return replace(
        target, device_reserved=seen.device, share=share, share_why=why, host_limits=limits, host_budget=budget
    )


def booking(prepared: Prepared) -> tuple[str, str, str, int, int, str]:
    """What this launch's ledger entry says of its plan (a reservations.Launch less its process, tool and state):
    its label, the device's key and llama.cpp's name, what it reserves there (with the runtime's own part) and on
    the host, its cgroup folder. A launch record keeps it for an early start's entry (fast_record.py)."""
    from safe_llama.device.ledger import label

    decided, target = prepared.plan, prepared.target
    assert decided is not None  # llama.cpp run as given books nothing
    device = sum(a.bytes for a in decided.allocations if a.buffer == "device total" and a.place == target.device)
    hosts = {a.host_kind: a.bytes for a in decided.allocations if a.buffer == "host total"}
    device, host = (device + target.device_runtime if device else 0), hosts.get("cgroup", hosts.get("ram", 0))
    return label(prepared.model_path), prepared.device_key, target.device or "", device, host, prepared.cgroup_dir


def replan(prepared: Prepared, options: PlanOptions, lessons: Lessons, env: Mapping[str, str]) -> Prepared:
    """The plan again for the same model and device, with what failed starts taught (a device limit, a KV
    cap: the new target holds them): the model and the devices are not read again (the policy files are,
    through load_policy's cache)."""
    cmd, req, facts = prepared.cmd, prepared.request, prepared.facts
    probed = prepared.target.probed
    if probed.own_charge and not options.hand_off_at_spawn:  # a retry: its full supervisor stays (at_spawn.py)
        probed = replace(probed, own_charge=0)
    policy = load_policy(configs_dir(env) / "planner.toml", config_dir(env) / "config.toml", keep_in=cache_dir(env))
    target = Target.of(probed, target_policy(policy, probed), lessons)
    try:
        decided: Plan | None = plan(
            facts,
            req.kv,
            target,
            policy,
            ladder=options.ladder,
            user_fit_set=cmd.get("--fit") is not None,
            user_ngl=gpu_layers(cmd),
            user_kv_types=cmd.get("--cache-type-k") is not None or cmd.get("--cache-type-v") is not None,
            floor=options.min_ctx,
            layout=prepared.layout,
            user_env=env,
        )
        error = None
    except SafeLlamaError as err:
        if err.status != ExitStatus.NOTHING_FITS:
            raise
        decided, error = None, err
    return replace(prepared, target=target, plan=decided, error=error)


def free_again(prepared: Prepared, env: Mapping[str, str]) -> tuple[Prepared, str | None]:
    """The GPU's free memory read again after a failed start (another program may hold more now), and a line
    saying so when it moved."""
    from safe_llama.device.probing import free_again as read_again

    before = prepared.target.device_free
    if before is None or prepared.device is None:
        return prepared, None
    again = read_again(prepared.device, prepared.binary, env)
    if again is None:
        return prepared, None
    now, listed = again
    said = None
    if abs(now.value - before.value) > before.value // 100:
        name = prepared.target.device or "the GPU"
        said = f"{name}: {human(now.value)} free now, {human(before.value)} when planned: planning with it"
    return replace(prepared, target=replace(prepared.target, device_free=now, device_free_listed=listed)), said


def final_argv(prepared: Prepared) -> list[str]:
    """The tool's argv as the plan launches it: the user's, with the plan's explicit changes."""
    changes = dict(prepared.plan.argv_changes) if prepared.plan else {}
    if prepared.source is None:  # no source at all: the bundled model, named explicitly
        changes["--model"] = prepared.model_path
    return rewrite(prepared.cmd, changes)


def context_note(facts: ModelFacts, kv: KvPlan, tool: str) -> str | None:
    """One line when the context per sequence is above the trained context."""
    ctx = kv.context
    train = facts.context_length
    if not train or ctx.n_ctx_seq <= train:
        return None
    extra = kv.total_bytes - kv.total_bytes * train // max(ctx.n_ctx_seq, 1)
    what = (
        f"llama-server caps each slot at {train} tokens"
        if tool == "server"
        else f"llama.cpp warns of a training context overflow past {train} tokens"
    )
    return (
        f"context {ctx.n_ctx_seq} per sequence is above the model's trained context {train}: {what}; "
        f"the {ctx.n_ctx_seq - train} extra cells cost about {human(extra)} of KV"
    )

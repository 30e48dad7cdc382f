"""What fits where, for many models at once: each device llama.cpp lists and the host, probed as a launch probes
its target (device.probing, plan.target), and each model planned on each by the launch's own planner, with the
command line's memory flags.

Owns the places (one target per device, and the host's) and the verdict per model and place; must not render
(commands.models does) nor find the models (model_scan).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from safe_llama.cmdline.llama_args import CommandLine, parse
from safe_llama.cmdline.memory_flags import Layout, LlamaSettings, gpu_layers
from safe_llama.cmdline.request import Request, to_request
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.model.facts import ModelFacts
from safe_llama.paths import cache_dir, config_dir, configs_dir
from safe_llama.pipeline.prepare import PlanOptions, probed_target
from safe_llama.plan.lessons import Lessons
from safe_llama.plan.memory import memory_by_place
from safe_llama.plan.planner import Plan, plan
from safe_llama.plan.policy import Policy, load_policy
from safe_llama.plan.target import Target, target_policy


@dataclass(frozen=True)
class Place:
    """A device (or the host) as the planner sees it, and how to name it."""

    name: str  # CUDA0, Vulkan0, host
    description: str  # the hardware llama.cpp names, the host's budget
    target: Target


@dataclass(frozen=True)
class Verdict:
    place: str
    plan: Plan | None  # None: nothing fits there (error says what)
    error: str | None
    settings: LlamaSettings  # the plan's, or what was asked when nothing fits

    def memory(self, facts: ModelFacts, place: Place) -> dict[str, dict[str, int]]:
        """Bytes per place and item (plan.memory.memory_by_place): for --json only, as it costs a plan's worth."""
        return memory_by_place(facts, self.settings, place.target)


@dataclass(frozen=True)
class Asked:
    """The command line every model is planned with (its -c, cache types, -ngl, -np ...)."""

    cmd: CommandLine
    request: Request
    env: Mapping[str, str]  # what llama.cpp would inherit (the user's stateful execution, NEO filter)


def asked(tool: str, args: Sequence[str], env: Mapping[str, str]) -> Asked:
    cmd = parse(tool, args, env)
    return Asked(cmd, to_request(cmd), env)


def load_planner_policy(env: Mapping[str, str]) -> Policy:
    return load_policy(configs_dir(env) / "planner.toml", config_dir(env) / "config.toml", keep_in=cache_dir(env))


def places(
    tool: str, args: Sequence[str], env: Mapping[str, str], options: PlanOptions, policy: Policy
) -> tuple[Place, ...]:
    """Each device llama.cpp lists (each as `-dev NAME` would target it) and the host (`-dev none`); only the
    command line's own device when it names one (-dev)."""
    from safe_llama.device.binaries import find_binary
    from safe_llama.device.probe_free import NvmlRead, nvidia_driver_loaded
    from safe_llama.device.probing import probe_devices
    from safe_llama.units import human

    try:
        binary: Path | None = find_binary(tool, env=env, explicit=options.llama_bin)
    except SafeLlamaError:
        if options.llama_bin:
            raise
        binary = None

    def probe(extra: Sequence[str]) -> Place:
        nvml = NvmlRead() if nvidia_driver_loaded() else None
        try:
            report = probe_devices(
                binary=binary, command=parse(tool, [*args, *extra], env), env=env, declared=options.declared,
                opencl_always=False, nvml=nvml,
            )  # fmt: skip
        finally:
            if nvml is not None:
                nvml.cancel()
        probed = probed_target(report, options, env)
        target = Target.of(probed, target_policy(policy, probed), Lessons())  # as replan makes it
        if target.on_gpu:
            free = target.device_free or target.device_memory
            said = (
                f"{human(free.value)} free"
                if free is not None
                else f"integrated: the host's {human(target.host_budget.value)}"
                if target.integrated
                else "memory unknown"
            )
            return Place(target.device or target.backend, f"{report.target.description}, {said}", target)
        budget = target.host_budget
        return Place("host", f"{human(budget.value)} ({budget.source}: {budget.detail})", target)

    own = parse(tool, args, env)
    if own.get("--device") is not None:
        return (probe(()),)
    first = probe(())
    listed = _listed(binary, env)
    found = [probe(("--device", name)) for name in listed] if listed else ([first] if first.target.on_gpu else [])
    host = first if not first.target.on_gpu else probe(("--device", "none"))
    return (*[p for p in found if p.target.on_gpu], host)


def _listed(binary: Path | None, env: Mapping[str, str]) -> list[str]:
    """The devices llama.cpp lists (its cached listing)."""
    from safe_llama.device.drivers import DEFAULT_ROOTS, driver_state
    from safe_llama.device.probing import probe_llama

    if binary is None:
        return []
    try:
        llama = probe_llama(binary, env=env, cache=cache_dir(env) / "probe", drivers=driver_state(DEFAULT_ROOTS))
    except (OSError, SafeLlamaError):
        return []
    return [d.name for d in llama.listed.devices if d.selected is not False]


def verdict(
    facts: ModelFacts, want: Asked, place: Place, policy: Policy, options: PlanOptions, *, mmproj_bytes: int = 0
) -> Verdict:
    """The launch's plan for this model on this place (replan's call), or why nothing fits."""
    layout: Layout = replace(want.request.layout, mmproj_bytes=mmproj_bytes)
    try:
        decided = plan(
            facts,
            want.request.kv,
            place.target,
            policy,
            ladder=options.ladder,
            user_fit_set=want.cmd.get("--fit") is not None,
            user_ngl=gpu_layers(want.cmd),
            floor=options.min_ctx,
            layout=layout,
            user_env=want.env,
        )
    except SafeLlamaError as err:
        if err.status != ExitStatus.NOTHING_FITS:
            raise
        settings = LlamaSettings(kv=want.request.kv, layout=layout)
        return Verdict(place.name, None, err.message.removeprefix("safe-llama: "), settings)
    return Verdict(place.name, decided, None, decided.settings)

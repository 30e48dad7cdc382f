"""safe-llama's own options (rows of cmdline.own_options, resolved by cmdline.launch_args: flags over
SAFE_LLAMA_* over config.toml) turned into the options of a plan and a launch: the ladder's steps checked
against the planner's, the declared device and host limits read, the numbers checked.

Owns that validation; the values themselves come from cmdline.launch_args."""

from __future__ import annotations

from collections.abc import Mapping

from safe_llama.cmdline import own_options
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.pipeline.prepare import DEFAULT_ATTEMPTS, LaunchOptions, PlanOptions


def _where(key: str, origins: Mapping[str, str] | None) -> str:
    """Where a setting's value was set, for an error: its option, its SAFE_LLAMA_* variable or config.toml."""
    return (origins or {}).get(key, "--" + key.replace("_", "-"))


def plan_options(
    *,
    ladder: str | None,
    min_ctx: int | None,
    profile: str | None,
    max_alloc: str | None,
    device_memory: str | None,
    integrated: bool | None,
    host_memory: str | None,
    llama_bin: str | None,
    llama_version: str | None,
    kv_split: bool | None,
    rpc_memory: str | None = None,
    origins: Mapping[str, str] | None = None,
) -> PlanOptions:
    from safe_llama.device.declared import declared_limits
    from safe_llama.plan.policy import STEPS

    steps = None
    if ladder is not None:
        steps = tuple(s.strip() for s in ladder.split(",") if s.strip())
        bad = [s for s in steps if s not in STEPS]
        if bad:
            raise SafeLlamaError(
                f"safe-llama: {_where('ladder', origins)}: unknown step '{bad[0]}' (one of {', '.join(STEPS)})",
                ExitStatus.USAGE,
            )
    if min_ctx is not None and min_ctx < 1:
        raise SafeLlamaError(f"safe-llama: {_where('min_ctx', origins)}: must be at least 1", ExitStatus.USAGE)
    declared = declared_limits(
        profile=profile,
        max_alloc=max_alloc,
        device_memory=device_memory,
        integrated=integrated,
        host_memory=host_memory,
        rpc_memory=rpc_memory,
        origins=origins,
    )
    return PlanOptions(
        ladder=steps,
        min_ctx=min_ctx,
        declared=declared,
        llama_bin=llama_bin,
        llama_version=llama_version,
        kv_split=kv_split,
    )


def launch_options(settings: Mapping[str, str], origins: Mapping[str, str] | None = None) -> LaunchOptions:
    def number(key: str) -> int | None:
        if key not in settings:
            return None
        try:
            return int(settings[key])
        except ValueError:
            raise SafeLlamaError(
                f"safe-llama: {_where(key, origins)}: '{settings[key]}' is not a whole number", ExitStatus.USAGE
            ) from None

    plan = plan_options(
        ladder=settings.get("ladder"),
        min_ctx=number("min_ctx"),
        profile=settings.get("profile"),
        max_alloc=settings.get("max_alloc"),
        device_memory=settings.get("device_memory"),
        integrated=own_options.integrated(settings),
        host_memory=settings.get("host_memory"),
        rpc_memory=settings.get("rpc_memory"),
        llama_bin=settings.get("bin_dir"),
        llama_version=settings.get("llama_version"),
        kv_split=None,
        origins=origins,
    )
    attempts = number("attempts")
    if attempts is None:
        attempts = DEFAULT_ATTEMPTS
    elif attempts < 1:
        raise SafeLlamaError(f"safe-llama: {_where('attempts', origins)}: must be at least 1", ExitStatus.USAGE)
    return LaunchOptions(
        plan=plan,
        predict=own_options.flag(settings, "predict") is not False,
        attempts=attempts,
        remember=own_options.flag(settings, "remember") is not False,
    )

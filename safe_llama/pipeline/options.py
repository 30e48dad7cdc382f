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
    named = next((option.names[0] for option in own_options.OPTIONS if option.key == key), None)
    return (origins or {}).get(key) or named or "--" + key.replace("_", "-")


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
    share: str | None = None,
    origins: Mapping[str, str] | None = None,
) -> PlanOptions:
    from safe_llama.device.declared import declared_limits
    from safe_llama.plan.policy import CTX_MOST, STEPS

    steps = None
    if ladder is not None:
        steps = tuple(s.strip() for s in ladder.split(",") if s.strip())
        bad = [s for s in steps if s not in STEPS]
        if bad or not steps:
            said = f"unknown step {_shown(bad[0])}" if bad else f"{_shown(ladder)} names no step"
            raise SafeLlamaError(
                f"safe-llama: {_where('ladder', origins)}: {said} (steps separated by commas, each one of "
                f"{', '.join(STEPS)})",
                ExitStatus.USAGE,
            )
    if min_ctx is not None and not 1 <= min_ctx <= CTX_MOST:
        raise SafeLlamaError(
            f"safe-llama: {_where('min_ctx', origins)}: {min_ctx} is not a whole number of tokens from 1 to "
            f"{CTX_MOST:,}",
            ExitStatus.USAGE,
        )
    fraction = None if share is None else share_fraction(share, _where("share", origins))
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
        llama_bin_from=_where("bin_dir", origins),
        llama_version=llama_version,
        kv_split=kv_split,
        share=fraction,
    )


LEAST_SHARE = 0.01


def share_fraction(text: str, where: str) -> float:
    """--share's value: a plain decimal above 0 and at most 1 (0.5, .33, 1)."""
    digits = text.strip()
    plain = digits.isascii() and len(digits) <= 12 and digits.replace(".", "", 1).isdigit()
    value = float(digits) if plain else -1.0
    if not LEAST_SHARE <= value <= 1:
        raise SafeLlamaError(
            f"safe-llama: {where}: {_shown(text)} is not a share from {LEAST_SHARE} to 1 (e.g. 0.5)", ExitStatus.USAGE
        )
    return value


def _shown(text: str) -> str:
    """A value as given, quoted, short and on one line, for an error (repr: no terminal escapes)."""
    shown = repr(text)
    return shown if len(shown) <= 42 else f"{shown[:39]}..."


MOST_ATTEMPTS = 100  # a start that failed for memory 100 times will not fit on the 101st


def launch_options(settings: Mapping[str, str], origins: Mapping[str, str] | None = None) -> LaunchOptions:
    from safe_llama.plan.policy import CTX_MOST

    def number(key: str, most: int, unit: str = "") -> int | None:
        """A whole number from 1 to most, written in ASCII digits only (not "1e23", "1_0", "nan", "²")."""
        text = settings.get(key)
        if text is None:
            return None
        digits = text.strip()
        if not (digits.isascii() and digits.isdigit() and len(digits) <= len(str(most)) and 1 <= int(digits) <= most):
            raise SafeLlamaError(
                f"safe-llama: {_where(key, origins)}: {_shown(text)} is not a whole number{unit} from 1 to {most:,}",
                ExitStatus.USAGE,
            )
        return int(digits)

    plan = plan_options(
        ladder=settings.get("ladder"),
        min_ctx=number("min_ctx", CTX_MOST, " of tokens"),
        profile=settings.get("profile"),
        max_alloc=settings.get("max_alloc"),
        device_memory=settings.get("device_memory"),
        integrated=own_options.integrated(settings),
        host_memory=settings.get("host_memory"),
        rpc_memory=settings.get("rpc_memory"),
        share=settings.get("share"),
        llama_bin=settings.get("bin_dir"),
        llama_version=settings.get("llama_version"),
        kv_split=None,
        origins=origins,
    )
    attempts = number("attempts", MOST_ATTEMPTS)
    return LaunchOptions(
        plan=plan,
        predict=own_options.flag(settings, "predict") is not False,
        attempts=DEFAULT_ATTEMPTS if attempts is None else attempts,
        remember=own_options.flag(settings, "remember") is not False,
        hand_off=own_options.flag(settings, "hand_off") is not False,
    )

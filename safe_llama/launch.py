"""Launch a llama.cpp tool with the plan, watch its start-up, retry smaller on an allocation failure,
remember what worked, and hand back the child's exit code.

Owns the attempt loop and what is said about it (one line per change, one per failed attempt). The
process handling is supervise.py's, the decisions the planner's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from safe_llama.binaries import find_binary
from safe_llama.commands import PlanOptions, Prepared, final_argv, prepare
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.llama_args import redact_argv
from safe_llama.say import Say
from safe_llama.sdnotify import Notifier, child_env
from safe_llama.units import human

DEFAULT_ATTEMPTS = 4
SHRINK = 0.75  # after a failure with no limit in the message, the next KV is at most this share


@dataclass(frozen=True)
class LaunchOptions:
    plan: PlanOptions = field(default_factory=PlanOptions)
    predict: bool = True  # False: the first attempt runs the command line as given
    attempts: int = DEFAULT_ATTEMPTS
    remember: bool = True


def _remember_key(prepared: Prepared, binary: Path) -> str:
    from safe_llama import remember

    request = asdict(prepared.request.kv)
    device = f"{prepared.target.backend}:{prepared.target.device or ''}"
    return remember.key(model=Path(prepared.model_path), binary=binary, device=device, request=request)


def run(tool: str, args: Sequence[str], env: Mapping[str, str], options: LaunchOptions) -> int:
    """The whole launch; returns the exit code safe-llama leaves with."""
    from safe_llama import remember, supervise
    from safe_llama.signatures import load_table

    say = Say(env)
    supervise.check_not_nested(env)
    binary = find_binary(tool, env=env, explicit=options.plan.llama_bin)
    table = load_table(Path(env["SAFE_LLAMA_SIGNATURES"]) if env.get("SAFE_LLAMA_SIGNATURES") else None)
    notifier = Notifier(env)
    base_env = child_env(env)
    plan_options = options.plan
    try:
        prepared: Prepared | None = prepare(tool, args, env, plan_options)
    except SafeLlamaError as err:
        if err.status not in (ExitStatus.USAGE,):
            raise
        say(f"not planning ({err.message.removeprefix('safe-llama: ')}); running llama.cpp as given", "warning")
        prepared = None
    digest = None
    if prepared is not None and options.remember:
        digest = _remember_key(prepared, binary)
        known = remember.recall(digest, env)
        if known is not None and known.learned_max_alloc is not None:
            plan_options = replace(plan_options, learned_max_alloc=known.learned_max_alloc)
            prepared = prepare(tool, args, env, plan_options)
        if known is not None and prepared.plan is not None and prepared.plan.kv.total_bytes > known.kv_bytes:
            # the plan would ask for more than what last started here: start from what worked
            plan_options = replace(plan_options, kv_cap=known.kv_bytes)
            prepared = prepare(tool, args, env, plan_options)
            say(f"starting from the plan that worked before ({human(known.kv_bytes)} of KV)")
    attempt = 0
    last_kv: int | None = None
    while True:
        attempt += 1
        if prepared is None or (attempt == 1 and not options.predict):
            argv = list(args) if prepared is None else final_argv(_unplanned(prepared))
            extra_env: dict[str, str] = {}
            kv_now = None if prepared is None else _unplanned_kv(prepared)
        else:
            if prepared.plan is None:
                assert prepared.error is not None
                if attempt == 1:
                    raise prepared.error
                raise SafeLlamaError(
                    f"{prepared.error.message} (after {attempt - 1} failed start(s))", ExitStatus.RETRIES_EXHAUSTED
                )
            for step in prepared.plan.steps:
                say(step.reason)
            argv = final_argv(prepared)
            extra_env = dict(prepared.plan.env_changes)
            kv_now = prepared.plan.kv.total_bytes
        if last_kv is not None and kv_now is not None and kv_now >= last_kv:
            raise SafeLlamaError(
                f"safe-llama: no smaller plan than {human(last_kv)} of KV; giving up after {attempt - 1} attempt(s)",
                ExitStatus.RETRIES_EXHAUSTED,
            )
        notifier.status(f"attempt {attempt}: {os.path.basename(binary)} " + " ".join(redact_argv(argv))[:200])
        outcome = supervise.launch(
            [str(binary), *argv],
            {**base_env, **extra_env},
            watcher=supervise.SignatureWatcher(table),
            probe=supervise.probe_for(tool, argv, {**base_env, **extra_env}),
        )
        if outcome.ready and prepared is not None and digest is not None and prepared.plan is not None:
            _store(digest, prepared, attempt, plan_options, env)
        if not outcome.retry:
            if outcome.failure is not None and not outcome.failure.memory and outcome.failure.line:
                pass  # the child's own message is already on the terminal
            return outcome.exit_code
        failure = outcome.failure
        assert failure is not None
        if prepared is None:
            say(f"start failed for lack of memory ({failure.line or failure.kind}); no plan to retry with", "error")
            return outcome.exit_code
        if attempt >= options.attempts:
            say(f"attempt {attempt} failed: {failure.line or failure.kind}; no attempts left", "error")
            return int(ExitStatus.RETRIES_EXHAUSTED)
        last_kv = kv_now
        learned = failure.limit_bytes
        cap = int((kv_now or 0) * SHRINK) if learned is None else (kv_now or 1) - 1
        plan_options = replace(
            plan_options,
            kv_cap=cap,
            learned_max_alloc=learned if learned is not None else plan_options.learned_max_alloc,
        )
        what = f"device max allocation {human(learned)} learned" if learned else f"KV at most {human(cap)}"
        say(f"attempt {attempt} failed: {failure.line or failure.kind}; retrying with {what}", "warning")
        prepared = prepare(tool, args, env, plan_options)


def _unplanned(prepared: Prepared) -> Prepared:
    return replace(prepared, plan=None)


def _unplanned_kv(prepared: Prepared) -> int:
    from safe_llama.kv import plan_kv

    return plan_kv(prepared.facts, prepared.request.kv).total_bytes


def _store(digest: str, prepared: Prepared, attempt: int, options: PlanOptions, env: Mapping[str, str]) -> None:
    from safe_llama import remember

    assert prepared.plan is not None
    record = remember.Remembered(
        argv_changes={k: v for k, v in prepared.plan.argv_changes.items()},
        env_changes=dict(prepared.plan.env_changes),
        kv_bytes=prepared.plan.kv.total_bytes,
        learned_max_alloc=options.learned_max_alloc,
        attempts=attempt,
    )
    try:
        remember.store(digest, record, env)
    except OSError as err:
        Say(env)(f"could not remember the plan: {err.strerror}", "warning")

"""Writing launch records (early.py reads them): the record of what a launch read while it planned (the
window, record_window.py, watches it as it happens), stored once that launch is ready.

While a launch resolves its options, finds the binary and plans (the window, up to attempt 1's spawn), an
audit hook notes every file opened and directory listed, the environment is a mapping that notes every
variable read and prefix scanned (planning takes the environment only as an argument: every read is seen),
and stderr notes any line that is not one of the plan's reasons.
The record then holds the identity of all of it (early.py), plus the files only stat()ed on the way
(the binary, the config file, PATH's folders, the bundled model's places, every argument naming a file)
and safe-llama's own files. No record when the window saw something it cannot hold: the whole
environment read, a stray line on stderr, a remembered plan that capped this one, a secret in what
would be stored, RPC workers (their devices come from the network, listed on every launch).

The host budget is the one input that changes on every launch (MemAvailable, a cgroup's headroom). Sound rule: a
record is stored only when the host's limits are RAM and a cgroup's headroom (no RLIMIT_AS) or a declared
budget, and when planning under no limit gives the same plan: the planner takes the first of its candidate
settings, in a fixed order, whose allocations fit, and a larger budget never makes an allocation stop fitting,
so every earlier candidate fits under no budget at all and this plan is chosen under every budget where its own
allocations fit. The least such budget of each limit is found by planning again (a binary search on the same
function), and the record is valid while MemAvailable and the cgroup's headroom are at least those (and MemTotal
as it was). A plan sized by the budget (a context cut to fit) differs under an unlimited one and is never
recorded. A GPU's free memory moves the same way, and a plan is often cut to fit it: its record holds while a
vendor reading of that GPU stays within the plan's margin of the figure planned with (device_rule).

Secrets: the argv is stored as positions in the user's own words plus the plan's literals; a literal,
an environment change or a line holding a secret option's value stops the record. Environment values
are stored as digests salted per record; the variables configs/secrets.toml names only as set or not.
The record's file name hashes the words with the secret options' values masked (early.key).

Owns the record's contents; the window is record_window.py's, the reading side and the identities early.py's.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from safe_llama import state
from safe_llama.constants import TOOLS, cache_root
from safe_llama.device import ledger
from safe_llama.paths import cache_dir
from safe_llama.remembered import early
from safe_llama.remembered.record_window import Recorder, pseudo

if TYPE_CHECKING:
    from safe_llama.pipeline.prepare import PlanOptions, Prepared


class _Unstable(Exception):
    """A file the plan read changed before the record was written."""


def _own_files(env: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """safe-llama's own (files, folders): the package, its configs and those in use; a change is a new planner.
    The folders are held by their listing (early.content), not their identity: a __pycache__ made by a module's
    first import changes a folder's mtime, not what it holds."""
    from safe_llama.paths import configs_dir, packaged_configs

    out: list[str] = []
    folders: list[str] = []
    tops = dict.fromkeys([str(Path(__file__).resolve().parent.parent), str(packaged_configs()), str(configs_dir(env))])
    for top in tops:
        for folder, dirs, files in os.walk(top):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            folders.append(folder)
            out.extend(os.path.join(folder, f) for f in sorted(files) if not f.endswith(".pyc"))
    return out, folders


def _stat_inputs(binary: Path, user_args: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """Inputs the planner only stat()s (no audit event): where a binary or a model could be found."""
    from safe_llama.paths import bundled_model_dirs, config_dir, pinned_bin_dirs

    out = [str(binary), str(config_dir(env) / "config.toml")]
    out += [os.path.abspath(d) for d in env.get("PATH", "").split(os.pathsep) if d]
    for _, folder in pinned_bin_dirs("cpu", env):
        out += [str(folder), str(folder.parent / ".complete")]
    out += [str(folder) for folder in bundled_model_dirs(env)]
    for word in user_args:
        for part in (word, word.partition("=")[2]):
            if part and os.path.lexists(part):
                out.append(os.path.abspath(part))
    return out


_PROCESS_FILE = re.compile(r"/proc/[0-9]+(/|$)")  # one process's files: a launch's own pid differs every start


def _validity(recorder: Recorder, stat_only: Sequence[str], salt: bytes) -> tuple[list[Any], list[Any]]:
    """(files by identity, /proc, /sys, /dev files and listed folders by content)."""
    files: dict[str, Any] = {}
    contents: dict[str, Any] = {}
    # a file that changed between the plan and now (but the remembered plan, stored at readiness just before)
    # may not have been read as the record would say
    remembered = os.path.join(cache_root(recorder.raw), "plans")
    ledgers = tuple(str(folder) for folder in ledger.folders(recorder.raw))
    for path, ident in recorder.at_close.items():
        if early.identity(path) != ident and not path.startswith((remembered + os.sep, *ledgers)):
            raise _Unstable(path)
    for event, path in recorder.opened:
        if path.endswith((".py", ".pyc")):
            continue  # modules: safe-llama's own are in _own_files, the interpreter is in the key
        if path.startswith(ledgers) or _PROCESS_FILE.match(path):
            continue  # the other launches (their entries, their processes): early.other_launches holds them
        if event != "open" or pseudo(path):
            if path in early.VOLATILE or os.path.basename(path) in early.VOLATILE:
                continue  # the host rule checks what these feed
            contents[path] = early.content(path, salt)
        else:
            files[path] = early.identity(path)
    own_files, own_folders = _own_files(recorder.raw)
    for path in [*stat_only, *own_files]:
        files.setdefault(path, early.identity(path))
    for path in own_folders:
        contents.setdefault(path, early.content(path, salt))
    return sorted(files.items()), sorted(contents.items())


def _secret_values(tool: str, user_args: Sequence[str], keep_in: Path) -> list[str]:
    """The values of the secret options in the user's words (`--api-key K`, `--api-key=K`)."""
    from safe_llama.cmdline.llama_args import REDACTED, redact_argv

    out: list[str] = []
    for word, shown in zip(user_args, redact_argv(user_args, tool, keep_in), strict=True):
        if word != shown:
            secret = word.partition("=")[2] if shown.endswith(f"={REDACTED}") else word
            out += [secret] if secret else []
    return out


def _secret_names(names: set[str], keep_in: Path) -> set[str]:
    """The variables configs/secrets.toml names (an API key, a token): a plan reads whether they are set, never
    their value (it is the server's, or the download's), so the record holds only that. A name that only
    contains one of its fragments (LLAMA_ARG_IMAGE_MAX_TOKENS) may be a planner input: held by digest."""
    from safe_llama.cmdline.llama_args import secrets

    return names & secrets(keep_in=keep_in).env


UNLIMITED = 1 << 62


def _same_plan(a: Prepared, b: Prepared) -> bool:
    """The same launch (argv, environment) by the same steps; their reasons may quote the budget (a cgroup's
    leftover) and are said again as recorded."""
    from safe_llama.pipeline.prepare import final_argv

    if a.plan is None or b.plan is None:
        return False
    return (
        final_argv(a) == final_argv(b)
        and dict(a.plan.env_changes) == dict(b.plan.env_changes)
        and [s.name for s in a.plan.steps] == [s.name for s in b.plan.steps]
    )


def _under(prepared: Prepared, kind: str | None, value: int) -> Prepared:
    """prepared with its host limit of this kind at value and every other unlimited (kind None: all of them)."""
    from safe_llama.device.host_budget import HostLimit

    limits = tuple(
        HostLimit(limit.kind, replace(limit.budget, value=value if limit.kind == kind else UNLIMITED))
        for limit in prepared.target.limits_on_host
    )
    budget = replace(prepared.target.host_budget, value=min(limit.budget.value for limit in limits))
    return replace(prepared, target=replace(prepared.target, host_budget=budget, host_limits=limits))


def least_budgets(prepared: Prepared, options: PlanOptions, env: Mapping[str, str]) -> dict[str, int] | None:
    """For each host limit (RAM, a cgroup's headroom), the least budget under which planning gives this same
    plan, when planning under no limit gives it too (the plan was not sized by a budget); None otherwise.
    Under that condition the plan is chosen exactly where its own allocations fit (see the module's
    docstring), and each limit is checked by allocations of its own kind, so each threshold is searched with
    the others unlimited: RAM's by memory.allocations alone; a cgroup's by planning again, as its leftover
    also sizes llama-server's prompt cache and checkpoints (plan/serving.py), which are the same once it
    leaves room for llama.cpp's defaults."""
    from safe_llama.paths import cache_dir, config_dir, configs_dir
    from safe_llama.pipeline.prepare import replan
    from safe_llama.plan.memory import allocations
    from safe_llama.plan.policy import load_policy

    limits = prepared.target.limits_on_host
    kinds = [limit.kind for limit in limits]
    if prepared.plan is None or not set(kinds) <= {"ram", "cgroup"} or len(set(kinds)) != len(kinds):
        return None
    if not _same_plan(replan(_under(prepared, None, 0), options, prepared.target.lessons, env), prepared):
        return None
    policy = load_policy(configs_dir(env) / "planner.toml", config_dir(env) / "config.toml", keep_in=cache_dir(env))
    settings = prepared.plan.settings

    def fits(kind: str, budget: int) -> bool:
        under = _under(prepared, kind, budget)
        if kind == "cgroup":
            return _same_plan(replan(under, options, prepared.target.lessons, env), prepared)
        return all(a.fits for a in allocations(prepared.facts, settings, under.target, policy))

    out = {}
    for limit in limits:
        low, high = 0, limit.budget.value  # nothing fits in no memory; the plan fits in this budget
        if fits(limit.kind, low) or not fits(limit.kind, high):
            return None
        while high - low > 1:
            middle = (low + high) // 2
            if fits(limit.kind, middle):
                high = middle
            else:
                low = middle
        out[limit.kind] = high
    return out


def device_rule(prepared: Prepared, env: Mapping[str, str]) -> tuple[str, str, int, int] | None:
    """A GPU plan's rule: (the vendor reading's source, the GPU's key, its free bytes the plan was made with,
    the plan's margin in bytes); None when the free figure is no vendor reading (llama.cpp's own listing: only
    a run of llama.cpp reads it again). The early start reads the same GPU again and uses the record while
    what is free is within the margin of what it was. Sound: the plan kept that margin of the device free
    beyond every allocation it counted, so with up to the margin less free its allocations still fit (the
    slack the policy keeps for what the estimate does not see is what is spent), and with up to the margin
    more free a plan cut to fit would have been at most a margin's worth larger. A start that still fails for
    memory drops the record, and the next launch plans (launch.adopted)."""
    from safe_llama.paths import cache_dir, config_dir, configs_dir
    from safe_llama.plan.policy import load_policy

    reading = prepared.device.free_reading if prepared.device is not None else None
    free, budget = prepared.target.device_free, prepared.target.device_budget
    if reading is None or free is None or budget is None or prepared.target.device_free_listed:
        return None
    key = reading.uuid if reading.source == "nvml" else reading.pci_bdf
    if not key:
        return None
    policy = load_policy(configs_dir(env) / "planner.toml", config_dir(env) / "config.toml", keep_in=cache_dir(env))
    fraction = policy.per_backend(policy.memory_margin_fraction, prepared.target.backend)
    return (reading.source, key, free.value, int(budget.value * fraction))


def build(
    recorder: Recorder,
    *,
    tool: str,
    user_args: Sequence[str],
    door_args: Sequence[str],
    argv: Sequence[str],
    prepared: Prepared,
    options: PlanOptions,
    status: str,
) -> dict[str, Any] | None:
    """The record of a launch whose attempt 1 is ready; None when it cannot be held (see the docstring)."""
    from safe_llama.device.probe_host import oom_counter_sources
    from safe_llama.pipeline.prepare import booking

    if recorder.everything or recorder.stray or prepared.plan is None or prepared.binary is None:
        return None
    if prepared.target.remote:  # RPC workers: their devices, memory and presence come from the network
        return None
    device = None
    if prepared.target.device_free is not None:  # a GPU's free memory moves with every other program's use
        device = device_rule(prepared, recorder.raw)
        if device is None:
            return None
    env = recorder.raw
    extra = dict(prepared.plan.env_changes)
    template: list[int | str] = []
    for word in argv:
        template.append(door_args.index(word) if word in door_args else word)
    secrets = _secret_values(tool, user_args, cache_dir(env))
    stored = [w for w in template if isinstance(w, str)] + [*extra.keys(), *extra.values()]
    stored += [line for line, _ in recorder.said] + [status]
    if any(secret in text for secret in secrets for text in stored):
        return None
    limits = prepared.target.limits_on_host
    host: tuple[int, int] | None = None
    cgroup: int | None = None
    if not (len(limits) == 1 and limits[0].budget.source == "declared"):
        least = least_budgets(prepared, options, env)
        memory = early.meminfo()
        if least is None or "ram" not in least or memory is None or not early.address_space_unlimited():
            return None
        host, cgroup = (memory[0], least["ram"]), least.get("cgroup")
    hidden = _secret_names(recorder.names, cache_dir(env))
    salt = os.urandom(16)
    try:
        files, contents = _validity(recorder, _stat_inputs(prepared.binary, user_args, env), salt)
    except _Unstable:
        return None
    return {
        "format": early.FORMAT,
        "tool": tool,
        "salt": salt,
        "binary": str(prepared.binary),
        "argv": template,
        "extra_env": extra,
        "lines": list(recorder.said),
        "status": status,
        "files": files,
        "contents": contents,
        "env": sorted((name, early.env_digest(env.get(name), salt)) for name in recorder.names if name not in hidden),
        "env_present": sorted((name, name in env) for name in recorder.names if name in hidden),
        "env_prefixes": sorted((p, early.prefixed_digest(env, p, salt)) for p in recorder.prefix_scans),
        "host": host,
        "cgroup": cgroup,
        "counters": oom_counter_sources(),
        "device": device,
        "others": early.other_launches(env),
        "book": booking(prepared),  # its ledger entry: an early start writes it (launch.adopted)
    }


def store(record: Mapping[str, Any], door: str, door_args: Sequence[str], env: Mapping[str, str]) -> None:
    """Write the record (0600 in a 0700 folder, atomically); an unwritable cache only means no early start."""
    import marshal

    hidden = secret_options(cache_dir(env))
    path = Path(early.record_path(env, early.key(door, door_args, os.getcwd(), hidden)))
    try:
        if early.secret_options(env) != hidden:
            state.write_bytes(Path(early.secret_options_path(env)), marshal.dumps({"options": sorted(hidden)}))
        state.write_bytes(path, marshal.dumps(dict(record)))
    except (OSError, ValueError):
        return


def secret_options(keep_in: Path | None = None) -> frozenset[str]:
    """Every spelling of a secret option, for any tool (the record's name masks their values: early.key)."""
    from safe_llama.cmdline.llama_args import secrets

    return frozenset().union(*(secrets(tool, keep_in=keep_in).options for tool in TOOLS))


def drop(path: str) -> None:
    """Forget a record whose start failed for memory: the next launch plans."""
    try:
        os.unlink(path)
    except OSError:
        return

"""The import graph of a plan and of a launch, measured (`python -X importtime`, every module the process
imported) and held: `plan --json` and a launch, each the second with its cache (as a user's every run after
the first), import none of the modules their paths go without (the NVML/Vulkan bindings where no probe runs,
tomllib once the configs' parses are kept, shutil, subprocess...), and `plan --json` no safe-llama module
beyond the ones listed here: a module that joins the plan's path is a decision this test makes visible.

Measured on the real pinned llama-completion and the bundled model (the launch runs to its end: one token).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import ROOT

# modules that neither path needs once its caches are warm; what each would cost is the reason it is held here
NEITHER = {
    "tomllib",  # configs are read from their kept parse (state.load_toml), secrets.toml too
    "shutil",  # it imports bz2 and lzma; finding a binary on PATH needs os alone
    "bz2",
    "lzma",
    "subprocess",  # probes are cached: no helper runs
    "tempfile",
    "random",
    "datetime",
    "string",
    "typer",
    "click",
    "psutil",
    "gguf",
    "numpy",
    "http",
    "http.client",
    "email",
    "logging",
    "argparse",
    "asyncio",
}
# and these a plan goes without, which the supervisor needs (signals, sockets, the terminal), hashlib (OpenSSL, 2-3
# ms: a plan's caches are named by state.cache_name) and threading (the gguf package's constants, on a cache miss)
PLAN_ALSO = {"ctypes", "select", "selectors", "signal", "socket", "termios", "hashlib", "threading"}
# the safe-llama modules `plan --json server -m MODEL` imports (its second run): not the header's reader and the
# architectures' rules (model.header_facts, on a facts cache miss), the probes' subprocess door (device.proc, when a
# probe runs), nor Vulkan's probe and limits (where a Vulkan device is listed or asked for), nor messages (the
# templates, imported where an error is said)
PLAN_MODULES = {
    *("attempts", "attempts.exits", "commands", "commands.plan", "constants", "entry", "errors"),
    *("paths", "state", "trust", "units", "pipeline", "pipeline.options", "pipeline.prepare"),
    *("backends", "backends.backend", "backends.registry"),
    *(f"backends.{name}" for name in ("blas", "cann", "cpu", "cuda", "hip", "metal", "musa", "opencl")),
    *(f"backends.{name}" for name in ("openvino", "rpc", "sycl", "vulkan", "webgpu")),
    *("cmdline", "cmdline.env_scan", "cmdline.launch_args", "cmdline.llama_args", "cmdline.memory_flags"),
    *("cmdline.model_source", "cmdline.own_options", "cmdline.request"),
    *("device", "device.binaries", "device.declared", "device.drivers", "device.free_memory"),
    *("device.host_budget", "device.limits", "device.llama_listing", "device.matching", "device.oom_counters"),
    *("device.probe_free", "device.probe_host", "device.probe_opencl", "device.probe_sysfs"),
    *("device.probing", "device.profiles", "device.self_check", "device.target_device", "device.vendor_free"),
    *("device.ledger", "device.reservations"),  # the plan lists other launches and plans beside them
    *("cmdline.bundled_chat", "model.bundled"),  # the bundled model, however named: its chat options (shlex too)
    *("model", "model.cache_types", "model.facts", "model.facts_cache", "model.kv"),
    *("plan", "plan.allocation_words", "plan.compute", "plan.lessons", "plan.memory", "plan.planner", "plan.policy"),
    *("plan.render", "plan.serving", "plan.split", "plan.steps", "plan.tally", "plan.target", "plan.weights_off"),
}


def test_the_plan_s_dataclasses_have_docstrings() -> None:
    """Python 3.11's dataclass gives a class without a docstring one made by inspect.signature, at import: about
    40 us a class, on every plan (1.1 ms over the 26 that had none). Read from the source, not run."""
    import ast

    missing = []
    for module in sorted(PLAN_MODULES):
        path = ROOT / "safe_llama" / Path(*module.split("."))
        source = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.ClassDef) and not ast.get_docstring(node):
                named = [d.func if isinstance(d, ast.Call) else d for d in node.decorator_list]
                if any(isinstance(d, ast.Name) and d.id == "dataclass" for d in named):
                    missing.append(f"{module}.{node.name}")
    assert not missing


def _imported(args: list[str], env: dict[str, str]) -> set[str]:
    """Every module the process `python -X importtime -m safe_llama ARGS` imported (its second run: the first
    fills the caches)."""
    command = [sys.executable, "-X", "importtime", "-m", "safe_llama", *args]
    for _ in range(2):
        done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("import time:")]
    return {line.rpartition("|")[2].strip() for line in lines[1:]}  # the first is the header


@pytest.fixture
def env(tmp_path: Path, llama_bin: Path, clean_env: dict[str, str]) -> dict[str, str]:
    env = {**clean_env, "XDG_CACHE_HOME": str(tmp_path / "cache"), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return {**env, "SAFE_LLAMA_BIN_DIR": str(llama_bin), "PYTHONPATH": str(ROOT)}


def test_plan_imports_only_what_it_uses(env: dict[str, str], bundled_model: Path) -> None:
    modules = _imported(["plan", "--json", "server", "-m", str(bundled_model)], env)
    assert "safe_llama.pipeline.prepare" in modules  # measured: the plan ran
    assert not modules & (NEITHER | PLAN_ALSO)
    ours = {m.removeprefix("safe_llama.") for m in modules if m.startswith("safe_llama.")}
    assert ours <= PLAN_MODULES, sorted(ours - PLAN_MODULES)


@pytest.mark.slow
def test_a_launch_imports_only_what_it_uses(env: dict[str, str], bundled_model: Path) -> None:
    """A launch that plans (--no-remember: no launch record), then supervises llama-completion to its end."""
    args = ["--no-remember", "completion", "-m", str(bundled_model), "-c", "512", "-n", "1", "-p", "hi", "-no-cnv"]
    modules = _imported(args, {**env, "PATH": os.defpath})
    assert "safe_llama.process.supervise" in modules  # measured: the supervisor ran
    assert not modules & NEITHER
    assert not any(m.startswith("safe_llama.commands") for m in modules)  # no command's module in a launch


@pytest.mark.slow
def test_the_supervisor_of_an_early_start_imports_no_planner(env: dict[str, str], bundled_model: Path) -> None:
    """The second launch starts from the first's launch record: the supervisor that adopts it reads failures
    (diagnosis/signatures.py, which names plan/lessons.py's fields) but imports neither the planner nor the
    device probes, whose modules would stay in its memory while llama.cpp runs."""
    args = ["completion", "-m", str(bundled_model), "-c", "512", "-n", "1", "-p", "hi", "-no-cnv"]
    modules = _imported(args, {**env, "PATH": os.defpath})
    assert {"safe_llama.remembered.early", "safe_llama.process.supervise"} <= modules
    assert "safe_llama.pipeline.prepare" not in modules  # the early start: no plan
    assert not modules & NEITHER
    heavy = ("safe_llama.plan.target", "safe_llama.plan.planner", "safe_llama.device.target_device", "safe_llama.model")
    assert not any(m.startswith(heavy) for m in modules), sorted(m for m in modules if m.startswith(heavy))

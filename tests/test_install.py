"""Installed the way users install it: a wheel and an sdist in a fresh virtual environment (configs are
package data), and the systemd unit's ExecStart run as an unprivileged user with the unit's environment."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from safe_llama.paths import packaged_configs
from tests.llama_run import free_port, healthy

ROOT = Path(__file__).resolve().parent.parent
UNIT = packaged_configs() / "systemd" / "safe-llama-server.service"
NOBODY = 65534
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, **kw)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{argv}: {done.stderr[-3000:]}"
    return done  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with safe-llama installed from the wheel that `python -m build` made from the sdist."""
    base = tmp_path_factory.mktemp("install")
    venv = base / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    _run([*pip, "build"])
    src = base / "src"  # a copy without build outputs, as a fresh clone has it
    skip = shutil.ignore_patterns(".venv", ".git", "*.egg-info", "build", "dist", "__pycache__")
    shutil.copytree(ROOT, src, ignore=skip)
    _run([str(venv / "bin" / "python"), "-m", "build", "--outdir", str(base / "dist"), str(src)], timeout=600)
    wheel = next((base / "dist").glob("safe_llama-*.whl"))
    assert next((base / "dist").glob("safe_llama-*.tar.gz"))
    names = zipfile.ZipFile(wheel).namelist()
    for data in (
        "llama-args.json",
        "planner.toml",
        "signatures.toml",
        "secrets.toml",
        "systemd/safe-llama-server.service",
        "systemd/safe-llama-rpc-server.service",
    ):
        assert f"safe_llama/configs/{data}" in names
    _run([*pip, str(wheel)], timeout=600)
    return venv


@pytest.mark.slow
def test_wheel_plans_and_launches_from_its_own_configs(
    installed: Path, tmp_path: Path, bundled_model: Path, llama_bin: Path
) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "XDG_CONFIG_HOME": str(tmp_path / "config"), "SAFE_LLAMA_BIN_DIR": str(llama_bin)}  # fmt: skip
    code = "import os; from safe_llama.paths import configs_dir as c; print(c(os.environ))"
    where = _run([str(installed / "bin" / "python"), "-c", code], env=env, cwd=tmp_path).stdout.strip()
    assert where.startswith(str(installed)) and where.endswith("safe_llama/configs")
    plan = _run([str(installed / "bin" / "safe-llama"), "plan", "--json", "server", "-m", str(bundled_model),
                 "-c", "4096"], env=env, cwd=tmp_path, timeout=120)  # fmt: skip
    data = json.loads(plan.stdout)
    assert data["model"]["path"] == str(bundled_model)
    assert data["kv"]["total_bytes"] > 0
    run = _run([str(installed / "bin" / "safe-llama-completion"), "-m", str(bundled_model), "-c", "4096",
                "-p", "The capital of France is", "-n", "4", "-no-cnv"], env=env, cwd=tmp_path, timeout=120,
               stdin=subprocess.DEVNULL)  # fmt: skip
    assert run.stdout.startswith("The capital of France is")


def _unit() -> tuple[list[str], dict[str, str], dict[str, str]]:
    """ExecStart, Environment= and the other [Service] settings of the packaged unit."""
    exec_start: list[str] = []
    environment: dict[str, str] = {}
    settings: dict[str, str] = {}
    for line in UNIT.read_text().splitlines():
        if line.startswith("ExecStart="):
            exec_start = line.removeprefix("ExecStart=").split()
        elif line.startswith("Environment="):
            key, value = line.removeprefix("Environment=").split("=", 1)
            environment[key] = value
        elif "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            settings[key] = value
    return exec_start, environment, settings


@pytest.fixture
def service_dirs() -> Iterator[Path]:
    """What systemd makes for the unit (CacheDirectory=, StateDirectory=), owned by the service's user, in a
    folder that user can reach (pytest's own tmp folders are root's, 0700)."""
    base = Path(tempfile.mkdtemp(prefix="safe-llama-unit-"))
    os.chmod(base, 0o755)  # noqa: S103 (the service's user must reach its folders)
    for sub in ("cache/safe-llama", "state", "notify"):
        (base / sub).mkdir(parents=True)
        os.chown(base / sub, NOBODY, NOBODY)
        os.chmod(base / sub, 0o700)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow
def test_unit_exec_start_runs_as_an_unprivileged_user_and_becomes_ready(service_dirs: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to run the unit's command as another user")
    exec_start, environment, settings = _unit()
    if not Path(exec_start[0]).is_file():
        pytest.fail(f"{exec_start[0]} is missing: the README's install (bash scripts/setup.sh as root) makes it")
    assert settings["DynamicUser"] == "yes" and settings["ProtectHome"] == "yes"
    assert settings["Documentation"].startswith("file://") and Path(settings["Documentation"][7:]).is_file()
    # DynamicUser=: systemd makes /var/cache/safe-llama a link to /var/cache/private/safe-llama, which safe-llama's
    # cache refuses (found under a real systemd, tests/attempts/test_systemd_guest.py): the real folder is named
    assert (environment["XDG_CACHE_HOME"], settings["CacheDirectory"]) == ("/var/cache/private", "safe-llama")
    assert environment["HOME"] == "/var/lib/safe-llama"
    port = free_port()
    argv = [a if a != "8080" else str(port) for a in exec_start]
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify_path = service_dirs / "notify" / "sock"
    notify.bind(str(notify_path))
    os.chown(notify_path, NOBODY, NOBODY)
    notify.settimeout(0.2)
    env = {
        "PATH": SYSTEMD_PATH,
        "LANG": "C.UTF-8",
        **environment,
        "XDG_CACHE_HOME": str(service_dirs / "cache"),  # systemd's /var/cache with CacheDirectory=safe-llama
        "HOME": str(service_dirs / "state"),  # StateDirectory=safe-llama
        "NOTIFY_SOCKET": str(notify_path),
    }
    as_nobody = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--no-new-privs", "--"]
    # the sandbox that matters here: the service's user cannot read /root (where the checkout may live)
    assert subprocess.run([*as_nobody, "ls", "/root"], env=env, capture_output=True, check=False).returncode != 0
    proc = subprocess.Popen([*as_nobody, *argv], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    messages: list[str] = []
    ready = False
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None and not ready:
            with contextlib.suppress(TimeoutError):
                messages.append(notify.recv(4096).decode())
            ready = any("READY=1" in m for m in messages) and healthy(port)
        assert ready, f"not ready: {messages} {proc.poll()}"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        notify.close()
    assert proc.returncode == 0, err[-3000:]
    assert err.startswith("safe-llama: "), err[:500]
    assert "/opt/safe-llama/models/gemma-3-270m-q4_k_m.gguf" in err  # the bundled model, readable by the service
    owner = {p.stat().st_uid for p in (service_dirs / "cache" / "safe-llama").rglob("*")}
    assert owner <= {NOBODY}

"""The packaged unit file, journald priority prefixes, the shell aliases."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from safe_llama.attempts.say import Say
from safe_llama.paths import packaged_configs

UNIT = packaged_configs() / "systemd" / "safe-llama-server.service"


def _unit_with(exec_path: str, tmp_path: Path) -> Path:
    out = tmp_path / "safe-llama-server.service"
    out.write_text(UNIT.read_text().replace("/usr/local/bin/safe-llama-server", exec_path))
    return out


def test_unit_passes_systemd_analyze_verify() -> None:
    """The unit exactly as shipped: its ExecStart= must exist, which the README's install (setup.sh as root) makes."""
    if not Path("/usr/local/bin/safe-llama-server").exists():
        pytest.fail("/usr/local/bin/safe-llama-server is missing: run bash scripts/setup.sh as root")
    done = subprocess.run(["systemd-analyze", "verify", str(UNIT)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == ""


def test_the_unit_and_the_readme_say_when_ready_is_sent() -> None:
    """READY=1 follows process.readiness.HealthProbe: /slots answering 200, not /health (issue 38: the unit's
    comment said /health, the README /slots)."""
    from safe_llama.process.readiness import HealthProbe

    assert "/slots" in (HealthProbe.__doc__ or "")
    ready = next(line for line in UNIT.read_text().splitlines() if "READY=1" in line)
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert "/slots answers 200" in ready and "READY once the server serves (its task loop answers `/slots`" in readme


def test_unit_verify_catches_a_broken_unit(tmp_path: Path) -> None:
    bad = _unit_with("/bin/true", tmp_path)
    bad.write_text(bad.read_text().replace("Type=notify", "Type=bogus"))
    done = subprocess.run(["systemd-analyze", "verify", str(bad)], capture_output=True, text=True, check=False)
    assert "Failed to parse service type" in done.stderr


def test_unit_settings() -> None:
    text = UNIT.read_text()
    for line in ("Type=notify", "KillMode=mixed", "Restart=on-failure", "NoNewPrivileges=yes",
                 "ProtectSystem=strict", "PrivateTmp=yes", "EnvironmentFile=-/etc/safe-llama/server.env"):  # fmt: skip
        assert line in text.splitlines()
    prevent = next(x for x in text.splitlines() if x.startswith("RestartPreventExitStatus="))
    assert set(prevent.split("=")[1].split()) >= {"65", "66", "67", "126", "127"}
    assert "--api-key" not in text.replace("never --api-key", "")


def test_journal_priority_prefixes() -> None:
    with tempfile.TemporaryFile("w+") as stream:
        st = os.fstat(stream.fileno())
        say = Say({"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}, stream)
        say("planned", "info")
        say("retrying", "warning")
        say("gave up", "error")
        stream.seek(0)
        assert stream.read().splitlines() == [
            "<6>safe-llama: planned", "<4>safe-llama: retrying", "<3>safe-llama: gave up",
        ]  # fmt: skip


def test_no_prefix_when_stderr_is_not_the_journal() -> None:
    stream = io.StringIO()
    Say({"JOURNAL_STREAM": "1:2"}, stream)("planned")
    assert stream.getvalue() == "safe-llama: planned\n"


def test_json_log_format() -> None:
    import json

    stream = io.StringIO()
    Say({"SAFE_LLAMA_LOG_FORMAT": "json"}, stream)("planned", "warning", attempt=2)
    record = json.loads(stream.getvalue())
    assert (record["level"], record["msg"], record["attempt"]) == ("warning", "planned", 2)


@pytest.mark.slow
def test_shell_aliases_and_completion() -> None:
    script = packaged_configs() / "shell" / "safe-llama.sh"
    # the safe-llama of this interpreter's environment, not whatever else PATH holds
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    done = subprocess.run(
        ["bash", "-c", f". {script}; alias llama-server; complete -p safe-llama"],
        capture_output=True, text=True, check=False, env={**os.environ, "PATH": path},
    )  # fmt: skip
    assert "alias llama-server='safe-llama-server'" in done.stdout
    assert "_safe_llama_completion" in done.stdout


def test_rpc_worker_unit_passes_systemd_analyze_verify() -> None:
    unit = packaged_configs() / "systemd" / "safe-llama-rpc-server.service"
    if not Path("/usr/local/bin/safe-llama").exists():
        pytest.fail("/usr/local/bin/safe-llama is missing: run bash scripts/setup.sh as root")
    done = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == ""
    text = unit.read_text()
    for line in ("Type=notify", "KillMode=mixed", "ExecStart=/usr/local/bin/safe-llama rpc-server -H 127.0.0.1"):
        assert line in text

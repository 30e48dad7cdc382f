"""The shipped units as systemd scores them (`systemd-analyze security --offline=true`, issue 33): both at an
exposure of 3.5 or less, while the devices a GPU needs stay reachable (/dev/dri, /dev/kfd, /dev/nvidia*) and
nothing that breaks llama.cpp is set (PrivateDevices= hides the GPUs; MemoryDenyWriteExecute= stops the JIT of
Mesa's llvmpipe and OpenVINO's CPU plugin). The guest test (tests/attempts/test_systemd_guest.py) runs the hardened
server unit under a real systemd and serves a request."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from safe_llama.paths import packaged_configs

UNITS = ["safe-llama-server.service", "safe-llama-rpc-server.service", "safe-llama-server@.service"]
GPU_DEVICES = ["DeviceAllow=char-drm rw", "DeviceAllow=/dev/kfd rw", "DeviceAllow=char-nvidia-frontend rw",
               "DeviceAllow=char-nvidia-uvm rw"]  # fmt: skip


def exposure(unit: Path, tmp_path: Path) -> float:
    # offline mode reads the file as given, not an installed one; a template as one of its instances
    copy = tmp_path / unit.name.replace("@.", "@chat.")
    shutil.copy2(unit, copy)
    done = subprocess.run(["systemd-analyze", "security", "--offline=true", "--no-pager", str(copy)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    found = re.search(r"Overall exposure level for \S+: ([\d.]+)", done.stdout)
    assert found, done.stdout[-2000:] + done.stderr[-2000:]
    return float(found.group(1))


@pytest.mark.parametrize("name", UNITS)
def test_the_unit_is_hardened(name: str, tmp_path: Path) -> None:
    unit = packaged_configs() / "systemd" / name
    assert exposure(unit, tmp_path) <= 3.5
    lines = unit.read_text().splitlines()
    for line in GPU_DEVICES:
        assert line in lines
    assert not any(line.startswith(("PrivateDevices=yes", "MemoryDenyWriteExecute=yes")) for line in lines)


def test_the_template_shares_the_ledger_and_one_slice() -> None:
    """Instances of the template read each other's ledger entries: one dynamic user, one runtime directory kept
    while any runs, one slice whose limit they share; each its own settings file (model, port, share)."""
    lines = (packaged_configs() / "systemd" / "safe-llama-server@.service").read_text().splitlines()
    for line in (
        "DynamicUser=yes",
        "User=safe-llama",
        "RuntimeDirectory=safe-llama",
        "RuntimeDirectoryMode=0700",
        "RuntimeDirectoryPreserve=yes",
        "Slice=safe-llama.slice",
        "EnvironmentFile=/etc/safe-llama/%i.env",
    ):
        assert line in lines, line  # fmt: skip
    assert not any(line.startswith("ExecStart=") and "--port" in line for line in lines)  # the instance's port


def test_the_score_tells_a_bare_unit_apart(tmp_path: Path) -> None:
    """The same unit with its hardening taken out scores as exposed: the check above can fail."""
    unit = packaged_configs() / "systemd" / "safe-llama-server.service"
    text = unit.read_text()
    hardening = ("Protect", "Restrict", "SystemCall", "Capability", "Private")
    bare = "\n".join(line for line in text.splitlines() if not line.startswith(hardening))
    copy = tmp_path / "bare" / unit.name
    copy.parent.mkdir()
    copy.write_text(bare + "\n")
    assert exposure(copy, tmp_path) > 5.0

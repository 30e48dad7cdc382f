"""Secrets masked in every output (issue 33's row): `safe-llama explain --json LOG -m M --api-key SEKRIT -hft hf_X`
printed both in clear (`run.args`). A secret planted in every way it can be given (each spelling of each option
configs/secrets.toml names, `--opt=value`, the variables) is looked for in every output and stored file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
LOG = ROOT / "tests" / "fixtures" / "logs" / "server-kv-oom.log"

# One distinct secret per way of giving it, so a leak names its way.
ARGV = [
    "--api-key", "SEKRITargv1",
    "--api-key=SEKRITeq2",
    "--api_key=SEKRITunderscore3",
    "-hft", "hf_SEKRITshort4",
    "--hf-token=hf_SEKRITeq5",
    "--ssl-key-file", "/keys/SEKRITssl6.pem",
]  # fmt: skip
ENV = {
    "LLAMA_API_KEY": "SEKRITenv7",
    "HF_TOKEN": "hf_SEKRITenv8",
    "LLAMA_ARG_HF_TOKEN": "hf_SEKRITenv9",
    "HUGGING_FACE_HUB_TOKEN": "hf_SEKRITenv10",
    "LLAMA_ARG_API_KEY": "SEKRITenv11",
}


def safe_llama(args: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "safe_llama", *args], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    return done.stdout + done.stderr


@pytest.fixture
def planted(tmp_path: Path, bundled_model: Path) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_ARG_", "SAFE_LLAMA_"))}
    return {**clean, **ENV, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(tmp_path / "cache")}


def leaks(text: str) -> list[str]:
    return sorted({word for word in text.replace("=", " ").replace('"', " ").split() if "SEKRIT" in word})


def test_explain_json_masks_the_failed_runs_secrets(planted: dict[str, str], bundled_model: Path) -> None:
    for shown in (["--json"], []):
        out = safe_llama(["explain", *shown, str(LOG), "-m", str(bundled_model), *ARGV], planted)
        assert "What" in out or '"what"' in out
        assert leaks(out) == [], out


def test_explain_masks_a_secret_the_log_quotes(planted: dict[str, str], tmp_path: Path) -> None:
    log = tmp_path / "quoted.log"
    log.write_text(
        "# LLAMA_API_KEY=SEKRITlogenv llama-server -m m.gguf --api-key SEKRITlogargv -hft=hf_SEKRITlog\n"
        + LOG.read_text().replace("load_model: loading model", "load_model: key SEKRITlogargv loading model")
    )
    for shown in (["--json"], []):
        assert leaks(safe_llama(["explain", *shown, str(log)], planted)) == []


@pytest.mark.slow
def test_plan_devices_doctor_and_the_cache_mask_every_secret(
    planted: dict[str, str], bundled_model: Path, tmp_path: Path
) -> None:
    outputs = {
        "plan": safe_llama(["plan", "server", "-m", str(bundled_model), *ARGV], planted),
        "plan --json": safe_llama(["plan", "--json", "server", "-m", str(bundled_model), *ARGV], planted),
        "devices": safe_llama(["devices"], planted),
        "devices --json": safe_llama(["devices", "--json"], planted),
        "doctor": safe_llama(["doctor"], planted),
        "doctor --json": safe_llama(["doctor", "--json"], planted),
    }
    assert "<redacted>" in outputs["plan --json"]
    assert {name: leaks(text) for name, text in outputs.items()} == {name: [] for name in outputs}
    stored = [path for path in (tmp_path / "cache").rglob("*") if path.is_file()]
    assert {str(path): leaks(path.read_bytes().decode("latin-1")) for path in stored} == {
        str(path): [] for path in stored
    }


@pytest.mark.parametrize(
    ("mode", "said"),
    [
        pytest.param(0o644, "readable by group and others (mode 0644)", id="0644"),
        pytest.param(0o604, "readable by others (mode 0604)", id="0604"),
        pytest.param(0o600, None, id="0600"),
    ],
)
def test_a_readable_api_key_file_is_warned_of(planted: dict[str, str], tmp_path: Path, mode: int, said: str) -> None:
    key = tmp_path / "key"
    key.write_text("SEKRITfile12\n")
    key.chmod(mode)
    out = safe_llama(["plan", "server", "--api-key-file", str(key)], planted)
    warned = [line for line in out.splitlines() if "--api-key-file is readable" in line]
    assert warned[0].endswith(f"{said}: chmod 600 it") if said else warned == [], out
    assert leaks(out) == [] and str(key) not in out


def test_an_api_key_on_the_command_line_is_warned_of(planted: dict[str, str]) -> None:
    out = safe_llama(["plan", "server", "--api-key", "SEKRITargv13"], planted)
    assert "--api-key on the command line is visible to every user (ps)" in out and leaks(out) == []
    env_only = safe_llama(["plan", "server"], {**planted, "LLAMA_API_KEY": "SEKRITenv14"})
    assert "visible to every user" not in env_only


@pytest.mark.slow  # a real llama-completion start
@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_launchs_lines_and_its_records_mask_every_secret(
    planted: dict[str, str], bundled_model: Path, llama_bin: Path, tmp_path: Path, log_format: str
) -> None:
    tokens = ["-hft", "hf_SEKRITshort4", "--hf-token", "hf_SEKRITlong15"]  # llama.cpp takes no --opt=value
    env = {**planted, "SAFE_LLAMA_BIN_DIR": str(llama_bin), "SAFE_LLAMA_LOG_FORMAT": log_format}
    out = safe_llama(["completion", "-m", str(bundled_model), "-p", "hi", "-n", "1", "-no-cnv", *tokens], env)
    again = safe_llama(["completion", "-m", str(bundled_model), "-p", "hi", "-n", "1", "-no-cnv", *tokens], env)
    assert "safe-llama" in out and leaks(out + again) == [], out
    stored = [path for path in (tmp_path / "cache").rglob("*") if path.is_file()]
    assert stored
    assert [str(p) for p in stored if leaks(p.read_bytes().decode("latin-1"))] == []

"""A GPU that is not safe-llama's alone: another program takes memory between the plan and the start. The start
fails in CUDA's words, safe-llama reads the free memory again, says how it moved, and the next start fits.
Through a fake CUDA build (tests/fakes/fake_cuda_llama.py: the H200's recorded figures), since this machine has
no NVIDIA GPU."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from safe_llama.units import human
from tests import ROOT
from tests.fakes.fake_cuda_llama import CONTEXT_MIB, build_nvml
from tests.llama_run import free_port, healthy
from tests.tiny_gguf import write_tiny_gguf

FAKE = ROOT / "tests" / "fakes" / "fake_cuda_llama.py"
SHARED = ROOT / "tests" / "fixtures" / "nvidia-h200-cuda" / "shared-gpu"
MIB = 1 << 20
KV_SIZE = re.compile(r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells")


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The H200 recordings' model: 8 layers x 16 KV heads x 256 (128 KiB of f16 KV per token)."""
    return write_tiny_gguf(tmp_path_factory.mktemp("models") / "big.gguf", n_layer=8, n_head=16, n_head_kv=16,
                           head_dim=256, n_ff=64, n_ctx_train=2_000_000, sparse=True)  # fmt: skip


@pytest.fixture(scope="module")
def dense(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The recordings' dense model: 24 layers of 352 MiB (8.3 GiB of weights), 96 KiB of f16 KV per token."""
    return write_tiny_gguf(tmp_path_factory.mktemp("models") / "dense.gguf", n_layer=24, n_head=32, n_head_kv=8,
                           head_dim=128, n_ff=4096, n_ctx_train=8192, sparse=True)  # fmt: skip


@dataclass(frozen=True)
class Gpu:
    source: str  # what safe-llama reads the free memory from: "nvml" or "listing"
    env: dict[str, str]
    free_file: Path
    argv_log: Path

    def starts(self) -> list[list[str]]:
        return [json.loads(line) for line in self.argv_log.read_text().splitlines()]

    def seen_free(self, file_mib: int) -> int:
        """What safe-llama reads free with file_mib in the free file: NVML's figure is the file's; llama.cpp's
        listing is made with its own CUDA context there (the fake's CONTEXT_MIB)."""
        return (file_mib - (CONTEXT_MIB if self.source == "listing" else 0)) * MIB


@pytest.fixture(scope="module")
def nvml_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the fake NVML as libnvidia-ml.so.1, for the dynamic loader to find through LD_LIBRARY_PATH."""
    return build_nvml(tmp_path_factory.mktemp("nvml")).parent


def _machine(tmp_path: Path, clean_env: dict[str, str], nvml_dir: Path | None) -> Gpu:
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    shim = bin_dir / "llama-server"
    shim.write_text(
        "#!/bin/sh\n# FAKE: llama.cpp's CUDA build on an H200 (see tests/fakes/fake_cuda_llama.py)\n"
        f'exec {sys.executable} {FAKE} "$@"\n'
    )
    shim.chmod(0o755)
    free_file, argv_log = tmp_path / "free-mib", tmp_path / "argv.jsonl"
    argv_log.touch()
    env = {
        **clean_env,
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "SAFE_LLAMA_BIN_DIR": str(bin_dir),
        "FAKE_FREE_FILE": str(free_file),
        "FAKE_ARGV_LOG": str(argv_log),
        "LD_LIBRARY_PATH": str(nvml_dir or tmp_path / "no-nvml"),
    }
    return Gpu("nvml" if nvml_dir else "listing", env, free_file, argv_log)


@pytest.fixture(params=["nvml", "listing"])
def gpu(request: pytest.FixtureRequest, tmp_path: Path, clean_env: dict[str, str], nvml_dir: Path) -> Gpu:
    """The fake H200. nvml: its driver's NVML answers (as on any machine with the NVIDIA driver); listing: no NVML
    (not mounted into a container, say), so llama.cpp's own `--list-devices` is the free figure."""
    return _machine(tmp_path, clean_env, nvml_dir if request.param == "nvml" else None)


@pytest.fixture
def bare(tmp_path: Path, clean_env: dict[str, str]) -> Gpu:
    """The fake H200 for running the fake alone."""
    return _machine(tmp_path, clean_env, None)


def _fake(args: list[str], gpu: Gpu) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(FAKE), *args], env=gpu.env, capture_output=True, text=True, timeout=60)


def _serve(args: list[str], env: dict[str, str]) -> tuple[bool, int, str]:
    """safe-llama server until /health answers 200 (or it exits), then SIGTERM: (ready, exit code, stderr)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "safe_llama", "server", *args, "--port", str(port)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    ready = False
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if healthy(port):
                ready = True
                break
            time.sleep(0.1)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return ready, proc.returncode, err.decode(errors="replace")


def _flag(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def _safe_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("safe-llama:")]


# ---------------------------------------------------------------------------------- the fake against the GPU


@pytest.mark.parametrize(
    ("recorded", "free_mib", "model", "args", "failed"),
    [
        # 80 GiB held: the 262 GB f16 KV does not fit
        pytest.param("bare80-c2M-ngl99", 60617, "big", ["-c", "2000000", "-ngl", "99"],
                     "failed to allocate CUDA0 buffer of size 262160777216", id="bare80-c2M-ngl99"),
        # 4.4 GiB free: the 8453.88 MiB of weights do not fit
        pytest.param("bare5-dense-c8k-ngl99", 4501, "dense", ["-c", "8192", "-ngl", "99"],
                     "failed to allocate CUDA0 buffer of size 8864530432", id="bare5-dense-ngl99"),
        # 11 layers' weights fit, their 352 MiB of KV does not
        pytest.param("bare5-dense-c8k-ngl12", 4501, "dense", ["-c", "8192", "-ngl", "12"],
                     "failed to allocate CUDA0 buffer of size 369098752", id="bare5-dense-ngl12"),
    ],
)  # fmt: skip
def test_the_fake_fails_where_the_h200_failed(
    recorded: str, free_mib: int, model: str, args: list[str], failed: str, bare: Gpu, big: Path, dense: Path
) -> None:
    """free_mib: NVML's reading there (shared-gpu/nvml-held80.json, nvml-held5free.json)."""
    assert failed in (SHARED / f"{recorded}.log").read_text()
    bare.free_file.write_text(str(free_mib))
    done = _fake(["-m", str(big if model == "big" else dense), *args, "--port", str(free_port())], bare)
    assert done.returncode == 1, done.stderr
    assert failed in done.stderr


@pytest.mark.parametrize(
    ("recorded", "free_mib", "model", "args"),
    [
        # NVML's 4500 MiB there: safe-llama planned -ngl 10
        pytest.param("free5-dense-c8k-ngl99-safe-llama", 4500, "dense", ["-c", "8192", "-ngl", "10", "-fit", "off"],
                     id="dense-ngl10"),
        # NVML's 59.19 GiB there: safe-llama planned 681728 cells of q8_0 KV
        pytest.param("held80-c2M-ngl99-safe-llama", 60610, "big",
                     ["-c", "681728", "-ngl", "99", "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on", "-fit", "off"],
                     id="held80-c681728-q8"),
    ],
)  # fmt: skip
@pytest.mark.slow
def test_the_fake_starts_where_the_h200_started(
    recorded: str, free_mib: int, model: str, args: list[str], bare: Gpu, big: Path, dense: Path
) -> None:
    """The buffers it logs are the H200's, to the hundredth of a MiB."""
    sizes = re.compile(r"(CUDA0 model buffer size|CUDA0 KV buffer size|CUDA0 compute buffer size) = +([\d.]+) MiB")
    log = (SHARED / f"{recorded}.log").read_text()
    bare.free_file.write_text(str(free_mib))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(FAKE), "-m", str(big if model == "big" else dense), *args, "--port", str(port)],
        env=bare.env,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while not healthy(port) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert healthy(port)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    assert f"offloaded {min(int(args[3]), 25 if model == 'dense' else 9)}/" in err.decode()
    seen = {name: float(mib) for name, mib in sizes.findall(err.decode())}
    assert len(seen) == 3
    for name, mib in sizes.findall(log):
        assert seen[name] == pytest.approx(float(mib), abs=0.1), name


def test_the_fake_lists_what_llama_cpp_listed(bare: Gpu) -> None:
    for nvml, listing in ((60617, "held80"), (4501, "held5free")):  # NVML's reading there, MiB
        bare.free_file.write_text(str(nvml))
        assert _fake(["--list-devices"], bare).stdout == (SHARED / f"list-devices-{listing}.txt").read_text()


# ---------------------------------------------------------------------------------------- through safe-llama


@pytest.mark.slow
def test_kv_that_no_longer_fits_is_retried_smaller(gpu: Gpu, big: Path) -> None:
    gpu.free_file.write_text("60616")  # 80 GiB held by another program while safe-llama plans
    env = {**gpu.env, "FAKE_SHRINK_TO": "30000"}  # and 30 GiB more taken before the start allocates
    ready, code, err = _serve(["-m", str(big), "-c", "2000000", "-ngl", "99"], env)
    assert ready and code == 0, err[-4000:]
    assert "failed to initialize the context: failed to allocate buffer for kv cache" in err
    starts = gpu.starts()
    assert len(starts) == 2, err[-4000:]
    lines = _safe_lines(err)
    failed = [line for line in lines if line.startswith("safe-llama: attempt 1 failed")]
    assert len(failed) == 1, lines
    assert "cudaMalloc failed: out of memory" in failed[0] and "the KV cache (" in failed[0], failed[0]
    assert "did not fit on CUDA0 beside" in failed[0] and "planning with what the device held then" in failed[0]
    moved = [line for line in lines if "free now" in line and "when planned" in line]
    now, planned = human(gpu.seen_free(30000)), human(gpu.seen_free(60616))
    assert moved == [f"safe-llama: CUDA0: {now} free now, {planned} when planned: planning with it"], lines
    asked = re.search(r"allocating ([\d.]+) MiB on device 0", failed[0])
    assert asked is not None
    kv = [(float(m.group(1)), int(m.group(2))) for m in KV_SIZE.finditer(err)]
    assert len(kv) == 1  # only the second start got as far as logging its KV
    assert kv[0][0] < float(asked.group(1))
    first_ctx, second_ctx = (int(_flag(a, "-c") or 0) for a in starts)
    assert second_ctx < first_ctx < 2_000_000
    assert kv[0][1] == -(-second_ctx // 256) * 256
    assert _flag(starts[1], "-ngl") == "99"  # the weights fitted: the layers stay


@pytest.mark.slow
def test_weights_that_no_longer_fit_get_fewer_layers(gpu: Gpu, dense: Path) -> None:
    gpu.free_file.write_text("4500")
    env = {**gpu.env, "FAKE_SHRINK_TO": "3000"}  # 1.4 GiB taken between the plan and the start
    ready, code, err = _serve(["-m", str(dense), "-c", "8192", "-ngl", "99"], env)
    assert ready and code == 0, err[-4000:]
    assert "llama_model_load: error loading model: unable to allocate CUDA0 buffer" in err  # the weights, first
    starts = gpu.starts()
    assert len(starts) == 2, err[-4000:]
    lines = _safe_lines(err)
    failed = [line for line in lines if line.startswith("safe-llama: attempt 1 failed")]
    assert len(failed) == 1, lines
    assert "did not fit on CUDA0" in failed[0] and "the KV kept as planned" in failed[0], failed[0]
    for flag in ("-c", "-ctk", "-ctv", "-fa"):
        assert _flag(starts[1], flag) == _flag(starts[0], flag), (flag, starts)
    assert _flag(starts[1], "-c") == "8192"
    assert int(_flag(starts[1], "-ngl") or 0) < int(_flag(starts[0], "-ngl") or 0)
    moved = [line for line in lines if "free now" in line and "when planned" in line]
    now, planned = human(gpu.seen_free(3000)), human(gpu.seen_free(4500))
    assert moved == [f"safe-llama: CUDA0: {now} free now, {planned} when planned: planning with it"], lines
    if gpu.source == "nvml":  # the listing's plan: test_the_listing_plans_as_nvml_does
        assert _flag(starts[0], "-ngl") == "10"


@pytest.mark.slow
def test_the_retry_line_names_the_gpu_the_kv_did_not_fit_on(
    tmp_path: Path, clean_env: dict[str, str], nvml_dir: Path, big: Path
) -> None:
    """CUDA's own line says "device 0"; under CUDA_VISIBLE_DEVICES that is not the GPU's number. The failure's
    buffer names the device as llama.cpp does (CUDA0), and so should safe-llama's line about it."""
    gpu = _machine(tmp_path, clean_env, nvml_dir)
    gpu.free_file.write_text("60616")
    ready, _, err = _serve(["-m", str(big), "-c", "2000000", "-ngl", "99"], {**gpu.env, "FAKE_SHRINK_TO": "30000"})
    assert ready, err[-4000:]
    failed = [line for line in _safe_lines(err) if line.startswith("safe-llama: attempt 1 failed")]
    assert len(failed) == 1 and "KV cache" in failed[0]
    assert "CUDA0" in failed[0], failed[0]


@pytest.mark.slow
@pytest.mark.parametrize("source", ["nvml", "listing"])
def test_the_listing_plans_as_nvml_does(
    source: str, tmp_path: Path, clean_env: dict[str, str], nvml_dir: Path, dense: Path
) -> None:
    """-ngl 10 (9 layers and the output layer: 3173.4 MiB of weights, 288 MiB of KV) started on the H200 with 3977
    MiB listed free, NVML's 4501 MiB (shared-gpu/bare5-dense-c8k-ngl10.log, list-devices-held5free.txt). The
    listing's figure is read after llama.cpp made its CUDA context: the runtime's part is already out of it."""
    gpu = _machine(tmp_path, clean_env, nvml_dir if source == "nvml" else None)
    gpu.free_file.write_text("4500")
    done = subprocess.run(
        [sys.executable, "-m", "safe_llama", "plan", "--json", "server", "-m", str(dense), "-c", "8192", "-ngl", "99"],
        env=gpu.env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    decided = json.loads(done.stdout)
    assert decided["target"]["device_free"]["bytes"] == gpu.seen_free(4500)
    assert _flag(decided["decision"]["argv"], "-ngl") == "10", decided["decision"]["reasons"]

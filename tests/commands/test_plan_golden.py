"""`safe-llama plan --json` byte for byte on a fixed set of command lines (tests/corpus/command_lines.toml and
GOLDEN_EXTRA below: every ladder step, every device profile, the serving step), against the outputs recorded in
tests/fixtures/plan-golden.json. A change of the code's shape must not change a plan; a change of a plan is made
on purpose: `SAFE_LLAMA_GOLDEN_WRITE=1 pytest tests/commands/test_plan_golden.py` records the new outputs, and the
diff of the fixture is reviewed with it.

The inputs are fixed: the host budget and the device are declared (no llama.cpp binary is found, so nothing is
probed but the host, and the declared host memory bounds it), the models are the corpus's stand-ins."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from safe_llama.commands.plan import plan_command
from safe_llama.device.probe_host import HostMemory
from safe_llama.device.probe_sysfs import SysfsReport
from safe_llama.pipeline.options import plan_options
from tests import FIXTURES, ROOT
from tests.cmdline.test_corpus import CASES, _args, world  # noqa: F401 (world: the corpus's HOME fixture)
from tests.tiny_gguf import write_tiny_gguf

GOLDEN = FIXTURES / "plan-golden.json"
# the machine as the recording saw it: 64 GiB available, no cgroup limit, no RLIMIT_AS, no GPU in sysfs
HOST = HostMemory(total_bytes=68_719_476_736, available_bytes=68_719_476_736, cgroup=None, cgroup_note="none",
                  rlimit_as=None)  # fmt: skip

# Lines that walk the planner's other paths: each ladder step, the OpenVINO iGPU, a GPU with its limits,
# the serving step under a declared budget, the user's own -ngl, -fit, KV types and -fa.
GOLDEN_EXTRA: list[dict[str, Any]] = [
    {"id": "x: ctx step under 1G", "host_memory": "1G", "args": ["-m", "~/model.gguf", "-c", "4000000"]},
    {"id": "x: kv-q8 then ctx under 300M", "host_memory": "300M", "args": ["-m", "~/model.gguf", "-c", "1000000"]},
    {"id": "x: completion -c 0", "tool": "completion", "host_memory": "2G", "args": ["-m", "~/model.gguf", "-c", "0"]},
    {"id": "x: cli -ctk q4_0 -ctv q4_0", "tool": "cli", "host_memory": "2G",
     "args": ["-m", "~/model.gguf", "-c", "8192", "-ctk", "q4_0", "-ctv", "q4_0"]},
    {"id": "x: -fa off", "host_memory": "1G", "args": ["-m", "~/model.gguf", "-c", "1000000", "-fa", "off"]},
    {"id": "x: -np 16 -no-kvu", "host_memory": "1G",
     "args": ["-m", "~/model.gguf", "-c", "65536", "-np", "16", "-no-kvu"]},
    {"id": "x: -ub 4096 -b 4096", "host_memory": "4G", "args": ["-m", "~/model.gguf", "-c", "32768", "-ub", "4096",
                                                        "-b", "4096"]},
    {"id": "x: --fit on", "host_memory": "1G", "args": ["-m", "~/model.gguf", "-c", "1000000", "--fit", "on"]},
    {"id": "x: serving step under a declared budget", "host_memory": "1G",
     "args": ["-m", "~/model.gguf", "-c", "8192"]},
    {"id": "x: user -cram counted", "host_memory": "1G", "args": ["-m", "~/model.gguf", "-c", "8192", "-cram", "100"]},
    {"id": "x: user -ctxcp", "host_memory": "1G", "args": ["-m", "~/model.gguf", "-c", "8192", "-ctxcp", "4"]},
    {"id": "x: openvino igpu -c 65536 (stateful)", "profile": "intel-uhd-770", "host_memory": "16G",
     "args": ["-m", "~/model.gguf", "-c", "65536"]},
    {"id": "x: openvino igpu -c 1000000", "profile": "intel-uhd-770", "host_memory": "2G",
     "args": ["-m", "~/model.gguf", "-c", "1000000"]},
    {"id": "x: h200 -c 2000000 -ngl 99", "profile": "nvidia-h200", "host_memory": "64G",
     "args": ["-m", "~/model.gguf", "-c", "2000000", "-ngl", "99"]},
    {"id": "x: h200 declared 1G device -ngl 99", "profile": "nvidia-h200", "device_memory": "1G", "host_memory": "64G",
     "args": ["-m", "~/model.gguf", "-c", "2000000", "-ngl", "99"]},
    {"id": "x: declared max alloc", "max_alloc": "64M", "host_memory": "8G",
     "args": ["-m", "~/model.gguf", "-c", "200000"]},
    {"id": "x: ladder ctx only", "ladder": "ctx", "host_memory": "1G", "args": ["-m", "~/model.gguf", "-c", "4000000"]},
    {"id": "x: min-ctx above what fits", "min_ctx": 3000000, "host_memory": "1G",
     "args": ["-m", "~/model.gguf", "-c", "4000000"]},
    {"id": "x: env LLAMA_ARG_CTX_SIZE", "host_memory": "1G", "env": {"LLAMA_ARG_CTX_SIZE": "3000000"},
     "args": ["-m", "~/model.gguf"]},
    {"id": "x: moe -cmoe on h200", "profile": "nvidia-h200", "host_memory": "64G",
     "args": ["-m", "~/gpt-oss-20b.auto.gguf", "-cmoe", "-c", "100000"]},
    # big.gguf: 8 layers x 16 KV heads of 256 (128 KiB of f16 KV per cell, small weights), trained to 2,000,000
    {"id": "x: big cpu -c 100000 under 4G", "host_memory": "4G", "args": ["-m", "~/big.gguf", "-c", "100000"]},
    {"id": "x: big cpu kv-q8,kv-q4,ctx under 4G", "ladder": "kv-q8,kv-q4,ctx", "host_memory": "4G",
     "args": ["-m", "~/big.gguf", "-c", "100000"]},
    {"id": "x: big cpu kv-q8 with -fa off", "ladder": "kv-q8,ctx", "host_memory": "12G",
     "args": ["-m", "~/big.gguf", "-c", "100000", "-fa", "off"]},
    {"id": "x: big completion no -c", "tool": "completion", "host_memory": "8G", "args": ["-m", "~/big.gguf"]},
    {"id": "x: big openvino -c 65536 (stateful)", "profile": "intel-uhd-770", "host_memory": "16G",
     "args": ["-m", "~/big.gguf", "-c", "65536"]},
    {"id": "x: big openvino 0.4.1-dev -c 65536 (the seed's build)", "profile": "intel-uhd-770", "host_memory": "16G",
     "llama_version": "0.4.1-dev", "args": ["-m", "~/big.gguf", "-c", "65536"]},
    {"id": "x: big openvino cli -c 65536 -np 1", "tool": "cli", "profile": "intel-uhd-770", "host_memory": "16G",
     "args": ["-m", "~/big.gguf", "-c", "65536", "-np", "1"]},
    {"id": "x: big h200 4G ngl ladder", "ladder": "ngl", "profile": "nvidia-h200", "device_memory": "4G",
     "host_memory": "64G", "args": ["-m", "~/big.gguf", "-c", "100000", "-ngl", "99"]},
    {"id": "x: big h200 4G default ladder", "profile": "nvidia-h200", "device_memory": "4G", "host_memory": "64G",
     "args": ["-m", "~/big.gguf", "-c", "100000", "-ngl", "99"]},
    {"id": "x: big h200 -nkvo", "profile": "nvidia-h200", "device_memory": "4G", "host_memory": "64G",
     "args": ["-m", "~/big.gguf", "-c", "100000", "-ngl", "99", "-nkvo"]},
    {"id": "x: big max alloc 1G -c 100000", "max_alloc": "1G", "device_memory": "24G", "host_memory": "32G",
     "args": ["-m", "~/big.gguf", "-c", "100000"]},
    {"id": "x: moe h200 2M weights ladder", "ladder": "weights,ctx", "profile": "nvidia-h200",
     "device_memory": "2M", "host_memory": "64G", "args": ["-m", "~/gpt-oss-20b.auto.gguf", "-ngl", "99"]},
]  # fmt: skip
PLANNED = [c for c in CASES if c["model"] not in ("pass-through", "bundled")] + GOLDEN_EXTRA


def _plan(home: Path, case: dict[str, Any], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
          ) -> dict[str, Any]:  # fmt: skip
    monkeypatch.setattr("safe_llama.device.probing.probe_host", lambda **_: HOST)
    monkeypatch.setattr(
        "safe_llama.device.probing.probe_sysfs", lambda **_: SysfsReport(gpus=(), render_nodes=(), note="")
    )
    monkeypatch.setattr("safe_llama.device.probe_free.nvidia_driver_loaded", lambda *_: False)
    # no network: a model not downloaded yet gets no time to have its header read over HTTP
    monkeypatch.setattr("safe_llama.pipeline.remote_header.DEADLINE", 0.0)
    monkeypatch.chdir(home / "work" if any(a.startswith("../") for a in case["args"]) else home)
    profile = case.get("profile", "nvidia-h200" if case.get("target") == "h200" else None)
    options = plan_options(
        ladder=case.get("ladder"), min_ctx=case.get("min_ctx"), profile=profile, max_alloc=case.get("max_alloc"),
        device_memory=case.get("device_memory"), integrated=None, host_memory=case.get("host_memory", "64G"),
        llama_bin=None, llama_version=case.get("llama_version", "0.6.0-dev"), kv_split=None,
    )  # fmt: skip
    env = {"HOME": str(home), "PATH": "/nonexistent", "XDG_CONFIG_HOME": str(home / "config"),
           "XDG_CACHE_HOME": str(home / "golden-cache"), "SAFE_LLAMA_PREFIX": str(home / "no-prefix"),
           **case.get("env", {})}  # fmt: skip
    code = plan_command(tool=case.get("tool", "server"), args=_args(home, case), json_out=True, options=options,
                        env=env)  # fmt: skip
    out = capsys.readouterr().out.replace(str(home), "~").replace(str(ROOT), "<repo>")
    return {"exit": code, "json": json.loads(out)}


def test_plan_json_is_what_was_recorded(world: Path, capsys: pytest.CaptureFixture[str],  # noqa: F811
                                        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    assert len(PLANNED) >= 30
    if not (world / "big.gguf").exists():
        write_tiny_gguf(world / "big.gguf", n_layer=8, n_head=16, n_head_kv=16, head_dim=256, n_embd=256, n_ff=64,
                        n_ctx_train=2_000_000)  # fmt: skip
    got = {case["id"]: _plan(world, case, capsys, monkeypatch) for case in PLANNED}
    if os.environ.get("SAFE_LLAMA_GOLDEN_WRITE") == "1":
        GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    recorded = json.loads(GOLDEN.read_text())
    assert sorted(got) == sorted(recorded)
    changed = [name for name in got if got[name] != recorded[name]]
    assert not changed, f"plans that changed: {changed}"

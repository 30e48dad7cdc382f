"""Every architecture the pinned llama.cpp supports, against safe-llama's KV prediction: llama.cpp's own
test-llama-archs writes a tiny random-weight model per architecture, the real binaries load each one in a
few configurations, and their `llama_kv_cache: size` / `llama_memory_recurrent: size` lines are compared
with plan_kv. A test support module (used by tests/model/test_archs_real.py and benchmarks/bench_archs.py).

The lines print MiB with two decimals. The first five configurations give each stream at least 8192 cells,
so one f16 element more or less per cell in one layer (16 KiB) changes what is printed: equal KV lines mean
equal bytes. The last three are llama-server's everyday command lines (small contexts, its slots, a q8_0
cache), where the cell counts and layer counts must match as well. Recurrent state does not grow with the
context, so its lines are equal to 0.01 MiB only.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from safe_llama.model.arch import ARCHITECTURES, UNMODELLED
from safe_llama.model.header_facts import load_model_facts
from safe_llama.model.kv import STATE_KINDS, KvRequest, f32_mib, mib_line, plan_kv
from tests.llama_run import kv_lines, run_server_until_ready

RS_LINE = re.compile(
    r"llama_memory_recurrent: size = +(?P<total>[\d.]+) MiB \( *(?P<cells>\d+) cells, +\d+ layers, +"
    r"(?P<seqs>\d+) seqs +\d+ rs_seq\), R \(\w+\): +(?P<r>[\d.]+) MiB, S \(\w+\): +(?P<s>[\d.]+) MiB, "
    r"P \(\w+\): +(?P<p>[\d.]+) MiB"
)
# llama_dsv4_comp_state's summary of one compressor state (src/llama-kv-cache-dsv4.cpp), in MiB as a double
STATE_LINE = re.compile(
    r"llama_dsv4_comp_state: (?P<name>\w+) ratio = \d+, state = (?P<size>\d+) x \d+, streams = (?P<streams>\d+), "
    r"rs_seq = \d+, layers = (?P<layers>\d+), size = +(?P<mib>[\d.]+) MiB"
)
# runs of one configuration until its log is whole (run_config says why a log is cut short)
TRIES = 25
# sched_reserve runs after every memory module exists: a log without it was cut short
DONE = "sched_reserve:"
# llama_init_from_model's refusals of a cache type the model cannot take (src/llama-context.cpp): the
# configuration does not apply to the model, which says nothing about the KV arithmetic
REFUSED = re.compile(
    r"llama_init_from_model: (quantized V cache requires flash_attn to be enabled"
    r"|K cache type \w+ with block size \d+ does not divide n_embd_head_k=\d+"
    r"|V cache type \w+ with block size \d+ does not divide n_embd_head_v=\d+)"
)


@dataclass(frozen=True)
class Config:
    name: str
    tool: str  # completion | server (llama-completion has no -kvu)
    args: tuple[str, ...]
    request: KvRequest


CONFIGS = (
    Config("c8000", "completion", ("-c", "8000"), KvRequest("completion", n_ctx=8000)),
    Config(
        "np3-fa-off",
        "completion",
        ("-c", "24576", "-np", "3", "-fa", "off"),
        KvRequest("completion", n_ctx=24576, n_parallel=3, flash_attn="off"),
    ),
    Config(
        "np3-kvu",
        "server",
        ("-c", "8192", "-np", "3", "-kvu"),
        KvRequest("server", n_ctx=8192, n_parallel=3, kv_unified=True),
    ),
    Config(
        "q8_0",
        "completion",
        ("-c", "9000", "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on"),
        KvRequest("completion", n_ctx=9000, type_k="q8_0", type_v="q8_0", flash_attn="on"),
    ),
    Config(
        "np2-swa-full",
        "completion",
        ("-c", "16384", "-np", "2", "--swa-full"),
        KvRequest("completion", n_ctx=16384, n_parallel=2, swa_full=True),
    ),
    Config("server-np2", "server", ("-c", "4096", "-np", "2"), KvRequest("server", n_ctx=4096, n_parallel=2)),
    Config(
        "server-auto",
        "server",
        (
            "-c",
            "10000",
        ),
        KvRequest("server", n_ctx=10000),
    ),
    Config(
        "server-q8_0",
        "server",
        ("-c", "3000", "-np", "1", "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on"),
        KvRequest("server", n_ctx=3000, n_parallel=1, type_k="q8_0", type_v="q8_0", flash_attn="on"),
    ),
)

# What the binaries print for one cache, in their own order (KV caches first, then recurrent state)
CacheLine = tuple[str, ...]


def architecture_of(model: Path) -> str:
    return load_model_facts(model).architecture


def generate_corpus(bin_dir: Path, out: Path, timeout: float = 120) -> list[Path]:
    """test-llama-archs -o OUT: one GGUF per architecture (dense and MoE variants)."""
    subprocess.run(
        [str(bin_dir / "test-llama-archs"), "-o", str(out)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=timeout,
        check=True,
    )
    return sorted(out.glob("*.gguf"))


def seen_lines(log: str) -> list[CacheLine]:
    out: list[CacheLine] = [
        ("kv", x.total, str(x.cells), str(x.layers), str(x.seqs), str(x.streams), x.type_k, x.k, x.type_v, x.v)
        for x in kv_lines(log)
    ]
    out += [("rs", m["total"], m["cells"], m["seqs"], m["r"], m["s"], m["p"]) for m in RS_LINE.finditer(log)]
    for m in STATE_LINE.finditer(log):
        out.append(("state", f"{m['name']} state", m["size"], m["streams"], m["layers"], m["mib"]))
    return out


def predicted_lines(model: Path, req: KvRequest) -> tuple[list[CacheLine], int]:
    """The lines plan_kv says llama.cpp will print, and its total bytes."""
    kv = plan_kv(load_model_facts(model), req)
    kv_out: list[CacheLine] = []
    rs_out: list[CacheLine] = []
    state_out: list[CacheLine] = []
    for c in kv.caches:
        total, k, v = mib_line(c)
        if c.kind in STATE_KINDS:
            mib = f"{c.total_bytes / 1048576:.2f}"
            state_out.append(("state", c.kind, str(c.cells), str(c.n_stream), str(c.layers), mib))
        elif c.kind == "recurrent":
            rs_out.append(("rs", total, str(c.cells), str(c.n_seq_max), k, v, f32_mib(c.p_bytes)))
        else:
            kv_out.append(
                ("kv", total, str(c.cells), str(c.layers), str(c.n_seq_max), str(c.n_stream), c.type_k, k, c.type_v, v)
            )
    return kv_out + rs_out + state_out, kv.total_bytes


def seen_mib(lines: Sequence[CacheLine]) -> float:
    return sum(float(line[1]) for line in lines)


def run_config(
    bin_dir: Path, model: Path, config: Config, env: Mapping[str, str], timeout: float = 60
) -> tuple[int | None, str]:
    """The log of the real binary loading model with this configuration.

    llama.cpp logs from a worker thread that its exit does not wait for (common_log_main() is never destroyed),
    so a run that ends within milliseconds loses the log's tail: here, llama-completion on llada-dense at
    np3-fa-off lost it in 61 of 300 runs, each exiting 0 about 10 ms in; under CI's load five in a row once
    did. A log that ends before its compute buffers or a refusal is taken again, up to TRIES times.
    Returns (exit code, None for a server that became ready; the log).
    """
    common = ["-m", str(model), *config.args, "-lv", "4", "-fit", "off", "--no-warmup"]
    log = ""
    code: int | None = None
    for _ in range(TRIES):
        if config.tool == "server":
            code, log = run_server_until_ready(bin_dir, common, env, timeout=timeout)
        else:
            argv = [str(bin_dir / "llama-completion"), *common, "-n", "0", "-no-cnv", "-p", "hi"]
            done = subprocess.run(argv, env=dict(env), stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
            log = (done.stdout + done.stderr).decode(errors="replace")
            code = done.returncode
        if DONE in log or REFUSED.search(log):
            break
    return code, log


@dataclass(frozen=True)
class Outcome:
    model: str
    architecture: str
    config: str
    seen: tuple[CacheLine, ...]
    predicted: tuple[CacheLine, ...]
    predicted_mib: float
    notes: tuple[str, ...]
    log_tail: str  # empty when the log is complete
    refused: str  # llama.cpp's reason for refusing this configuration ("exit 1, its log lost" too), or empty

    @property
    def exact(self) -> bool:
        return not self.log_tail and not self.refused and self.seen == self.predicted

    def problem(self) -> str | None:
        """Why this outcome breaks the promise (exact, or an unmodelled architecture never erring the other way)."""
        if self.refused:
            return None
        if self.log_tail:
            return "the real binary's log stops before its compute buffers"
        unmodelled = UNMODELLED.get(self.architecture)
        if unmodelled is None:
            if self.architecture not in ARCHITECTURES:
                return "architecture neither modelled nor listed as unmodelled"
            return None if self.exact else "not exact"
        if not any("not modelled exactly" in note and unmodelled.direction in note for note in self.notes):
            return f"no note saying the estimate is an {unmodelled.direction}-estimate"
        real = seen_mib(self.seen)
        # 0.01 MiB of slack per printed line: the binary rounds each to two decimals
        slack = 0.005 * len(self.seen)
        ok = {"over": self.predicted_mib >= real - slack, "under": self.predicted_mib <= real + slack}.get(
            unmodelled.direction, False
        )
        return (
            None
            if ok
            else f"said {unmodelled.direction}-estimate, predicted {self.predicted_mib:.2f} MiB vs {real:.2f}"
        )


def compare(bin_dir: Path, model: Path, config: Config, env: Mapping[str, str]) -> Outcome:
    code, log = run_config(bin_dir, model, config, env)
    refused = REFUSED.search(log)
    facts = load_model_facts(model)
    predicted, total = predicted_lines(model, config.request)
    return Outcome(
        model.name,
        facts.architecture,
        config.name,
        tuple(seen_lines(log)),
        tuple(predicted),
        total / 1048576,
        facts.notes,
        log[-2000:] if DONE not in log else "",
        refused[0] if refused else f"exit {code}, its log lost" if code == 1 and DONE not in log else "",
    )


def compare_all(
    bin_dir: Path,
    models: Sequence[Path],
    env: Mapping[str, str],
    *,
    configs: Sequence[Config] = CONFIGS,
    workers: int = 2,
    progress: Callable[[Outcome], None] | None = None,
) -> list[Outcome]:
    """Every model in every configuration, a few real processes at a time (each bounded by a timeout)."""
    jobs = [(model, config) for model in models for config in configs]
    out: list[Outcome] = []
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for outcome in pool.map(lambda job: compare(bin_dir, job[0], job[1], env), jobs):
            out.append(outcome)
            if progress is not None:
                progress(outcome)
    return out


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_ARG_", "SAFE_LLAMA_"))}

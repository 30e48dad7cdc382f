"""The planner against the real CPU build: under an address-space limit (ulimit -v) the context it
chooses starts the first time, and is at least 90% of the largest context that really starts there."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from tests.llama_run import run_server_until_ready

ASKED = 262144 * 2  # the bundled model's KV and compute buffers fail long before this under both limits


def _plan_under_limit(env: dict[str, str], args: list[str], limit_kib: int) -> dict[str, object]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit_kib * 1024, limit_kib * 1024))

    out = subprocess.run(
        [sys.executable, "-m", "safe_llama", "plan", "--json", "server", *args],
        env=env,
        capture_output=True,
        text=True,
        preexec_fn=limit,
        timeout=120,
        check=True,
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


def _starts(llama_bin: Path, argv: list[str], ctx: int, env: dict[str, str], limit_kib: int) -> bool:
    """The plan's own command line and environment with only the context changed."""
    argv = list(argv)
    argv[argv.index("-c") + 1] = str(ctx)
    code, _ = run_server_until_ready(llama_bin, argv, env, as_limit_kib=limit_kib)
    return code is None


@pytest.mark.slow
@pytest.mark.parametrize("limit_kib", [1_048_576, 1_572_864], ids=["1GiB", "1.5GiB"])
def test_plan_under_ulimit_starts_and_is_not_wasteful(
    limit_kib: int, llama_bin: Path, bundled_model: Path, clean_env: dict[str, str]
) -> None:
    env = {**clean_env, "SAFE_LLAMA_BIN_DIR": str(llama_bin)}
    result = _plan_under_limit(env, ["-m", str(bundled_model), "-c", str(ASKED)], limit_kib)
    decision = result["decision"]
    assert isinstance(decision, dict)
    assert decision["steps"][:2] == ["malloc-arenas", "ctx"]
    budget = result["target"]["host_budget"]  # type: ignore[index]
    assert budget["bytes"] == limit_kib * 1024 and "RLIMIT_AS" in budget["detail"]
    argv = decision["argv"]
    run_env = {**clean_env, **decision["env"]}
    assert run_env["MALLOC_ARENA_MAX"] == "2"
    chosen = int(argv[argv.index("-c") + 1])
    assert chosen < ASKED

    code, log = run_server_until_ready(llama_bin, argv, run_env, as_limit_kib=limit_kib)
    assert code is None, f"the planned context {chosen} did not start under the limit:\n{log[-2000:]}"

    # the largest context that really starts under the same limit, by bisection on llama.cpp's 256 grid
    lo, hi = chosen // 256, ASKED // 256
    assert not _starts(llama_bin, argv, hi * 256, run_env, limit_kib), "the asked context must not fit"
    while lo + 1 < hi:
        mid = (lo + hi) // 2
        if _starts(llama_bin, argv, mid * 256, run_env, limit_kib):
            lo = mid
        else:
            hi = mid
    largest = lo * 256
    print(f"limit {limit_kib} KiB: planned -c {chosen}, largest that starts {largest}: {chosen / largest:.1%}")
    assert chosen >= 0.9 * largest

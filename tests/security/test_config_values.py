"""Issue #33, "config values validated; profiles are names": each row of the issue's table, run as the real
`safe-llama plan` (a subprocess, its own HOME), now one line naming the file or variable, the key and what is
accepted, with a documented exit code, instead of an internal error (exit 70), a silent acceptance or a file
opened by its path. These need no second user: what a value may hold does not depend on who runs it (as root
the old code opened /etc/shadow, which is worse)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from safe_llama.errors import ExitStatus

ROOT = Path(__file__).resolve().parents[2]


def plan(home: Path, *, config: str = "", **env: str) -> tuple[int, str]:
    """`safe-llama plan server -c 4096` with config.toml holding `config` and the variables `env`: its exit
    status and its stderr."""
    folder = home / ".config" / "safe-llama"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.toml").write_text(config)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SAFE_LLAMA_", "XDG_"))}
    done = subprocess.run(
        [sys.executable, "-m", "safe_llama", "plan", "server", "-c", "4096"],
        env={**clean, "HOME": str(home), "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=home,
    )
    return done.returncode, done.stderr


def one_line(stderr: str, *words: str) -> None:
    """stderr is one line starting safe-llama:, holding each of words (the place, the key, what is accepted)."""
    assert stderr.count("\n") == 1 and stderr.startswith("safe-llama: "), stderr
    assert "internal error" not in stderr
    for word in words:
        assert word in stderr, (word, stderr)


CONFIG = "{home}/.config/safe-llama/config.toml: [planner] "


@pytest.mark.parametrize(
    ("toml", "key", "accepted"),
    [
        pytest.param("[planner.memory_margin_fraction]\ncpu = nan", "memory_margin_fraction.cpu: nan is not",
                     "a number from 0 to less than 1", id="margin-nan"),
        pytest.param("[planner.memory_margin_fraction]\ncpu = inf", "memory_margin_fraction.cpu: inf is not",
                     "a number from 0 to less than 1", id="margin-inf"),
        pytest.param("[planner.memory_margin_fraction]\ncpu = -10.0", "memory_margin_fraction.cpu: -10.0 is not",
                     "a number from 0 to less than 1", id="margin-negative"),
        pytest.param("[planner.memory_margin_fraction]\ncpu = 10.0", "memory_margin_fraction.cpu: 10.0 is not",
                     "a number from 0 to less than 1", id="margin-1000%"),
        pytest.param("[planner]\nctx_floor = -1", "ctx_floor: -1 is not",
                     "a whole number of tokens from 1 to 2,147,483,647", id="ctx-floor-negative"),
        pytest.param("[planner]\nctx_floor = 1e23", "ctx_floor: 1e+23 is not", "a whole number of tokens",
                     id="ctx-floor-float"),
        pytest.param("[planner]\nprompt_cache_charge = nan", "prompt_cache_charge: nan is not", "a number from 0 to 16",
                     id="charge-nan"),
        pytest.param("[planner]\nskip_llama_fit = \"false\"", 'skip_llama_fit: "false" is not', "true or false",
                     id="bool-as-text"),
        pytest.param("[planner.compute]\ngraph_inputs_bytes = -5", "compute.graph_inputs_bytes: -5 is not",
                     "a whole number of bytes from 0 to", id="compute-negative"),
        pytest.param("[planner.kv_split]\ncpu = \"sometimes\"", 'kv_split.cpu: "sometimes" is not',
                     '"never", "always" or { since = "X.Y.Z" }', id="kv-split-word"),
    ],
)  # fmt: skip
def test_a_planner_value_out_of_range_is_one_line_naming_file_and_key(
    tmp_path: Path, toml: str, key: str, accepted: str
) -> None:
    status, stderr = plan(tmp_path, config=toml)
    assert status == ExitStatus.BAD_CONFIG
    one_line(stderr, CONFIG.format(home=tmp_path) + key, accepted)


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        pytest.param("SAFE_LLAMA_LADDER", ",,,,", "SAFE_LLAMA_LADDER: ',,,,' names no step (steps separated by commas",
                     id="ladder-empty"),
        pytest.param("SAFE_LLAMA_PREDICT", "maybe", "SAFE_LLAMA_PREDICT: 'maybe' is not one of 1, true, yes, on, 0",
                     id="predict-maybe"),
        pytest.param("SAFE_LLAMA_MIN_CTX", "1" + "0" * 23, "SAFE_LLAMA_MIN_CTX: '1000", id="min-ctx-1e23"),
        pytest.param("SAFE_LLAMA_MIN_CTX", "1e23", "SAFE_LLAMA_MIN_CTX: '1e23' is not a whole number of tokens from 1",
                     id="min-ctx-exponent"),
        pytest.param("SAFE_LLAMA_HOST_MEMORY", "9" * 400, "SAFE_LLAMA_HOST_MEMORY: '9999", id="size-past-float"),
        pytest.param("SAFE_LLAMA_ATTEMPTS", "1000000",
                     "SAFE_LLAMA_ATTEMPTS: '1000000' is not a whole number from 1 to 100", id="attempts-huge"),
    ],
)  # fmt: skip
def test_a_launcher_variable_out_of_range_is_one_line_naming_it(
    tmp_path: Path, variable: str, value: str, said: str
) -> None:
    status, stderr = plan(tmp_path, **{variable: value})
    assert status == ExitStatus.USAGE
    one_line(stderr, said)


def test_min_ctx_1e23_in_the_config_file_is_refused(tmp_path: Path) -> None:
    status, stderr = plan(tmp_path, config="[launcher]\nmin_ctx = 100000000000000000000000\n")
    assert status == ExitStatus.USAGE
    one_line(stderr, f"{tmp_path}/.config/safe-llama/config.toml [launcher] min_ctx", "from 1 to 2,147,483,647")


@pytest.mark.parametrize(
    ("config", "env", "where"),
    [
        pytest.param('[launcher]\nprofile = "../../../../etc/passwd"\n', {},
                     "[launcher] profile: '../../../../etc/passwd'", id="config-dotdot"),
        pytest.param("", {"SAFE_LLAMA_PROFILE": "/etc/shadow"}, "SAFE_LLAMA_PROFILE: '/etc/shadow'", id="env-path"),
        pytest.param("", {"SAFE_LLAMA_PROFILE": ".."}, "SAFE_LLAMA_PROFILE: '..'", id="env-dotdot"),
        pytest.param("", {"SAFE_LLAMA_PROFILE": "nvidia-h200.toml"}, "SAFE_LLAMA_PROFILE: 'nvidia-h200.toml'",
                     id="env-file-name"),
    ],
)  # fmt: skip
def test_a_profile_is_a_name_never_a_path(tmp_path: Path, config: str, env: dict[str, str], where: str) -> None:
    status, stderr = plan(tmp_path, config=config, **env)
    assert status == ExitStatus.USAGE
    one_line(stderr, where, "is not a profile name (letters, digits, '.', '_', '-'; not a path")
    assert "Expected '='" not in stderr  # the file was not parsed


def test_a_profile_name_is_still_found(tmp_path: Path) -> None:
    status, stderr = plan(tmp_path, SAFE_LLAMA_PROFILE="nvidia-h200", SAFE_LLAMA_HOST_MEMORY="64G")
    assert status == 0, stderr


@pytest.mark.parametrize(
    ("folder", "said"),
    [
        pytest.param("/nonexistent", "SAFE_LLAMA_CONFIGS=/nonexistent: not a folder", id="missing"),
        pytest.param("{tmp}", "SAFE_LLAMA_CONFIGS={tmp}: lacks planner.toml, bundled-model.toml", id="empty"),
    ],
)
def test_safe_llama_configs_missing_or_lacking_a_file_is_one_line(tmp_path: Path, folder: str, said: str) -> None:
    empty = tmp_path / "configs"
    empty.mkdir()
    status, stderr = plan(tmp_path, SAFE_LLAMA_CONFIGS=folder.format(tmp=empty))
    assert status == ExitStatus.BAD_CONFIG
    one_line(stderr, said.format(tmp=empty))

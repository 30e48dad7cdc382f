"""safe-llama's own settings: the config file's tables and keys are checked, errors name the file and key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from safe_llama.cmdline import launch_args
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.paths import packaged_configs
from safe_llama.plan.policy import load_policy


def _config(tmp_path: Path, text: str) -> dict[str, str]:
    folder = tmp_path / "safe-llama"
    folder.mkdir(exist_ok=True)
    (folder / "config.toml").write_text(text)
    return {"XDG_CONFIG_HOME": str(tmp_path), "HOME": str(tmp_path)}


@pytest.mark.parametrize(
    ("text", "named"),
    [
        pytest.param('[launcher]\nmin_ctx = "abc"\n', "[launcher] min_ctx: 'abc' is not a whole number", id="min-ctx"),
        pytest.param("[launcher]\nattempts = 0\n", "[launcher] attempts: 0 is not a whole number", id="attempts-0"),
        pytest.param('[launcher]\nremember = "yes"\n', "[launcher] remember: 'yes' is not true or false", id="flag"),
        pytest.param('[launcher]\nshare = "half"\n', "[launcher] share: 'half' is not a number (e.g. 0.5)", id="share"),
        pytest.param("[launcher]\nmin_context = 4096\n", "[launcher] min_context: unknown key", id="unknown-key"),
        pytest.param("[launch]\nmin_ctx = 4096\n", "unknown table or key 'launch'", id="unknown-table"),
        pytest.param('launcher = "x"\n', "[launcher] must be a table", id="not-a-table"),
        pytest.param("[launcher\n", "Expected ']'", id="syntax"),
    ],
)
def test_bad_config_is_66_naming_file_and_key(tmp_path: Path, text: str, named: str) -> None:
    env = _config(tmp_path, text)
    with pytest.raises(SafeLlamaError) as caught:
        launch_args.resolve({}, env)
    assert caught.value.status == ExitStatus.BAD_CONFIG
    assert str(tmp_path / "safe-llama" / "config.toml") in caught.value.message
    assert named in caught.value.message
    assert "\n" not in caught.value.message


def test_good_config_is_read_under_options_and_variables(tmp_path: Path) -> None:
    env = _config(tmp_path, '[launcher]\nmin_ctx = 8192\nremember = false\nhost_memory = "2G"\nattempts = 3\n')
    expected = {"min_ctx": "8192", "remember": "false", "host_memory": "2G", "attempts": "3"}
    assert launch_args.resolve({}, env) == expected
    env["SAFE_LLAMA_MIN_CTX"] = "16384"
    assert launch_args.resolve({"attempts": "2"}, env)["min_ctx"] == "16384"
    assert launch_args.resolve({"attempts": "2"}, env)["attempts"] == "2"


def test_unknown_planner_key_names_the_users_file(tmp_path: Path) -> None:
    user = tmp_path / "config.toml"
    user.write_text("[planner]\nctx_flor = 8192\n")
    with pytest.raises(SafeLlamaError) as caught:
        load_policy(packaged_configs() / "planner.toml", user)
    assert caught.value.status == ExitStatus.BAD_CONFIG
    assert str(user) in caught.value.message and "ctx_flor: unknown key" in caught.value.message


def test_a_drop_in_with_a_bad_config_exits_66_before_anything_runs(tmp_path: Path) -> None:
    env = {**_config(tmp_path, '[launcher]\nmin_ctx = "abc"\n'), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from safe_llama.entry import main_server as m; sys.exit(m())", "-c", "1"],
        env=env, capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert done.returncode == 66
    assert done.stderr.count("\n") == 1 and "min_ctx" in done.stderr and "config.toml" in done.stderr

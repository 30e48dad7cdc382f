"""device.binaries: the real llama.cpp binary for a tool, from --llama-bin, SAFE_LLAMA_BIN_DIR, the config's
bin_dir, PATH, then the pinned build; never safe-llama's own console scripts. Fake executables in tmp_path."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from safe_llama.device.binaries import find_binary, locate_binary
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.paths import pinned_bin_dirs

SHIM = "#!/usr/bin/python3\nfrom safe_llama.entry import main_server\n"


def executable(path: Path, text: str = "#!/bin/sh\nexit 0\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """No PATH, and a cache and a system-wide install of their own (empty), so nothing real is found."""
    return {"PATH": "", "XDG_CACHE_HOME": str(tmp_path / "cache"), "SAFE_LLAMA_PREFIX": str(tmp_path / "prefix")}


def locate(tool: str, env: dict[str, str], **kw: Any) -> tuple[Path, str]:
    return locate_binary(tool, env=env, own=[], **kw)


def refused(tool: str, env: dict[str, str], **kw: Any) -> SafeLlamaError:
    with pytest.raises(SafeLlamaError) as err:
        locate(tool, env, **kw)
    assert "\n" not in err.value.message
    return err.value


def test_llama_bin_names_a_folder_or_the_binary(tmp_path: Path, env: dict[str, str]) -> None:
    server = executable(tmp_path / "build" / "llama-server")
    assert locate("server", env, explicit=str(tmp_path / "build")) == (server, "--llama-bin")
    assert locate("server", env, explicit=str(server)) == (server, "--llama-bin")


@pytest.mark.parametrize(
    ("tool", "name"),
    [
        ("cli", "llama-cli"),
        ("server", "llama-server"),
        ("completion", "llama-completion"),
        ("rpc-server", "ggml-rpc-server"),
    ],
)
def test_each_tool_has_its_binary(tool: str, name: str, tmp_path: Path, env: dict[str, str]) -> None:
    for each in ("llama-cli", "llama-server", "llama-completion", "ggml-rpc-server"):
        executable(tmp_path / "bin" / each)
    assert locate(tool, env, explicit=str(tmp_path / "bin"))[0].name == name


def test_the_search_order(tmp_path: Path, env: dict[str, str]) -> None:
    places = {where: executable(tmp_path / where / "llama-server") for where in ("given", "env", "config", "path")}
    env = {**env, "SAFE_LLAMA_BIN_DIR": str(tmp_path / "env"), "PATH": str(tmp_path / "path")}
    config = str(tmp_path / "config")
    assert locate("server", env, explicit=str(tmp_path / "given"), config_bin_dir=config) == (
        places["given"],
        "--llama-bin",
    )
    assert locate("server", env, config_bin_dir=config) == (places["env"], "SAFE_LLAMA_BIN_DIR")
    env.pop("SAFE_LLAMA_BIN_DIR")
    assert locate("server", env, config_bin_dir=config) == (places["config"], "config bin_dir")
    assert locate("server", env) == (places["path"], "PATH")


def test_find_binary_is_the_located_path(tmp_path: Path, env: dict[str, str]) -> None:
    server = executable(tmp_path / "path" / "llama-server")
    assert find_binary("server", env={**env, "PATH": str(tmp_path / "path")}, own=[]) == server


def test_a_wrong_explicit_choice_is_an_error_not_a_fallback(tmp_path: Path, env: dict[str, str]) -> None:
    executable(tmp_path / "path" / "llama-server")
    env = {**env, "PATH": str(tmp_path / "path")}
    err = refused("server", env, explicit=str(tmp_path / "nowhere"))
    assert err.status == ExitStatus.NOT_FOUND
    assert err.message == f"safe-llama: {tmp_path / 'nowhere'} (--llama-bin): no such file"
    err = refused("server", {**env, "SAFE_LLAMA_BIN_DIR": str(tmp_path / "empty")})
    assert err.status == ExitStatus.NOT_FOUND and "(SAFE_LLAMA_BIN_DIR): no such file" in err.message
    err = refused("server", env, config_bin_dir=str(tmp_path / "empty"))
    assert "(config bin_dir): no such file" in err.message


def test_a_binary_that_cannot_run(tmp_path: Path, env: dict[str, str]) -> None:
    plain = tmp_path / "plain" / "llama-server"
    plain.parent.mkdir()
    plain.write_text("#!/bin/sh\n")
    plain.chmod(0o644)
    err = refused("server", env, explicit=str(plain))
    assert err.status == ExitStatus.NOT_EXECUTABLE and err.message.endswith("(--llama-bin): not executable")
    (tmp_path / "odd" / "llama-server").mkdir(parents=True)  # a folder named like the binary
    err = refused("server", {**env, "SAFE_LLAMA_BIN_DIR": str(tmp_path / "odd")})
    assert err.status == ExitStatus.NOT_EXECUTABLE


def test_safe_llama_itself_is_refused_when_named(tmp_path: Path, env: dict[str, str]) -> None:
    shim = executable(tmp_path / "venv" / "llama-server", SHIM)
    err = refused("server", env, explicit=str(shim))
    assert err.status == ExitStatus.NOT_FOUND
    assert err.message == f"safe-llama: {shim} (--llama-bin) is safe-llama itself, not llama.cpp"
    real = executable(tmp_path / "real" / "llama-server")
    with pytest.raises(SafeLlamaError, match="is safe-llama itself"):
        locate_binary("server", env=env, explicit=str(real), own=[os.path.realpath(real)])


def test_safe_llama_itself_is_skipped_on_path(tmp_path: Path, env: dict[str, str]) -> None:
    executable(tmp_path / "venv" / "llama-server", SHIM)
    own = executable(tmp_path / "own" / "llama-server")
    real = executable(tmp_path / "real" / "llama-server")
    path = os.pathsep.join(["", str(tmp_path / "venv"), str(tmp_path / "own"), str(tmp_path / "real")])
    assert locate_binary("server", env={**env, "PATH": path}, own=[str(own)]) == (real, "PATH")


def test_the_pinned_build_after_path(tmp_path: Path, env: dict[str, str]) -> None:
    (user, user_dir), (system, system_dir) = pinned_bin_dirs("cpu", env)
    system_server = executable(system_dir / "llama-server")
    assert locate("server", env) == (system_server, f"the pinned build in {system}")
    user_server = executable(user_dir / "llama-server")
    assert locate("server", env) == (user_server, f"the pinned build in {user}")
    user_server.chmod(0o644)  # a pinned build that cannot run is passed over
    assert locate("server", env)[0] == system_server
    on_path = executable(tmp_path / "path" / "llama-server")
    assert locate("server", {**env, "PATH": str(tmp_path / "path")}) == (on_path, "PATH")


def test_nothing_anywhere_says_where_it_looked(env: dict[str, str]) -> None:
    err = refused("server", env)
    assert err.status == ExitStatus.NOT_FOUND
    assert err.message.startswith("safe-llama: llama-server not found (SAFE_LLAMA_BIN_DIR, PATH, ")
    assert all(str(folder) in err.message for _, folder in pinned_bin_dirs("cpu", env))
    assert "scripts/build-llama.sh" in err.message

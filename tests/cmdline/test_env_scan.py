"""Prefix scans and whole copies of the environment, plain and through a mapping that records them."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from safe_llama.cmdline import env_scan


class Told(Mapping[str, str]):
    def __init__(self, raw: dict[str, str]) -> None:
        self.raw = raw
        self.scans: list[tuple[str, ...]] = []
        self.wholes = 0

    def __getitem__(self, name: str) -> str:
        raise AssertionError("read by name")

    def __iter__(self) -> Iterator[str]:
        raise AssertionError("walked")

    def __len__(self) -> int:
        return len(self.raw)

    def prefixed(self, prefixes: tuple[str, ...]) -> dict[str, str]:
        self.scans.append(prefixes)
        return {k: v for k, v in self.raw.items() if k.startswith(prefixes)}

    def whole(self) -> dict[str, str]:
        self.wholes += 1
        return dict(self.raw)


def test_plain_mappings() -> None:
    env = {"GGML_A": "1", "HIP_B": "2", "HOME": "/"}
    assert env_scan.prefixed(env, ("GGML_", "HIP_")) == {"GGML_A": "1", "HIP_B": "2"}
    assert env_scan.whole(env) == env and env_scan.whole(env) is not env


def test_a_recording_mapping_is_told_which_read_it_is() -> None:
    told = Told({"GGML_A": "1", "HOME": "/"})
    assert env_scan.prefixed(told, ("GGML_",)) == {"GGML_A": "1"}
    assert env_scan.whole(told) == {"GGML_A": "1", "HOME": "/"}
    assert told.scans == [("GGML_",)] and told.wholes == 1

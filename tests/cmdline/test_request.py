"""Numbers read as llama.cpp reads them (std::stoi / std::stof), usage errors, and the memory options."""

from __future__ import annotations

import pytest

from safe_llama.cmdline.llama_args import parse, read_tensor_split, stof, stoi
from safe_llama.cmdline.memory_flags import EXPERT_REGEX, Override
from safe_llama.cmdline.request import Listen, listen_of, to_request


@pytest.mark.parametrize(
    ("text", "value"),
    [
        pytest.param("4096", 4096, id="plain"),
        pytest.param("0x1000", 0, id="hex-is-0-then-garbage"),
        pytest.param("08192", 8192, id="leading-zero-is-decimal"),
        pytest.param("4_096", 4, id="underscore-ends-the-number"),
        pytest.param(" \t+12k", 12, id="space-sign-suffix"),
        pytest.param("-1", -1, id="negative"),
        pytest.param("2147483647", 2**31 - 1, id="int-max"),
    ],
)
def test_stoi(text: str, value: int) -> None:
    assert stoi(text) == value


@pytest.mark.parametrize("text", ["", "abc", "+", "2147483648", "-2147483649", "\u00a012"])
def test_stoi_throws(text: str) -> None:
    with pytest.raises(ValueError):
        stoi(text)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        pytest.param("3", 3.0, id="int"),
        pytest.param("0.5x", 0.5, id="trailing"),
        pytest.param(".25", 0.25, id="leading-dot"),
        pytest.param("1e3", 1000.0, id="exponent"),
        pytest.param("0x1p3", 8.0, id="hex-float"),
        pytest.param("0x.8", 0.5, id="hex-fraction"),
        pytest.param("-INF", float("-inf"), id="inf"),
        pytest.param("3,1", 3.0, id="comma-ends"),
    ],
)
def test_stof(text: str, value: float) -> None:
    assert stof(text) == value


@pytest.mark.parametrize("text", ["", "x", "1e39", "1e-39", "-"])
def test_stof_throws(text: str) -> None:
    with pytest.raises(ValueError):
        stof(text)


def test_tensor_split_reads_runs_of_commas_and_slashes() -> None:
    assert read_tensor_split("3,/1") == (3.0, 1.0)


@pytest.mark.parametrize(
    ("argv", "n_ctx"),
    [
        pytest.param(["-c", "0x1000"], 0, id="hex-is-the-trained-context"),
        pytest.param(["-c", "08192"], 8192, id="octal-looking-is-decimal"),
        pytest.param(["-c", "4_096"], 4, id="underscore"),
    ],
)
def test_context_is_read_as_llama_cpp_reads_it(argv: list[str], n_ctx: int) -> None:
    cmd = parse("server", argv, {})
    assert cmd.usage_errors == ()
    assert to_request(cmd).kv.n_ctx == n_ctx


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        pytest.param(["-c", "abc"], {}, id="stoi-fails"),
        pytest.param(["-c"], {}, id="missing-value"),
        pytest.param(["--no-mmap"], {}, id="option-removed-in-the-pinned-source"),
        pytest.param(["-ngl", "lots"], {}, id="ngl-string-handler"),
        pytest.param(["-ts", "a,b"], {}, id="tensor-split-stof"),
        pytest.param(["-ctk", "Q8_0"], {}, id="cache-type-is-case-sensitive"),
        pytest.param(["-sm", "rows"], {}, id="split-mode-enum"),
        pytest.param([], {"LLAMA_ARG_CTX_SIZE": "big"}, id="env-twin-stoi"),
        pytest.param([], {"LLAMA_ARG_KV_OFFLOAD": "yes"}, id="env-bool-not-truthy-or-falsey"),
    ],
)
def test_usage_errors_are_llama_cpps(argv: list[str], env: dict[str, str]) -> None:
    cmd = parse("server", argv, env)
    assert cmd.usage_errors
    assert cmd.loads_no_model


@pytest.mark.parametrize("flag", ["--help", "-h", "--usage", "--version", "--list-devices", "--completion-bash"])
def test_no_model_invocations(flag: str) -> None:
    assert parse("server", ["-m", "/nonexistent", flag], {}).loads_no_model


def test_an_ordinary_command_line_loads_a_model() -> None:
    assert not parse("server", ["-m", "x.gguf", "-c", "4096", "-ngl", "99"], {}).loads_no_model


def test_memory_options() -> None:
    cmd = parse(
        "server",
        ["-nkvo", "-ot", r"blk\.1\.=CPU,output=CUDA1", "-cmoe", "-ncmoe", "2", "-ts", "3,1", "-sm", "row", "-mg", "1",
         "-dev", "CUDA0,CUDA1", "-cram", "1024", "-md", "d.gguf", "-ngld", "5", "-ctkd", "q8_0", "-lm", "none"],
        {},
    )  # fmt: skip
    req = to_request(cmd)
    layout = req.layout
    assert layout.kv_offload is False
    assert [(o.pattern, o.buffer_type) for o in layout.rules] == [
        (r"blk\.1\.", "CPU"),
        ("output", "CUDA1"),
        (EXPERT_REGEX, "CPU"),
        (rf"blk\.0{EXPERT_REGEX}", "CPU"),
        (rf"blk\.1{EXPERT_REGEX}", "CPU"),
    ]
    assert (layout.cpu_moe, layout.n_cpu_moe) == (True, 2)
    assert layout.tensor_split == (3.0, 1.0) and layout.split_mode == "row" and layout.main_gpu == 1
    assert layout.devices == ("CUDA0", "CUDA1")
    assert (layout.cache_ram_mib, layout.cache_ram_set, layout.load_mode) == (1024, True, "none")
    assert req.draft is not None
    options = req.draft.options
    assert (req.draft.model, options.n_gpu_layers, options.type_k, options.type_v) == ("d.gguf", 5, "q8_0", "f16")


def test_prompt_cache_defaults_to_8192_mib_for_the_server_only() -> None:
    assert to_request(parse("server", [], {})).layout.cache_ram_mib == 8192
    assert to_request(parse("completion", ["-cram", "64"], {})).layout.cache_ram_mib == 0


def test_env_twins_count() -> None:
    layout = to_request(parse("server", [], {"LLAMA_ARG_N_CPU_MOE": "1", "LLAMA_ARG_KV_OFFLOAD": "0"})).layout
    assert layout.kv_offload is False
    assert layout.rules == (Override(rf"blk\.0{EXPERT_REGEX}", "CPU"),)


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        pytest.param([], {}, Listen("127.0.0.1", 8080, "", tls=False), id="defaults"),
        pytest.param(["--port", "0"], {}, Listen(port=0), id="port-0-kept"),
        pytest.param([], {"LLAMA_ARG_HOST": "0.0.0.0", "LLAMA_ARG_PORT": "7000"}, Listen("0.0.0.0", 7000), id="env"),  # noqa: S104
        pytest.param(["--port", "9000"], {"LLAMA_ARG_PORT": "7000"}, Listen(port=9000), id="flag-beats-env"),
        pytest.param(["--port", "1", "--port", "2"], {}, Listen(port=2), id="last-flag-wins"),
        pytest.param(["--port", "80x"], {}, Listen(port=80), id="std-stoi"),
        pytest.param(["--port", "x"], {}, Listen(port=8080), id="refused-port-reads-as-default"),
        pytest.param(["--host", "/run/s.sock"], {}, Listen(host="/run/s.sock"), id="unix-socket-as-given"),
        pytest.param([], {"LLAMA_ARG_API_PREFIX": "/v1"}, Listen(api_prefix="/v1"), id="prefix-from-env"),
        pytest.param(["--ssl-key-file", "k", "--ssl-cert-file", "c"], {}, Listen(tls=True), id="tls"),
        pytest.param(["--ssl-cert-file", "c"], {}, Listen(tls=False), id="tls-needs-a-key-too"),
    ],
)
def test_listen_of(argv: list[str], env: dict[str, str], expected: Listen) -> None:
    assert listen_of(parse("server", argv, env)) == expected

from __future__ import annotations

from dataclasses import fields, replace

import pytest

from safe_llama.cmdline.llama_args import arg_table, parse, rewrite
from safe_llama.cmdline.memory_flags import (
    BY_FIELD,
    DRAFT_FLAGS,
    EXPERT_REGEX,
    FLAGS,
    DraftOptions,
    Layout,
    LlamaSettings,
    Override,
    argv_changes,
    changes_of,
    draft_options,
    kv_request,
    layout,
    setting,
)
from safe_llama.errors import SafeLlamaError
from safe_llama.model.kv import KvRequest


def test_each_row_names_a_canonical_option_and_one_field() -> None:
    keys = {spec.key for spec in arg_table("server").specs}
    assert [f.option for f in FLAGS if f.option not in keys] == []
    assert len(BY_FIELD) == len(FLAGS) == len({f.option for f in FLAGS})  # one row per option, per field
    homes = [{f.name for f in fields(cls)} for cls in (KvRequest, LlamaSettings, Layout)]
    for flag in FLAGS:
        assert sum(flag.field in names for names in homes) == 1, flag.field
        assert flag.given_field is None or flag.given_field in homes[2]


def test_each_draft_row_names_a_canonical_option_and_fills_all_of_draft_options() -> None:
    keys = {spec.key for spec in arg_table("server").specs}
    assert [f.option for f in DRAFT_FLAGS if f.option not in keys] == []
    assert sorted(f.field for f in DRAFT_FLAGS) == sorted(f.name for f in fields(DraftOptions))
    assert all(f.write is None for f in DRAFT_FLAGS)  # the plan never writes a draft option


def test_the_draft_options_read_as_llama_cpp_reads_them() -> None:
    argv = ["-md", "d.gguf", "-ngld", "all", "-ctkd", "q8_0", "-otd", "exps=CPU", "-ncmoed", "1", "-cmoed"]
    options = draft_options(parse("server", argv, {}))
    assert (options.n_gpu_layers, options.type_k, options.type_v) == (None, "q8_0", "f16")
    assert options.rules == (
        Override("exps", "CPU"),
        Override(EXPERT_REGEX, "CPU"),
        Override(rf"blk\.0{EXPERT_REGEX}", "CPU"),
    )


CHOSEN = LlamaSettings(
    kv=KvRequest(tool="server", n_ctx=8192, n_parallel=1, type_k="q8_0", type_v="q4_0", flash_attn="on", fit=False),
    n_gpu_layers=17,
    layout=Layout(n_cpu_moe=3, tensor_split=(3.0, 5.0), cache_ram_mib=512, ctx_checkpoints=4),
)
WRITTEN = [f.field for f in FLAGS if f.write is not None]


def test_what_the_plan_writes_reads_back_as_the_settings_value() -> None:
    argv = rewrite(parse("server", [], {}), argv_changes(CHOSEN, WRITTEN))
    cmd = parse("server", argv, {})
    read = {"kv": kv_request(cmd), "layout": layout(cmd)}
    for name in WRITTEN:
        flag = BY_FIELD[name]
        holder = read["kv"] if name in {f.name for f in fields(KvRequest)} else read["layout"]
        value = getattr(holder, name) if hasattr(holder, name) else flag.read(cmd, flag)
        assert value == setting(CHOSEN, name), name


def test_changes_keep_the_order_decided_and_the_settings_values() -> None:
    assert argv_changes(CHOSEN, ("n_gpu_layers", "fit", "n_ctx", "tensor_split")) == {
        "--gpu-layers": "17", "--fit": "off", "--ctx-size": "8192", "--tensor-split": "3,5",
    }  # fmt: skip
    assert argv_changes(replace(CHOSEN, layout=Layout(tensor_split=(0.5, 1.0))), ("tensor_split",)) == {
        "--tensor-split": "0.5,1"
    }


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["-c", "x"], "safe-llama: -c: 'x' is not a whole number", id="stoi"),
        pytest.param(["-c", "-5"], "safe-llama: -c: -5 is negative", id="negative-ctx"),
        pytest.param(["-fa", "maybe"], "safe-llama: -fa: 'maybe' is not on, off or auto", id="fa"),
    ],
)
def test_values_llama_cpp_refuses_are_usage_errors(argv: list[str], message: str) -> None:
    with pytest.raises(SafeLlamaError) as err:
        kv_request(parse("server", argv, {}))
    assert err.value.message == message


def test_a_value_from_the_environment_says_where_it_came_from() -> None:
    with pytest.raises(SafeLlamaError) as err:
        layout(parse("server", [], {"LLAMA_ARG_MAIN_GPU": "one"}))
    assert err.value.message == "safe-llama: -mg (from LLAMA_ARG_MAIN_GPU): 'one' is not a whole number"


def test_a_remedys_changes_are_written_as_the_rows_write_them() -> None:
    assert changes_of({"type_k": "q8_0", "flash_attn": "on", "n_ctx": 4096}) == {
        "--cache-type-k": "q8_0",
        "--flash-attn": "on",
        "--ctx-size": "4096",
    }

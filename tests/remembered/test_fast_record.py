"""Launch records: what a launch reads while it plans is all in its record, a change to any of it refuses the
record, nothing secret is stored, and the least budget is the planner's own threshold.

Every environment variable the plan reads is in the record by construction: the planning path takes the
environment only as an argument (the launch passes the recording mapping), which
test_the_planning_path_takes_the_environment_as_an_argument holds for every module of it.

The launch runs for real in-process (options, binary lookup, probes of the real pinned llama.cpp, the
planner) up to attempt 1's spawn, where supervise.supervise_child is replaced by a stand-in that reports the start
ready: what is tested here is the planning window, not the child (test_early.py starts real children).
"""

from __future__ import annotations

import ast
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from safe_llama.attempts import launch
from safe_llama.device import vendor_free
from safe_llama.process import supervise
from safe_llama.process.startup import Outcome
from safe_llama.remembered import early, fast_record
from tests import ROOT
from tests.tiny_gguf import LLAMA_3B, write_metadata_gguf

ARGS = ["-c", "4096", "-n", "1", "-p", "hi", "-no-cnv"]
# the packages and modules that plan: they may read the environment only through the mapping they are given
PLANNING_PATH = ("model", "cmdline", "device", "plan", "diagnosis", "pipeline", "paths.py", "state.py", "constants.py")

_audit_on: list[list[tuple[str, str]]] = []  # the list the hook appends to while a test listens
_hook_installed: list[bool] = []


def _test_audit(event: str, args: tuple[Any, ...]) -> None:
    if _audit_on and event in ("open", "os.listdir", "os.scandir") and args:
        where = args[0]
        if isinstance(where, (str, bytes, os.PathLike)):
            _audit_on[0].append((event, os.path.abspath(os.fsdecode(where))))


class Setup:
    def __init__(self, tmp_path: Path, llama_bin: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tmp = tmp_path
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        shutil.copy2(llama_bin / "llama-completion", self.bin / "llama-completion")
        self.model = write_metadata_gguf(tmp_path / "Llama-3.2-3B-Instruct-Q4_K_M.gguf", "llama", LLAMA_3B)
        self.config = tmp_path / "config"
        for name in [k for k in os.environ if k.startswith(("LLAMA_ARG_", "SAFE_LLAMA_", "GGML_"))]:
            monkeypatch.delenv(name)
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
        monkeypatch.setenv("XDG_CONFIG_HOME", str(self.config))
        monkeypatch.setenv("SAFE_LLAMA_BIN_DIR", str(self.bin))
        monkeypatch.chdir(tmp_path)
        self.monkeypatch = monkeypatch
        self.spawned: list[tuple[list[str], dict[str, str]]] = []
        self.opened: list[tuple[str, str]] = []

    @property
    def args(self) -> list[str]:
        return ["-m", str(self.model), *ARGS]

    @property
    def door_args(self) -> list[str]:
        return ["completion", *self.args]

    def launch(self, args: list[str] | None = None, *, watch: bool = False) -> int:
        """run_launch() up to attempt 1's spawn, which is reported ready (the record is written then)."""
        args = self.args if args is None else args
        opened: list[tuple[str, str]] = []

        def stand_in(argv: Any, env: Any, *, watcher: Any, probe: Any = None, **_: Any) -> Outcome:
            _audit_on.clear()  # the window ends where attempt 1 starts
            self.spawned.append(([str(a) for a in argv], dict(env)))
            watcher.ready()
            return Outcome(0, 0, True, None, False, None, (), 0, False)

        self.monkeypatch.setattr(supervise, "supervise_child", stand_in)
        if watch:
            if not _hook_installed:
                sys.addaudithook(_test_audit)
                _hook_installed.append(True)
            _audit_on[:] = [opened]
        try:
            code = launch.run_launch("completion", list(args), {}, door=("safe-llama", ["completion", *args]))
        finally:
            _audit_on.clear()
        self.opened = opened
        return code

    def record_file(self, door_args: list[str] | None = None) -> Path:
        door_args = self.door_args if door_args is None else door_args
        hidden = fast_record.secret_options()
        return Path(early.record_path(os.environ, early.key("safe-llama", door_args, os.getcwd(), hidden)))

    def record(self) -> dict[str, Any]:
        loaded = early.load(str(self.record_file()))
        assert loaded is not None
        return loaded

    def valid(self) -> bool:
        return early.still_valid(self.record(), os.environ)


@pytest.fixture
def setup(tmp_path: Path, llama_bin: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Setup]:
    yield Setup(tmp_path, llama_bin, monkeypatch)


def test_the_record_covers_every_file_opened(setup: Setup) -> None:
    """An independent audit hook watched: a future planner input (a file read around the recorder) shows up
    here as not covered."""
    assert setup.launch(watch=True) == 0
    record = setup.record()
    by_identity = {path for path, _ in record["files"]}
    by_content = {path for path, _ in record["contents"]}
    missed = [
        (event, path)
        for event, path in setup.opened
        if not path.endswith((".py", ".pyc"))
        and path not in by_identity
        and path not in by_content
        and not (path in early.VOLATILE or os.path.basename(path) in early.VOLATILE)
    ]
    assert setup.opened and not missed
    assert str(setup.model) in by_identity and str(setup.bin / "llama-completion") in by_identity
    assert record["host"] is not None  # the RAM rule applies (no cgroup or address-space limit here)
    names = {name for name, _ in record["env"]}
    assert {"SAFE_LLAMA_BIN_DIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "LLAMA_ARG_CTX_SIZE"} <= names
    assert early.still_valid(record, os.environ)


def _reads_the_process_environment(tree: ast.AST) -> list[tuple[int, str]]:
    """Where a module reads os.environ or os.getenv (a default of os.environ included), outside an
    `if __name__ == "__main__":` block (a module run as its own process: there the environment is its input)."""
    found: list[tuple[int, int, str]] = []
    main_blocks = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test).replace("'", '"') == '__name__ == "__main__"'
    ]
    skipped = {id(inner) for block in main_blocks for inner in ast.walk(block)}
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "environb", "getenv", "getenvb"):
            found.append((node.lineno, node.col_offset, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            names = [a.name for a in node.names if a.name.startswith(("environ", "getenv"))]
            found += [(node.lineno, node.col_offset, f"from os import {name}") for name in names]
    return [(line, text) for line, _, text in sorted(found)]


def test_the_planning_path_takes_the_environment_as_an_argument() -> None:
    """No module that plans reads the process's environment (nor defaults a parameter to it): the shell
    (entry, cli, commands, run) hands it in, and a launch hands in the recording mapping, so a launch record
    holds every variable the plan read, by construction."""
    package = ROOT / "safe_llama"
    modules = [
        p
        for part in PLANNING_PATH
        for p in ([package / part] if part.endswith(".py") else (package / part).rglob("*.py"))
    ]
    assert len(modules) > 40
    reads = {
        str(path.relative_to(ROOT)): found
        for path in modules
        if (found := _reads_the_process_environment(ast.parse(path.read_text())))
    }
    assert reads == {}


def test_the_scan_finds_each_way_of_reading_the_environment() -> None:
    code = """
import os
from os import getenv
def f(env=os.environ): return os.getenv("A"), os.environ.get("B")
if __name__ == "__main__":
    f(os.environ)
"""
    found = [text for _, text in _reads_the_process_environment(ast.parse(code))]
    assert found == ["from os import getenv", "os.environ", "os.getenv", "os.environ"]


def test_the_model_touched_refuses_the_record(setup: Setup) -> None:
    setup.launch()
    assert setup.valid()
    os.utime(setup.model, ns=(1, 1))
    assert not setup.valid()


def test_the_binary_replaced_refuses_the_record(setup: Setup) -> None:
    setup.launch()
    assert setup.valid()
    binary = setup.bin / "llama-completion"
    data = binary.read_bytes()
    binary.unlink()
    binary.write_bytes(data)
    binary.chmod(0o755)
    assert not setup.valid()


def test_a_config_file_created_or_changed_refuses_the_record(setup: Setup) -> None:
    setup.launch()
    assert setup.valid()
    config = setup.config / "safe-llama" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text("[launcher]\nmin_ctx = 512\n")
    assert not setup.valid()
    setup.launch()
    assert setup.valid()  # a record made under it
    config.write_text("[launcher]\nmin_ctx = 1024\n")
    assert not setup.valid()


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("LLAMA_ARG_CTX_SIZE", id="llama.cpp's twin of an option"),
        pytest.param("SAFE_LLAMA_LADDER", id="safe-llama's own setting"),
        pytest.param("MALLOC_ARENA_MAX", id="a variable the planner reads"),
        pytest.param("GGML_VK_VISIBLE_DEVICES", id="a backend variable (a prefix the probe scans)"),
    ],
)
def test_an_input_variable_set_refuses_the_record(setup: Setup, name: str) -> None:
    setup.launch()
    assert setup.valid()
    setup.monkeypatch.setenv(name, "2")
    assert not setup.valid()
    setup.monkeypatch.delenv(name)
    assert setup.valid()
    setup.monkeypatch.setenv("SOME_UNRELATED_VARIABLE", "1")
    assert setup.valid()


def test_a_budget_below_the_plan_s_need_refuses_the_record(setup: Setup) -> None:
    setup.launch()
    record = setup.record()
    total, least = record["host"]
    memory = early.meminfo()
    assert memory is not None and memory[0] == total and least <= memory[1]
    setup.monkeypatch.setattr(early, "meminfo", lambda: (total, least))
    assert setup.valid()
    setup.monkeypatch.setattr(early, "meminfo", lambda: (total, least - 1))
    assert not setup.valid()
    setup.monkeypatch.setattr(early, "meminfo", lambda: (total + 4096, least))
    assert not setup.valid()  # another machine's memory
    setup.monkeypatch.setattr(early, "meminfo", lambda: (total, least))
    setup.monkeypatch.setattr(early, "address_space_unlimited", lambda: False)
    assert not setup.valid()


def test_the_least_budget_is_the_planner_s_own_threshold(setup: Setup) -> None:
    """Planning under exactly the recorded least budget gives the recorded plan; a byte less does not."""
    from safe_llama.cmdline import launch_args
    from safe_llama.pipeline.options import launch_options
    from safe_llama.pipeline.prepare import final_argv, prepare, replan

    setup.launch()
    least = setup.record()["host"][1]
    options = launch_options(*launch_args.resolve_sourced({}, os.environ)).plan
    prepared = prepare("completion", setup.args, os.environ, options)
    at_least = replan(fast_record._under(prepared, "ram", least), options, prepared.target.lessons, os.environ)
    below = replan(fast_record._under(prepared, "ram", least - 1), options, prepared.target.lessons, os.environ)
    assert final_argv(at_least) == final_argv(prepared)
    assert below.plan is None or final_argv(below) != final_argv(prepared)


def test_a_plan_sized_by_the_budget_is_not_recorded(setup: Setup) -> None:
    """No -c and 1 GiB available: the context is the largest that fits, so the plan moves with MemAvailable."""
    from safe_llama.device import probe_host

    memory = early.meminfo()
    assert memory is not None
    setup.monkeypatch.setattr(probe_host, "read_meminfo", lambda *_: (memory[0], 1 << 30))
    args = ["-m", str(setup.model), "-n", "1", "-p", "hi", "-no-cnv"]
    assert setup.launch(args) == 0
    assert "-c" in setup.spawned[-1][0]  # the plan cut the context to fit
    assert not setup.record_file(["completion", *args]).exists()
    assert setup.launch() == 0  # the same budget, an explicit context that fits: recorded
    assert setup.record_file().exists()


def test_a_declared_budget_is_recorded_without_the_ram_rule(setup: Setup) -> None:
    setup.launch(["-m", str(setup.model), *ARGS])
    assert setup.record()["host"] is not None
    door = ["--host-memory", "64G", "completion", *setup.args]
    launch.run_launch("completion", setup.args, {"host_memory": "64G"}, door=("safe-llama", door))
    declared = early.load(str(setup.record_file(door)))
    assert declared is not None and declared["host"] is None


def test_secrets_are_never_stored(setup: Setup) -> None:
    """The argv holds positions of the user's words, never their text; a literal holding a secret stops it."""
    secret = "argv-secret-3"  # noqa: S105 -- a test value whose absence is checked
    setup.monkeypatch.setenv("HF_TOKEN", "env-secret-2")
    setup.monkeypatch.setenv("LLAMA_API_KEY", "env-secret-1")
    args = [*setup.args, "--api-key", secret]
    setup.launch(args)
    path = setup.record_file(["completion", *args])
    raw = path.read_bytes()
    assert secret.encode() not in raw and b"env-secret-2" not in raw and b"env-secret-1" not in raw
    record = early.load(str(path))
    assert record is not None
    # a secret variable the planner looked at is held as set or not, not even as a digest of its value
    assert ("HF_TOKEN", True) in record["env_present"]
    assert "HF_TOKEN" not in {name for name, _ in record["env"]}
    assert early.still_valid(record, os.environ)
    setup.monkeypatch.setenv("HF_TOKEN", "another token")
    assert early.still_valid(record, os.environ)
    setup.monkeypatch.delenv("HF_TOKEN")
    assert not early.still_valid(record, os.environ)
    assert all(isinstance(word, int) for word in record["argv"] if word in args)
    stored = [w for w in record["argv"] if isinstance(w, str)]
    assert stored == ["-fit", "off"]


def test_a_literal_holding_a_secret_stops_the_record(setup: Setup, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan that would write a secret's text into its own words (as a literal): no record."""
    from safe_llama.pipeline import prepare

    secret = "argv-secret-4"  # noqa: S105 -- a test value whose absence is checked
    real = prepare.final_argv
    monkeypatch.setattr(prepare, "final_argv", lambda p: [*real(p), f"--note={secret}"])
    args = [*setup.args, "--api-key", secret]
    setup.launch(args)
    assert not setup.record_file(["completion", *args]).exists()
    assert not any(secret.encode() in p.read_bytes() for p in (setup.tmp / "cache").rglob("*") if p.is_file())


def test_no_record_without_remembering(setup: Setup) -> None:
    setup.monkeypatch.setenv("SAFE_LLAMA_REMEMBER", "0")
    setup.launch()
    assert not setup.record_file().exists()


def test_a_stray_line_on_stderr_stops_the_record(setup: Setup, monkeypatch: pytest.MonkeyPatch) -> None:
    from safe_llama.pipeline import prepare

    real = prepare.prepare

    def noisy(*a: Any, **k: Any) -> Any:
        sys.stderr.write("safe-llama: warning: ignoring corrupt cache file\n")
        return real(*a, **k)

    monkeypatch.setattr(prepare, "prepare", noisy)
    setup.launch()
    assert not setup.record_file().exists()


def test_a_record_that_cannot_be_built_never_fails_the_launch(setup: Setup, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: Any, **__: Any) -> None:
        raise RuntimeError("a bug in the record")

    monkeypatch.setattr(fast_record, "build", broken)
    assert setup.launch() == 0
    assert not setup.record_file().exists()


def test_a_record_s_name_masks_secret_values() -> None:
    """The file name hashes the words with every secret value masked: no digest of a key names a file, and
    launches that differ only in a key share the record (the key itself comes from the words, by position)."""
    hidden = fast_record.secret_options()
    assert {"--api-key", "--api_key", "-hft", "--hf-token"} & hidden == {"--api-key", "-hft", "--hf-token"}
    one = early.key("safe-llama", ["server", "-m", "x", "--api-key", "k1"], "/", hidden)
    two = early.key("safe-llama", ["server", "-m", "x", "--api-key", "k2"], "/", hidden)
    assert one == two != early.key("safe-llama", ["server", "-m", "y", "--api-key", "k1"], "/", hidden)
    assert early.key("safe-llama", ["server", "--hf_token=a"], "/", hidden) == early.key(
        "safe-llama", ["server", "--hf_token=b"], "/", hidden
    )
    assert early.key("safe-llama", ["server", "--api-key", "k1"], "/") != early.key(
        "safe-llama", ["server", "--api-key", "k2"], "/"
    )


def _on_a_gpu(setup: Setup, free: int) -> Any:
    """This launch's real plan, as if its device were a GPU read through NVML with `free` bytes free (a stand-in:
    no GPU here; the rule's arithmetic and the record's check are what is tested)."""
    from dataclasses import replace

    from safe_llama.cmdline import launch_args
    from safe_llama.device.limits import Sourced
    from safe_llama.device.probe_free import FreeReading
    from safe_llama.pipeline.options import launch_options
    from safe_llama.pipeline.prepare import prepare

    options = launch_options(*launch_args.resolve_sourced({}, os.environ)).plan
    prepared = prepare("completion", setup.args, os.environ, options)
    assert prepared.device is not None
    reading = FreeReading("nvml", 0, "NVIDIA H200", "0000:00:06.0", "GPU-1234", 150_000_000_000, free)
    target = replace(
        prepared.target,
        backend="cuda",
        device_memory=Sourced(150_000_000_000, "probed", "NVML"),
        device_free=Sourced(free, "probed", "free now (nvml)"),
    )
    return replace(prepared, target=target, device=replace(prepared.device, free_reading=reading))


def test_a_gpu_plan_s_rule_is_its_vendor_reading_within_the_plan_s_margin(setup: Setup) -> None:
    """The margin is the policy's fraction (configs/planner.toml, cuda) of what the plan could use there."""
    from safe_llama.paths import config_dir, configs_dir
    from safe_llama.plan.policy import load_policy

    prepared = _on_a_gpu(setup, 60 << 30)
    rule = fast_record.device_rule(prepared, os.environ)
    policy = load_policy(configs_dir(os.environ) / "planner.toml", config_dir(os.environ) / "config.toml")
    fraction = policy.per_backend(policy.memory_margin_fraction, "cuda")
    budget = prepared.target.device_budget
    assert budget is not None and budget.value <= 60 << 30
    assert rule == ("nvml", "GPU-1234", 60 << 30, int(budget.value * fraction))
    assert rule is not None and rule[3] > 0


def test_a_gpu_free_figure_that_is_no_vendor_reading_is_not_recorded(setup: Setup) -> None:
    from dataclasses import replace

    prepared = _on_a_gpu(setup, 60 << 30)
    assert prepared.device is not None
    assert fast_record.device_rule(replace(prepared, device=replace(prepared.device, free_reading=None)), {}) is None


def test_a_gpu_record_holds_while_its_free_memory_is_within_the_margin(setup: Setup) -> None:
    """A real record with a GPU rule put in (the early start reads the GPU through device_reading)."""
    setup.launch()
    record = setup.record()
    record["device"] = ("nvml", "GPU-1234", 60 << 30, 1 << 30)
    for free, valid in [(60 << 30, True), ((60 << 30) - (1 << 30), True), ((61 << 30) + 1, False),
                        ((59 << 30) - 1, False), (None, False)]:  # fmt: skip
        setup.monkeypatch.setattr(early, "device_reading", lambda device, free=free: vendor_free.Reading(free))
        assert early.still_valid(record, os.environ) is valid, free


def test_a_gpu_reading_begins_before_the_other_rules_and_is_dropped_when_one_fails(setup: Setup) -> None:
    """NVML's forked read (tens of ms on the H200) runs while the record's files, contents and environment are
    checked; a rule that fails drops it unanswered."""
    setup.launch()
    record = setup.record()
    record["device"] = ("nvml", "GPU-1234", 60 << 30, 1 << 30)
    calls: list[str] = []

    class Traced(vendor_free.Reading):
        def result(self) -> int | None:
            calls.append("result")
            return super().result()

        def cancel(self) -> None:
            calls.append("cancel")
            super().cancel()

    def begun(device: object) -> vendor_free.Reading:
        calls.append("begin")
        return Traced(60 << 30)

    checked = early.identity

    def identity(path: str) -> tuple[int, int, int, int] | None:
        calls.append("files")
        return checked(path)

    setup.monkeypatch.setattr(early, "device_reading", begun)
    setup.monkeypatch.setattr(early, "identity", identity)
    assert early.still_valid(record, os.environ)
    assert calls[0] == "begin" and calls.index("files") < calls.index("result")
    calls.clear()
    record["env"] = [("SAFE_LLAMA_TEST_UNSET", "a digest no value has")]
    assert not early.still_valid(record, os.environ)
    assert calls[0] == "begin" and calls[-1] == "cancel" and "result" not in calls


def test_a_record_holds_only_beside_the_launches_it_was_planned_beside(setup: Setup) -> None:
    setup.launch()
    record = setup.record()
    assert record["others"] == "" and record["device"] is None and early.still_valid(record, os.environ)
    setup.monkeypatch.setattr(early, "other_launches", lambda env: "a server started since")
    assert not early.still_valid(record, os.environ)
    assert early.others_unchanged(record, "") and not early.others_unchanged(record, "a server started since")


def test_a_cgroup_s_headroom_is_held_as_ram_is(setup: Setup) -> None:
    """A plan made under a cgroup limit (a stand-in: no cgroup limits this machine) is recorded with the least
    headroom that gives it, and holds while the cgroup's headroom is at least that."""
    from safe_llama.device import probe_host

    usage = [1 << 30]

    def cgroup(**_: Any) -> tuple[probe_host.CgroupMemory, str]:
        return probe_host.CgroupMemory(2, "/fake", 64 << 30, usage[0], 0, "/fake"), "a stand-in cgroup v2"

    setup.monkeypatch.setattr(probe_host, "read_cgroup_memory", cgroup)
    assert setup.launch() == 0
    least = setup.record()["cgroup"]
    assert isinstance(least, int) and 0 < least < 63 << 30
    assert setup.valid()
    usage[0] = (64 << 30) - least
    assert setup.valid()
    usage[0] += 1
    assert not setup.valid()


def test_a_server_under_a_cgroup_is_recorded_where_its_serving_sizes_are_llama_cpp_s(
    setup: Setup, llama_bin: Path
) -> None:
    """llama-server's prompt cache is sized to what the cgroup leaves (plan/serving.py): the least headroom is
    where it is llama.cpp's default again; a byte less changes the launch (a stand-in cgroup, as above)."""
    from safe_llama.cmdline import launch_args
    from safe_llama.device import probe_host
    from safe_llama.pipeline.options import launch_options
    from safe_llama.pipeline.prepare import final_argv, prepare, replan

    def cgroup(**_: Any) -> tuple[probe_host.CgroupMemory, str]:
        return probe_host.CgroupMemory(2, "/fake", 64 << 30, 1 << 30, 0, "/fake"), "a stand-in cgroup v2"

    setup.monkeypatch.setattr(probe_host, "read_cgroup_memory", cgroup)
    shutil.copy2(llama_bin / "llama-server", setup.bin / "llama-server")
    options = launch_options(*launch_args.resolve_sourced({}, os.environ)).plan
    prepared = prepare("server", ["-m", str(setup.model), "-c", "4096"], os.environ, options)
    assert prepared.plan is not None and "serving" in [step.name for step in prepared.plan.steps]
    least = fast_record.least_budgets(prepared, options, os.environ)
    assert least is not None and set(least) == {"ram", "cgroup"}
    at = replan(fast_record._under(prepared, "cgroup", least["cgroup"]), options, prepared.target.lessons, os.environ)
    below = replan(
        fast_record._under(prepared, "cgroup", least["cgroup"] - 1), options, prepared.target.lessons, os.environ
    )
    assert final_argv(at) == final_argv(prepared) != final_argv(below)


def test_safe_llamas_folders_are_held_by_what_they_list(setup: Setup, tmp_path: Path) -> None:
    """A fresh checkout makes __pycache__ folders as modules are first imported (a record made by the first start
    was refused by every start after it, on the H200): a folder is held by its listing, less __pycache__, so a new
    module still refuses the record and a new __pycache__ does not."""
    setup.launch()
    package = str(Path(fast_record.__file__).resolve().parent)
    record = setup.record()
    assert package in {path for path, _ in record["contents"]}
    assert package not in {path for path, _ in record["files"]}
    folder = tmp_path / "pkg"
    folder.mkdir()
    (folder / "a.py").write_text("")
    before = early.content(str(folder), b"salt")
    (folder / "__pycache__").mkdir()
    assert early.content(str(folder), b"salt") == before
    (folder / "b.py").write_text("")
    assert early.content(str(folder), b"salt") != before

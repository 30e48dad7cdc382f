"""Each llama.cpp memory option declared once: its canonical name (as configs/llama-args.json names it), the
settings field it fills, how its value is read (as llama.cpp reads it: std::stoi, a cache type, on/off) and how a
value the plan chooses is written back to argv; and the settings those fields make up (LlamaSettings: the KV
request, the GPU layers, the Layout of where things live).

Owns that table and the settings' shape; must not size anything (plan.memory) nor choose a value (the planner).
Pure: values in, values out."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields

from safe_llama.cmdline.llama_args import CommandLine, read_gpu_layers, read_tensor_split, stoi
from safe_llama.errors import ExitStatus, SafeLlamaError
from safe_llama.model.cache_types import CACHE_TYPES
from safe_llama.model.facts import ModelFacts
from safe_llama.model.kv import DEFAULT_N_BATCH, DEFAULT_N_UBATCH, KvRequest

DEFAULT_CACHE_RAM_MIB = 8192  # common.h cache_ram_mib: llama-server's prompt cache, host RAM
DEFAULT_CTX_CHECKPOINTS = 32  # common.h n_ctx_checkpoints: per slot, host RAM
EXPERT_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"  # LLM_FFN_EXPS_REGEX (common/common.h)


@dataclass(frozen=True)
class Override:
    """A tensor-placement rule (-ot, -cmoe, -ncmoe): the first whose pattern matches a name wins."""

    pattern: str  # a std::regex_search pattern
    buffer_type: str  # "CPU" (or CPU_*): host RAM; otherwise a device's buffer type (CUDA0, ...)

    @property
    def to_host(self) -> bool:
        return self.buffer_type.upper().startswith("CPU")


def expert_rules(cpu_moe: bool, n_cpu_moe: int) -> tuple[Override, ...]:
    """-cmoe (every layer's experts) then -ncmoe N (the first N layers'), to host RAM, in llama.cpp's order."""
    every = (Override(EXPERT_REGEX, "CPU"),) if cpu_moe else ()
    return every + tuple(Override(rf"blk\.{il}{EXPERT_REGEX}", "CPU") for il in range(max(n_cpu_moe, 0)))


@dataclass(frozen=True)
class DraftOptions:
    """The draft model's own memory options, each read as its row in DRAFT_FLAGS says."""

    n_gpu_layers: int | None = None  # -ngld; None: auto or all (llama.cpp's default: as many as fit)
    type_k: str = "f16"  # -ctkd
    type_v: str = "f16"  # -ctvd
    overrides: tuple[Override, ...] = ()  # -otd's rules
    cpu_moe: bool = False  # -cmoed
    n_cpu_moe: int = 0  # -ncmoed

    @property
    def rules(self) -> tuple[Override, ...]:
        """Every tensor-placement rule in llama.cpp's order: -otd, then -cmoed, then -ncmoed."""
        return self.overrides + expert_rules(self.cpu_moe, self.n_cpu_moe)


@dataclass(frozen=True)
class Draft:
    """A second model loaded beside the main one (-md / -hfd): weights and a KV of the same context."""

    facts: ModelFacts
    options: DraftOptions = DraftOptions()


@dataclass(frozen=True)
class Layout:
    """The command line's memory options that are not the KV request: where things live."""

    kv_offload: bool = True  # False (-nkvo): the KV stays in host RAM
    op_offload: bool = True  # False (--no-op-offload): operations on host tensors stay on the CPU
    overrides: tuple[Override, ...] = ()  # -ot's rules
    cpu_moe: bool = False  # -cmoe: every layer's experts in host RAM
    n_cpu_moe: int = 0  # -ncmoe N: the experts of the first N layers in host RAM
    devices: tuple[str, ...] = ()  # -dev A,B (several: layers split between them)
    split_mode: str = "layer"  # none: everything on the main GPU
    tensor_split: tuple[float, ...] = ()  # -ts proportions, per device
    # no -ts from the user and RPC workers among the devices: the plan chooses the split (balanced_split)
    balance: bool = False
    main_gpu: int = 0
    mmproj_bytes: int = 0  # the projector file (-mm, or -hf's own)
    mmproj_offload: bool = True
    cache_ram_mib: int = 0  # -cram: llama-server's prompt cache limit (-1: none but the context)
    # -cram's value is set (the user's, or the plan's under a cgroup): the cache counts in a cgroup's charge
    cache_ram_set: bool = False
    ctx_checkpoints: int = 0  # -ctxcp: context checkpoints per llama-server slot (llama.cpp's 32 by default)
    ctx_checkpoints_set: bool = False  # as cache_ram_set, for -ctxcp
    load_mode: str = "auto"  # -lm: none reads weights into allocated RAM instead of mapping the file
    # False (-nr): no extra buffer types (llama-model.cpp make_cpu_buft_list), so no CPU_REPACK copy of host weights
    repack: bool = True
    draft: Draft | None = None

    @property
    def rules(self) -> tuple[Override, ...]:
        """Every tensor-placement rule in llama.cpp's order: -ot, then -cmoe, then -ncmoe."""
        return self.overrides + expert_rules(self.cpu_moe, self.n_cpu_moe)


@dataclass(frozen=True)
class LlamaSettings:
    """The values of llama.cpp's memory options: the KV request, stateful execution, GPU layers, the layout."""

    kv: KvRequest
    stateful: bool = False
    n_gpu_layers: int | None = None  # None: all layers on the device (llama.cpp's default)
    layout: Layout = field(default_factory=Layout)


Reader = Callable[[CommandLine, "MemoryFlag"], object]


@dataclass(frozen=True)
class MemoryFlag:
    """One llama.cpp option that changes memory: how it is read from argv and written back."""

    option: str  # the canonical name: configs/llama-args.json's first long name
    label: str  # the name safe-llama's messages give it
    # the field it fills in KvRequest, LlamaSettings or Layout (each name is in one of them); DRAFT_FLAGS': DraftOptions
    field: str
    read: Reader
    # how a chosen value goes back to argv; None: the plan never sets it
    write: Callable[[object], str | bool] | None = None
    given_field: str | None = None  # a Layout field that says the user set it (argv or its LLAMA_ARG_* twin)


def read_int(cmd: CommandLine, flag: MemoryFlag) -> int | None:
    """std::stoi, as the option's handler reads it; None: not given."""
    value = cmd.value(flag.option)
    if value is None:
        return None
    try:
        return stoi(str(value))
    except ValueError:
        setting = cmd.get(flag.option)
        where = "" if setting is None or setting.source == "argv" else f" (from {setting.source})"
        raise SafeLlamaError(
            f"safe-llama: {flag.label}{where}: '{value}' is not a whole number", ExitStatus.USAGE
        ) from None


def read_cache_type(cmd: CommandLine, flag: MemoryFlag) -> str:
    value = cmd.value(flag.option)
    if value is None:
        return "f16"
    name = str(value)
    if name not in CACHE_TYPES:
        raise SafeLlamaError(
            f"safe-llama: {flag.label}: unknown cache type '{value}' (one of {', '.join(CACHE_TYPES)})",
            ExitStatus.USAGE,
        )
    return name


def read_flag(cmd: CommandLine, flag: MemoryFlag) -> bool | None:
    value = cmd.value(flag.option)
    return None if value is None else bool(value)


def read_str(cmd: CommandLine, flag: MemoryFlag) -> str | None:
    value = cmd.value(flag.option)
    return value if isinstance(value, str) and value else None


def read_rules(cmd: CommandLine, flag: MemoryFlag) -> tuple[Override, ...]:
    """-ot PATTERN=BUFFER_TYPE,...: in its order, the first matching pattern wins (llama-model-loader)."""
    spec = read_str(cmd, flag)
    out: list[Override] = []
    for item in spec.split(",") if spec else ():
        pattern, _, buffer_type = item.partition("=")
        out.append(Override(pattern, buffer_type))
    return tuple(out)


def read_on(cmd: CommandLine, flag: MemoryFlag) -> bool:
    """A bool option on by default: only its --no- twin (or a false LLAMA_ARG_*) turns it off."""
    return cmd.value(flag.option) is not False


def _or(read: Reader, default: object) -> Reader:
    """The value read, or llama.cpp's default where it is not given (or 0 / empty, which llama.cpp reads so)."""
    return lambda cmd, flag: read(cmd, flag) or default


def _ctx(cmd: CommandLine, flag: MemoryFlag) -> int | None:
    n_ctx = read_int(cmd, flag)
    if n_ctx is not None and n_ctx < 0:
        raise SafeLlamaError(f"safe-llama: {flag.label}: {n_ctx} is negative", ExitStatus.USAGE)
    return n_ctx


_FA_WORDS = {"1": "on", "true": "on", "enabled": "on", "0": "off", "false": "off", "disabled": "off", "-1": "auto"}


def _flash_attn(cmd: CommandLine, flag: MemoryFlag) -> str:
    fa = str(cmd.value(flag.option) or "auto")
    fa = _FA_WORDS.get(fa, fa)
    if fa not in ("on", "off", "auto"):
        raise SafeLlamaError(f"safe-llama: {flag.label}: '{fa}' is not on, off or auto", ExitStatus.USAGE)
    return fa


def _fit(cmd: CommandLine, flag: MemoryFlag) -> bool:
    return str(cmd.value(flag.option) or "on") not in ("off", "0", "false", "disabled")


def _ctx_checkpoints(cmd: CommandLine, flag: MemoryFlag) -> int:
    """-ctxcp as given, else llama-server's default (the other tools keep none)."""
    value = read_int(cmd, flag)
    return value if value is not None else DEFAULT_CTX_CHECKPOINTS if cmd.tool == "server" else 0


def _cache_ram(cmd: CommandLine, flag: MemoryFlag) -> int:
    """llama-server's prompt cache (its default where -cram is not given); the other tools keep none."""
    value = read_int(cmd, flag)
    return (DEFAULT_CACHE_RAM_MIB if value is None else value) if cmd.tool == "server" else 0


def _devices(cmd: CommandLine, flag: MemoryFlag) -> tuple[str, ...]:
    return tuple(d for d in (read_str(cmd, flag) or "").split(",") if d and d != "none")


def _tensor_split(cmd: CommandLine, flag: MemoryFlag) -> tuple[float, ...]:
    spec = read_str(cmd, flag)
    return read_tensor_split(spec) if spec else ()


def _user_gpu_layers(cmd: CommandLine, flag: MemoryFlag) -> int | None:
    """-ngl as a count the plan keeps (None: auto, all, or llama.cpp's default: as many as fit)."""
    ngl = read_str(cmd, flag)
    return int(ngl) if ngl is not None and ngl.lstrip("-").isdigit() and int(ngl) >= 0 else None


def _draft_gpu_layers(cmd: CommandLine, flag: MemoryFlag) -> int | None:
    """-ngld as a count the plan keeps (None: auto or all, llama.cpp's default)."""
    value = read_str(cmd, flag)
    if value is None:
        return None
    try:
        ngl = read_gpu_layers(value)
    except ValueError:
        raise SafeLlamaError(
            f"safe-llama: {flag.label}: '{value}' is not a number, auto or all", ExitStatus.USAGE
        ) from None
    return None if ngl < 0 else ngl


def gpu_layers(cmd: CommandLine) -> int | None:
    flag = BY_FIELD["n_gpu_layers"]
    value = flag.read(cmd, flag)
    assert value is None or isinstance(value, int)
    return value


def _number(value: object) -> str:
    return str(value)


def _split_words(value: object) -> str:
    assert isinstance(value, tuple)
    return ",".join(str(int(x)) if float(x).is_integer() else str(x) for x in value)


def _on_off(value: object) -> str:
    return "on" if value else "off"


def _gpu_layers(value: object) -> str:
    assert isinstance(value, int)  # the plan writes -ngl only once it chose a count
    return str(value)


# In the order the request reads them (the first bad value is the one reported).
FLAGS: tuple[MemoryFlag, ...] = (
    MemoryFlag("--flash-attn", "-fa", "flash_attn", _flash_attn, write=_number),
    MemoryFlag("--fit", "-fit", "fit", _fit, write=_on_off),
    MemoryFlag("--ctx-size", "-c", "n_ctx", _ctx, write=_number),
    MemoryFlag("--parallel", "-np", "n_parallel", read_int, write=_number),
    MemoryFlag("--kv-unified", "-kvu", "kv_unified", read_flag),
    MemoryFlag("--batch-size", "-b", "n_batch", _or(read_int, DEFAULT_N_BATCH)),
    MemoryFlag("--ubatch-size", "-ub", "n_ubatch", _or(read_int, DEFAULT_N_UBATCH)),
    MemoryFlag("--swa-full", "--swa-full", "swa_full", _or(read_flag, False)),
    MemoryFlag("--cache-type-k", "-ctk", "type_k", read_cache_type, write=_number),
    MemoryFlag("--cache-type-v", "-ctv", "type_v", read_cache_type, write=_number),
    MemoryFlag("--kv-unified-per-slot", "--kv-unified-per-slot", "kv_unified_per_slot", _or(read_int, 0)),
    MemoryFlag("--gpu-layers", "-ngl", "n_gpu_layers", _user_gpu_layers, write=_gpu_layers),
    MemoryFlag("--cache-ram", "-cram", "cache_ram_mib", _cache_ram, _number, "cache_ram_set"),
    MemoryFlag("--kv-offload", "-nkvo", "kv_offload", read_on),
    MemoryFlag("--op-offload", "--no-op-offload", "op_offload", read_on),
    MemoryFlag("--override-tensor", "-ot", "overrides", read_rules),
    MemoryFlag("--cpu-moe", "-cmoe", "cpu_moe", _or(read_flag, False)),
    MemoryFlag("--n-cpu-moe", "-ncmoe", "n_cpu_moe", _or(read_int, 0), write=_number),
    MemoryFlag("--split-mode", "-sm", "split_mode", _or(read_str, "layer")),
    MemoryFlag("--tensor-split", "-ts", "tensor_split", _tensor_split, write=_split_words),
    MemoryFlag("--main-gpu", "-mg", "main_gpu", _or(read_int, 0)),
    MemoryFlag("--device", "-dev", "devices", _devices),
    MemoryFlag("--load-mode", "-lm", "load_mode", _or(read_str, "auto")),
    MemoryFlag("--repack", "-nr", "repack", read_on),
    MemoryFlag("--mmproj-offload", "--no-mmproj-offload", "mmproj_offload", read_on),
    MemoryFlag(
        "--ctx-checkpoints",
        "-ctxcp",
        "ctx_checkpoints",
        _ctx_checkpoints,
        _number,
        "ctx_checkpoints_set",
    ),
)
BY_FIELD: Mapping[str, MemoryFlag] = {flag.field: flag for flag in FLAGS}
# The draft model's options (-md / -hfd), read only where a draft model is named; the plan never writes them.
DRAFT_FLAGS: tuple[MemoryFlag, ...] = (
    MemoryFlag("--spec-draft-override-tensor", "-otd", "overrides", read_rules),
    MemoryFlag("--spec-draft-n-cpu-moe", "-ncmoed", "n_cpu_moe", _or(read_int, 0)),
    MemoryFlag("--spec-draft-ngl", "-ngld", "n_gpu_layers", _draft_gpu_layers),
    MemoryFlag("--spec-draft-type-k", "-ctkd", "type_k", read_cache_type),
    MemoryFlag("--spec-draft-type-v", "-ctvd", "type_v", read_cache_type),
    MemoryFlag("--spec-draft-cpu-moe", "-cmoed", "cpu_moe", _or(read_flag, False)),
)


def _names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in fields(cls))


KV_FIELDS = _names(KvRequest)
LAYOUT_FIELDS = _names(Layout)


def read_fields(cmd: CommandLine, among: frozenset[str]) -> dict[str, object]:
    """The values of the table's options that fill these fields, read from the command line."""
    out: dict[str, object] = {}
    for flag in FLAGS:
        if flag.field in among:
            out[flag.field] = flag.read(cmd, flag)
            if flag.given_field is not None:
                out[flag.given_field] = cmd.value(flag.option) is not None
    return out


def kv_request(cmd: CommandLine) -> KvRequest:
    """The KV request of a command line, each value read as its row in FLAGS says."""
    return KvRequest(tool=cmd.tool, **read_fields(cmd, KV_FIELDS))  # type: ignore[arg-type]


def draft_options(cmd: CommandLine) -> DraftOptions:
    """The draft model's options of a command line, each read as its row in DRAFT_FLAGS says."""
    return DraftOptions(**{flag.field: flag.read(cmd, flag) for flag in DRAFT_FLAGS})  # type: ignore[arg-type]


def layout(cmd: CommandLine) -> Layout:
    """The layout a command line asks for (the files it names are not read: no projector size, no draft)."""
    return Layout(**read_fields(cmd, LAYOUT_FIELDS))  # type: ignore[arg-type]


def setting(settings: LlamaSettings, name: str) -> object:
    """A field's value, wherever it lives (KvRequest, LlamaSettings or Layout)."""
    holder = settings.kv if name in KV_FIELDS else settings.layout if name in LAYOUT_FIELDS else settings
    return getattr(holder, name)


def argv_changes(settings: LlamaSettings, decided: Iterable[str]) -> dict[str, str | bool]:
    """The options a plan sets explicitly (in the order they were decided) with the settings' values."""
    return changes_of({name: setting(settings, name) for name in decided})


def changes_of(values: Mapping[str, object]) -> dict[str, str | bool]:
    """The options that set these fields to these values (in the mapping's order), as their rows write them."""
    out: dict[str, str | bool] = {}
    for name, value in values.items():
        flag = BY_FIELD[name]
        assert flag.write is not None, f"{flag.option} is read, never written"
        out[flag.option] = flag.write(value)
    return out

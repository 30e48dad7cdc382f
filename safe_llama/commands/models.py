"""`safe-llama models [PATH...] [llama.cpp memory flags]`: every model on this machine (the stores model_scan knows,
the bundled model, the paths given), what context each gets on each device and the host by the launch's own plan,
one line each with a bar, sorted by what fits best; --json with every figure.

Owns the command's words, its progress line and both renderings; the scan is pipeline.model_scan's, the headers
pipeline.model_index's, the verdicts pipeline.model_fits'.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from safe_llama.model.facts import ModelFacts
from safe_llama.model.kv import plan_kv
from safe_llama.pipeline.model_fits import Asked, Place, Verdict, verdict
from safe_llama.pipeline.model_index import Read
from safe_llama.pipeline.model_scan import Found
from safe_llama.pipeline.prepare import PlanOptions
from safe_llama.plan.policy import Policy
from safe_llama.units import human

BAR = 10  # characters of a model's bar
PROGRESS_AFTER = 1.0  # seconds before a progress line is shown (on a terminal only)
KV_TYPES = ("f16", "q8_0", "q4_0")


@dataclass(frozen=True)
class Row:
    """One model: where it was found, its header's facts (or why none), the plan on each place."""

    found: Found
    read: Read | None
    ceiling: int  # the context asked (the trained context without -c): the bar's full length
    verdicts: tuple[Verdict, ...]

    @property
    def best(self) -> float:
        """How much of the asked context fits on the best place (f16 first): the bar and the order."""
        if not self.ceiling:
            return -1.0
        score = 0.0
        for v in self.verdicts:
            if v.plan is not None:
                by_type = v.plan.ctx_by_type
                score = max(score, (by_type.get("f16", 0) + max(by_type.values(), default=0)) / (2 * self.ceiling))
        return score


def shown(text: str) -> str:
    """A name or path on one line, with no terminal escapes (a file name may hold any byte but / and NUL)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _ctx_words(n: int) -> str:
    """A context in cells, in thousands (of 1024) where it is a whole number of them."""
    if n >= 1024 and n % 1024 == 0:
        return f"{n // 1024}k"
    return str(n)


def _takes(v: Verdict, place: Place, n_layer: int) -> str:
    """What the plan needs there: the layers or experts it leaves on the host."""
    if v.plan is None or not place.target.on_gpu:
        return ""
    settings = v.plan.settings
    if "n_cpu_moe" in v.plan.decided or settings.layout.n_cpu_moe:
        return f", -ncmoe {settings.layout.n_cpu_moe}"
    if settings.n_gpu_layers is not None and settings.n_gpu_layers <= n_layer:
        return f", -ngl {settings.n_gpu_layers}"
    return ", all layers"


def place_words(v: Verdict, place: Place, n_layer: int) -> str:
    if v.plan is None:
        return f"{v.place} does not fit"
    by_type = v.plan.ctx_by_type
    best_type = max(KV_TYPES, key=lambda t: (by_type.get(t, 0), -KV_TYPES.index(t)))
    f16 = by_type.get("f16", 0)
    words = f"{v.place} {_ctx_words(f16)} f16" if f16 else f"{v.place} no f16"
    if by_type.get(best_type, 0) > f16:
        words += f" ({_ctx_words(by_type[best_type])} {best_type})"
    return words + _takes(v, place, n_layer)


def render_text(places: Sequence[Place], rows: Sequence[Row]) -> str:
    lines = [f"{'devices' if len(places) > 1 else 'device'}: " + "; ".join(f"{p.name} {p.description}" for p in places)]
    by_name = {p.name: p for p in places}
    good = [r for r in rows if r.read is not None and r.read.facts is not None]
    bad = [r for r in rows if r not in good]
    if good:
        width = min(max(len(shown(r.found.name)) for r in good), 60)
        lines.append(f"{'':{BAR + 2}} {'model':<{width}} {'weights':>10} {'trained':>8}  largest context that fits")
    for r in sorted(good, key=lambda r: (-r.best, r.found.name)):
        facts = r.read.facts  # type: ignore[union-attr]
        assert facts is not None
        filled = round(max(r.best, 0.0) * BAR)
        bar = "[" + "#" * filled + "." * (BAR - filled) + "]"
        name = shown(r.found.name)
        name = name if len(name) <= width else "..." + name[-(width - 3) :]
        where = " | ".join(place_words(v, by_name[v.place], facts.block_count) for v in r.verdicts)
        extra = f" +mmproj {human(_size(r.found.mmproj))}" if r.found.mmproj and r.found.mmproj_loaded else ""
        lines.append(
            f"{bar} {name:<{width}} {human(facts.total_weight_bytes):>10} {_ctx_words(facts.context_length):>8}  "
            f"{where}{extra}"
        )
    for r in sorted(bad, key=lambda r: r.found.name):
        problem = r.found.problem or (r.read.problem if r.read is not None else None) or "unreadable"
        lines.append(f"{'[  skip  ]':{BAR + 2}} {shown(r.found.name)}: {shown(problem)}")
    return "\n".join(lines) + "\n"


def _size(path: str | None) -> int:
    """A file's bytes; nothing for no file or one that cannot be read."""
    size = 0
    if path:
        with contextlib.suppress(OSError):
            size = os.stat(path).st_size
    return size


def _verdict_json(v: Verdict, facts: ModelFacts, place: Place) -> dict[str, Any]:
    p = v.plan
    return {
        "fits": p is not None,
        "error": v.error,
        "ctx_by_type": dict(p.ctx_by_type) if p else None,
        "n_ctx": p.settings.kv.n_ctx if p else None,
        "n_gpu_layers": p.settings.n_gpu_layers if p else None,
        "n_cpu_moe": p.settings.layout.n_cpu_moe if p else None,
        "argv_changes": {k: v for k, v in p.argv_changes.items()} if p else None,
        "env_changes": dict(p.env_changes) if p else None,
        "steps": [{"name": s.name, "reason": s.reason} for s in p.steps] if p else [],
        "memory": v.memory(facts, place),
    }


def render_json(places: Sequence[Place], rows: Sequence[Row]) -> str:
    devices = [
        {
            "name": p.name,
            "description": p.description,
            "backend": p.target.backend,
            "on_gpu": p.target.on_gpu,
            "integrated": p.target.integrated,
            "device_memory": p.target.device_memory.value if p.target.device_memory else None,
            "device_free": p.target.device_free.value if p.target.device_free else None,
            "device_budget": p.target.device_budget.value if p.target.device_budget else None,
            "host_budget": p.target.host_budget.value,
        }
        for p in places
    ]
    models = []
    by_name = {p.name: p for p in places}
    for r in sorted(rows, key=lambda r: (-r.best, r.found.name)):
        facts = r.read.facts if r.read is not None else None
        models.append(
            {
                "name": r.found.name,
                "store": r.found.store,
                "path": r.found.path,
                "parts": list(r.found.parts),
                "file_bytes": sum(_size(p) for p in r.found.parts),
                "mmproj": r.found.mmproj,
                "mmproj_bytes": _size(r.found.mmproj),
                "mmproj_loaded": r.found.mmproj_loaded,
                "problem": r.found.problem or (r.read.problem if r.read is not None else None),
                "architecture": facts.architecture if facts else None,
                "block_count": facts.block_count if facts else None,
                "context_length": facts.context_length if facts else None,
                "weight_bytes": facts.total_weight_bytes if facts else None,
                "ctx_asked": r.ceiling or None,
                "places": {v.place: _verdict_json(v, facts, by_name[v.place]) for v in r.verdicts if facts},
            }
        )
    return json.dumps({"devices": devices, "models": models}, indent=1) + "\n"


class Progress:
    """`reading N/M` on stderr, rewritten in place, once the scan has taken PROGRESS_AFTER seconds; only on a
    terminal."""

    def __init__(self, total: int, stream: TextIO, clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.stream, self.clock = total, stream, clock
        self.start = clock()
        self.shown = False
        self.tty = stream.isatty()

    def __call__(self, done: int) -> None:
        if not self.tty or self.clock() - self.start < PROGRESS_AFTER:
            return
        filled = done * 20 // max(self.total, 1)
        self.stream.write(f"\rsafe-llama: [{'#' * filled}{'.' * (20 - filled)}] {done}/{self.total} models")
        self.stream.flush()
        self.shown = True

    def end(self) -> None:
        if self.shown:
            self.stream.write("\r\033[K")
            self.stream.flush()


def plan_rows(
    found: Sequence[Found], reads: Mapping[str, Read], want: Asked, places: Sequence[Place], policy: Policy,
    options: PlanOptions,
) -> list[Row]:  # fmt: skip
    """Each model found, with its facts and its plan on each place (none for a file that has no facts)."""
    rows = []
    for f in found:
        read = reads.get(f.path)
        facts = read.facts if read is not None else None
        if facts is None:
            rows.append(Row(f, read, 0, ()))
            continue
        mmproj = _size(f.mmproj) if f.mmproj_loaded else 0
        verdicts = tuple(verdict(facts, want, p, policy, options, mmproj_bytes=mmproj) for p in places)
        rows.append(Row(f, read, plan_kv(facts, want.request.kv).context.n_ctx, verdicts))
    return rows


def collect(
    paths: Sequence[str], tool: str, args: Sequence[str], env: Mapping[str, str], given: Mapping[str, str],
    *, stores: bool = True,
) -> tuple[tuple[Place, ...], list[Row]]:  # fmt: skip
    """The places, and each model found with its verdict on each."""
    from safe_llama.cmdline import launch_args
    from safe_llama.model.bundled import bundled_model_path
    from safe_llama.pipeline import model_fits, model_index, model_scan
    from safe_llama.pipeline.options import launch_options

    launcher = {key: value for key, value in given.items() if key in launch_args.LAUNCHER}
    settings, origins = launch_args.resolve_sourced(launcher, env)
    options = launch_options(settings, origins).plan
    policy = model_fits.load_planner_policy(env)
    want: Asked = model_fits.asked(tool, args, env)
    places = model_fits.places(tool, args, env, options, policy)
    found = model_scan.scan(paths, env, defaults=stores)
    if stores:
        bundled = str(bundled_model_path(env))
        if os.path.isfile(bundled):
            found.insert(0, Found(f"{os.path.basename(bundled)} (bundled)", "bundled", bundled, (bundled,)))
    readable = [f for f in found if f.problem is None]
    progress = Progress(len(readable), sys.stderr)
    try:
        reads = dict(
            zip(
                (f.path for f in readable),
                model_index.read_all([f.path for f in readable], env, progress=progress),
                strict=True,
            )
        )
        rows = plan_rows(found, reads, want, places, policy, options)
    finally:
        progress.end()
    return places, rows


def main(settings: Mapping[str, str], words: list[str]) -> int:
    """The command's runner (cmdline.own_options.COMMANDS): PATHs, then from the first word that is an option on,
    the llama.cpp memory flags every model is planned with (-c, -ctk, -ngl, -np ...)."""
    from safe_llama.cmdline.launch_args import check_tool
    from safe_llama.cmdline.own_options import flag

    tool = check_tool(settings.get("tool", "server"), "(--tool cli, server or completion)")
    first_flag = next((i for i, w in enumerate(words) if w.startswith("-") and w != "-"), len(words))
    places, rows = collect(words[:first_flag], tool, words[first_flag:], os.environ, settings)
    out = render_json(places, rows) if flag(settings, "json") else render_text(places, rows)
    sys.stdout.write(out)
    return 0

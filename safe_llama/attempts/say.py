"""safe-llama's own lines on stderr: one line each, journald priorities when stderr is the journal,
JSON when asked. llama.cpp's own output never passes through here.

Owns the format of what safe-llama says; secrets must already be redacted by the caller.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from typing import TextIO

PRIORITY = {"error": 3, "warning": 4, "info": 6}


def _stderr_is_journal(env: Mapping[str, str], stream: TextIO) -> bool:
    """systemd sets JOURNAL_STREAM=<dev>:<inode> of the stream it connected; compare with stderr's."""
    value = env.get("JOURNAL_STREAM", "")
    try:
        dev, ino = (int(x) for x in value.split(":"))
        st = os.fstat(stream.fileno())
    except (ValueError, OSError):
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


class Say:
    def __init__(self, env: Mapping[str, str] = os.environ, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.json = env.get("SAFE_LLAMA_LOG_FORMAT", "text").lower() == "json"
        self.journal = not self.json and _stderr_is_journal(env, self.stream)
        self.quiet = env.get("SAFE_LLAMA_QUIET", "") not in ("", "0")

    def __call__(self, message: str, level: str = "info", **fields: object) -> None:
        if self.quiet and level == "info":
            return
        text = message.replace("\n", " ")
        if self.json:
            import json  # only for JSON lines: an early start says its lines before much is imported

            record = {"ts": round(time.time(), 3), "level": level, "msg": text, "source": "safe-llama", **fields}
            line = json.dumps(record, default=str)
        elif self.journal:
            line = f"<{PRIORITY[level]}>safe-llama: {text}"
        else:
            line = f"safe-llama: {text}"
        self.stream.write(line + "\n")
        self.stream.flush()

"""`safe-llama forget`: every remembered plan and learned limit dropped, so the next launch plans afresh.

Owns the command's one line of output; must not know how plans are kept (run.remember owns the files).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from safe_llama.remembered import remember


def main(settings: Mapping[str, str], words: list[str]) -> int:
    """The command's runner (cmdline.own_options.COMMANDS): it takes no options."""
    sys.stdout.write(f"safe-llama: forgot {remember.forget(os.environ)} remembered plan(s)\n")
    return 0

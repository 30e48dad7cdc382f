"""`safe-llama forget`: every remembered plan and learned limit dropped, so the next launch plans afresh.

Owns the command's one line of output; must not know how entries are kept (state.clear_entries clears every
kind, the launch records, parsed configs and probe results with the plans, safely beside other processes).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from safe_llama import state
from safe_llama.paths import cache_dir


def main(settings: Mapping[str, str], words: list[str]) -> int:
    """The command's runner (cmdline.own_options.COMMANDS): it takes no options."""
    removed = state.clear_entries(cache_dir(os.environ))
    sys.stdout.write(f"safe-llama: forgot {removed['plans']} remembered plan(s)\n")
    return 0

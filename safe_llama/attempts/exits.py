"""Every way out of safe-llama as its documented exit code: a known error is one line on stderr, an
interrupt is 130, the unexpected is 70 with one line (a traceback only with SAFE_LLAMA_DEBUG=1).

Owns that mapping for the doors (entry, cli); must stay light: it runs before every launch."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from safe_llama.errors import ExitStatus, SafeLlamaError


def guarded(body: Callable[[], int]) -> int:
    """Maps every failure to a documented exit code; a message, never a traceback, for known errors."""
    try:
        return body()
    except SafeLlamaError as err:
        sys.stderr.write(f"{err.message}\n")
        return int(err.status)
    except KeyboardInterrupt:
        return int(ExitStatus.INTERRUPTED)
    except Exception as err:  # the command line's usage errors, and the unexpected
        show = getattr(err, "show", None)
        if callable(show) and isinstance(getattr(err, "exit_code", None), int):  # typer's (vendored click) usage
            show()
            return int(ExitStatus.USAGE)
        if os.environ.get("SAFE_LLAMA_DEBUG"):
            import traceback

            traceback.print_exc()
        sys.stderr.write(f"safe-llama: internal error: {type(err).__name__}: {err} (SAFE_LLAMA_DEBUG=1 for details)\n")
        return int(ExitStatus.INTERNAL)

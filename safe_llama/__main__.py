"""`python -m safe_llama` runs the command line."""

import sys

from safe_llama.entry import main

sys.exit(main())

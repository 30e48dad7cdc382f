"""safe-llama: a launcher for llama.cpp that predicts its memory and picks settings that fit.

Owns the package version only; importing the package must stay cheap (it runs before every launch).
"""

__version__ = "0.1.0"

"""Running llama.cpp: spawning the real binary, relaying the terminal or pipes, readiness and sd_notify,
signals, retrying with what a failure named (its reading is diagnosis's), remembering what worked, and
starting a launch planned before from its launch record before the rest is imported (early, fast_record).

Owns the life of one launch. Must not know about typer or the admin commands."""

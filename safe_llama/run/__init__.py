"""Running llama.cpp: preparing a launch (model facts + probes + plan), spawning the real binary, relaying
the terminal or pipes, readiness and sd_notify, signals, recognising start-up failures (signatures) and
reading a failed start's whole log (log_reading), retrying with what the failure named, remembering
what worked, and starting a launch planned before from its launch record before the rest is imported
(early, fast_record).

Owns the life of one launch. Must not know about typer or the admin commands."""

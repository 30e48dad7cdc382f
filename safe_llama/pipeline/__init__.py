"""The shared pipeline from a command line to a plan: safe-llama's own options resolved (options), then the
model's facts, the probes and the plan (prepare). Both a launch (run) and the admin commands (plan,
explain) go through it, so what `plan` prints is what a launch does.

Owns the order of those steps and what each hands the next. Must not spawn llama.cpp, supervise or print
to the user (the callers do)."""

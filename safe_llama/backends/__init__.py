"""Every ggml backend safe-llama knows, one module each (cpu, cuda, openvino, ...) behind one protocol
(`backend.Backend`: its names and device-name prefixes, log marks, how one allocation is capped and probed,
its quirks), listed once in `registry`. The policy numbers for a backend stay data (configs/planner.toml's
tables, keyed by its name).

Owns what is true of each backend in the pinned llama.cpp source; must not probe, read files nor plan."""

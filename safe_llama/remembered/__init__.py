"""What one launch leaves for the next, and the starts made from it before the planner is imported: the KV
size and device limit that worked (remember), launch records (fast_record writes one when a launch is
ready, early starts llama.cpp from one), and the cached option table that lets a pass-through invocation
exec llama.cpp at once (passthrough).

Owns those cache files and the early starts. Must stay light on the early path (early, passthrough: no
planner, no supervisor imported) and must not decide the attempts (attempts/ does)."""

"""Command lines: llama.cpp's option table and the one reading of a llama.cpp argv (`llama_args.parse`,
then `request.to_request`), the model sources it names (-m, -hf, ...), and safe-llama's own launcher options.

Owns every reading of argv: any part of safe-llama that needs a value from the user's llama.cpp arguments
gets it from here; nothing else parses argv. Must not probe devices or start processes."""

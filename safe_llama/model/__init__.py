"""What a model file is: the GGUF header, the architecture's facts, the KV cache and recurrent state it
needs (the arithmetic, to the byte), the cached facts per file, and where the bundled model lives.

Owns everything derived from a model file alone. Must not look at the command line, a device or a process:
it reads files and computes; the layers above decide what to do with the numbers."""

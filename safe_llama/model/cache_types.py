"""The KV cache types llama.cpp accepts (-ctk/-ctv) and their ggml block sizes, as plain data.

Owns that table; must import nothing: the pass-through path reads it (cmdline.llama_args) before anything
heavy is loaded.
"""

# (elements per block, bytes per block) of the cache types, as ggml defines them (gguf's GGML_QUANT_SIZES;
# tests/model/test_kv.py checks they agree): looked up here without loading the gguf package (30 ms)
CACHE_TYPE_SIZES = {
    "f32": (1, 4), "f16": (1, 2), "bf16": (1, 2), "q8_0": (32, 34), "q4_0": (32, 18), "q4_1": (32, 20),
    "iq4_nl": (32, 18), "q5_0": (32, 22), "q5_1": (32, 24),
}  # fmt: skip
CACHE_TYPES = tuple(CACHE_TYPE_SIZES)  # what llama.cpp accepts for -ctk/-ctv (common/arg.cpp kv_cache_types)

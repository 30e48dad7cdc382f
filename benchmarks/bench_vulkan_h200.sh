#!/usr/bin/env bash
# On the GPU machine (device tool), from the project root: the pinned llama.cpp built with Vulkan against
# NVIDIA's Vulkan driver (../shared/gpu/vulkan.sh, 84 s on 16 cores), the model of tests/fixtures/nvidia-h200-cuda
# (8 layers of 16 KV heads x 256, 2,000,000 trained cells), then per case benchmarks/bench_first_start.py:
# safe-llama's plan, its first start until /health 200, the largest -c that starts with its final argv
# (bisection) and bare llama-server with the case's arguments. Everything lands in $OUT/vulkan-h200.tar.gz.
#
# Here, once: bash ../shared/gpu/prepare.sh && bash ../shared/gpu/prepare-vulkan.sh   (fills .gpu/)
# There (run, carry [".gpu"], one call per case keeps each under the 10-minute limit):
#   bash benchmarks/bench_vulkan_h200.sh ngl99-c2M
#   bash benchmarks/bench_vulkan_h200.sh ngl99
# No case name: both in one call (may need more than 10 minutes).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/vk-out}
R=/tmp/vk-results
mkdir -p "$OUT" "$R/logs"
declare -A CASES=(["ngl99-c2M"]="-c 2000000 -ngl 99" ["ngl99"]="-ngl 99")
WANTED=("$@")
[ "${#WANTED[@]}" -gt 0 ] || WANTED=(ngl99-c2M ngl99)

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl
. .gpu/vulkan.sh >"$R/vulkan-build.txt" 2>&1   # /tmp/lv/bin, VK_DRIVER_FILES, LD_LIBRARY_PATH
export PYTHONPATH=/tmp/site:$PWD SAFE_LLAMA_BIN_DIR=/tmp/lv/bin XDG_CACHE_HOME=/tmp/vk-cache
[ -f /tmp/big.gguf ] || python3 -c "from tests.tiny_gguf import write_tiny_gguf as w; w('/tmp/big.gguf', n_layer=8, \
n_head=16, n_head_kv=16, head_dim=256, n_ff=64, n_ctx_train=2_000_000)"

/tmp/lv/bin/llama-server --list-devices >"$R/list-devices.txt" 2>&1
python3 -m safe_llama.device.probe_vulkan >"$R/probe-vulkan.txt" 2>&1
python3 -m safe_llama devices --json >"$R/safe-llama-devices.json" 2>"$R/safe-llama-devices.err"
python3 -m safe_llama devices >"$R/safe-llama-devices.txt" 2>&1
python3 -m safe_llama plan server -m /tmp/big.gguf -c 2000000 -ngl 99 >"$R/plan-ngl99-c2M.txt" 2>&1
# the bare abort the issue names: one layer's K tensor over maxStorageBufferRange
timeout 120 /tmp/lv/bin/llama-server -m /tmp/big.gguf -c 2000000 -ngl 99 --port 8199 >"$R/bare-c2M-ngl99.log" 2>&1
echo "rc=$?" >>"$R/bare-c2M-ngl99.log"

for name in "${WANTED[@]}"; do
  python3 benchmarks/bench_first_start.py --bin-dir /tmp/lv/bin --model /tmp/big.gguf --timeout 120 --budget 9 \
    --out "$R/first-start-$name.json" --logs "$R/logs" --case "$name|${CASES[$name]}" >>"$R/bench.txt" 2>&1
done
tar czf "$OUT/vulkan-h200.tar.gz" -C "$(dirname "$R")" "$(basename "$R")"
cat "$R"/first-start-*.json

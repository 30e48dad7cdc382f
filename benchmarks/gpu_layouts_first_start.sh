#!/usr/bin/env bash
# On the GPU machine (device tool), from the project root, after the builds (CUDA in /tmp/lb/bin; Vulkan in
# /tmp/lv/bin with . .gpu/vulkan.sh): issue 36's closing table. safe-llama's first spawn of
# `server -m /tmp/big.gguf -c 2000000 -ngl 99 SHAPE` per layout and bare llama-server with its final argv at 1.03 x
# (and 1.015 x) its -c, on CUDA (device empty, then 80 GiB held by PyTorch) and on Vulkan. About 200 s in all:
# each phase stops starting shapes at its deadline. Writes $OUT/i36-layouts.tar.gz (rows JSON + logs) and
# $OUT/i36-summary.txt. MODEL, CUDA_BIN, VK_BIN override the paths (a run on the CPU build: MODEL=tiny.gguf CUDA_BIN=...).
#   bash benchmarks/gpu_layouts_first_start.sh [cuda] [held80] [vulkan] [held80-vulkan]   (none: the first three)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/i36-out}; mkdir -p "$OUT"
W=/tmp/i36-work; rm -rf "$W"; mkdir -p "$W/logs"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
MODEL=${MODEL:-/tmp/big.gguf} CUDA_BIN=${CUDA_BIN:-/tmp/lb/bin} VK_BIN=${VK_BIN:-/tmp/lv/bin}
[ -f "$MODEL" ] || python3 -c "from tests.tiny_gguf import write_tiny_gguf as w; w('/tmp/big.gguf', n_layer=8, \
n_head=16, n_head_kv=16, head_dim=256, n_ff=64, n_ctx_train=2_000_000)"
B="python3 benchmarks/bench_layouts_first_start.py --model $MODEL --logs $W/logs --timeout 40"
[ $# -eq 0 ] && set -- cuda held80 vulkan
for what in "$@"; do
  case $what in
    cuda) timeout 100 $B --bin-dir $CUDA_BIN --backend cuda --starts 2 --deadline 80 \
            --out "$W/first-start-layouts-cuda.json" >>"$W/run.jsonl" 2>>"$W/stderr.txt" ;;
    held80)
      env -u PYTHONPATH python3 -c "import torch,time; x=torch.empty(80*2**30,dtype=torch.uint8,device='cuda'); x.fill_(1); torch.cuda.synchronize(); time.sleep(3000)" &
      HOLD=$!; sleep 8; nvidia-smi --query-gpu=memory.used,memory.total --format=csv >"$W/held80-smi.txt" 2>&1
      timeout 40 $B --bin-dir $CUDA_BIN --backend cuda --tag held80- --starts 1 --deadline 30 \
        --shape "np16|-np 16" --shape "fa-off|-fa off" --shape "default|" \
        --out "$W/first-start-layouts-held80-cuda.json" >>"$W/run.jsonl" 2>>"$W/stderr.txt"
      kill $HOLD; wait $HOLD 2>/dev/null ;;
    held80-vulkan) ( . .gpu/vulkan.sh >"$W/vk-env.txt" 2>&1
      env -u PYTHONPATH -u LD_LIBRARY_PATH python3 -c "import torch,time; x=torch.empty(80*2**30,dtype=torch.uint8,device='cuda'); x.fill_(1); torch.cuda.synchronize(); time.sleep(3000)" &
      HOLD=$!; sleep 8; nvidia-smi --query-gpu=memory.used,memory.total --format=csv >"$W/held80-smi.txt" 2>&1
      timeout 80 $B --bin-dir $VK_BIN --backend vulkan --tag held80- --starts 1 --deadline 60 \
        --shape "np16|-np 16" --shape "fa-off|-fa off" --shape "default|" \
        --out "$W/first-start-layouts-held80-vulkan.json" >>"$W/run.jsonl" 2>>"$W/stderr.txt"
      kill $HOLD; wait $HOLD 2>/dev/null ) ;;
    vulkan) ( . .gpu/vulkan.sh >"$W/vk-env.txt" 2>&1
            timeout 100 $B --bin-dir $VK_BIN --backend vulkan --starts 1 --deadline 80 \
              --out "$W/first-start-layouts-vulkan.json" >>"$W/run.jsonl" 2>>"$W/stderr.txt" ) ;;
  esac
done
python3 - "$W" >"$OUT/i36-summary.txt" <<'PY'
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("first-start-layouts-*.json")):
    for r in json.loads(f.read_text()):
        s, big = r.get("safe_llama", {}), r.get("largest", {})
        print(f.stem[20:], r["shape"], "ready" if s.get("ready") else "NOT READY", "attempts", s.get("attempts"),
              "-c", s.get("n_ctx"), "logged", s.get("compute_mib"), "plan", r.get("plan_compute_mib"),
              "ratio >=", big.get("ratio_at_least"), "<=", big.get("ratio_at_most"), r.get("skipped", ""))
PY
cd /tmp && tar czf "$OUT/i36-layouts.tar.gz" -C "$W" . 2>/dev/null
cat "$OUT/i36-summary.txt"; ls -la "$OUT"

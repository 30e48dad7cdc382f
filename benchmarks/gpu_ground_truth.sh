#!/usr/bin/env bash
# On the GPU machine (device tool), from the project root, after the builds (.gpu/build.sh: CUDA in /tmp/lb/bin;
# . .gpu/vulkan.sh: Vulkan in /tmp/lv/bin): what bare llama-server reserves for every server layout (issue 36) and
# the largest context at which N such servers are up together (issue 35). Results under $OUT as they come.
#   bash benchmarks/gpu_ground_truth.sh cuda|vulkan|together|held80
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gt-out}; mkdir -p "$OUT"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
[ -f /tmp/big.gguf ] || python3 -c "from tests.tiny_gguf import write_tiny_gguf as w; w('/tmp/big.gguf', n_layer=8, \
n_head=16, n_head_kv=16, head_dim=256, n_ff=64, n_ctx_train=2_000_000)"
for what in "$@"; do
  case $what in
    cuda) python3 benchmarks/bench_layouts_gpu.py --bin-dir /tmp/lb/bin --model /tmp/big.gguf --tag cuda- \
            --ctx 32768 --ctx 262144 --ctx 524288 --out "$OUT/layouts-cuda.json" --logs /tmp/gt-logs >"$OUT/layouts-cuda.jsonl" 2>&1 ;;
    vulkan) . .gpu/vulkan.sh >/tmp/vk-env.txt 2>&1
            python3 benchmarks/bench_layouts_gpu.py --bin-dir /tmp/lv/bin --model /tmp/big.gguf --tag vk- \
            --ctx 32768 --ctx 524288 --out "$OUT/layouts-vulkan.json" --logs /tmp/gt-logs >"$OUT/layouts-vulkan.jsonl" 2>&1 ;;
    together)
      A="-ngl 99 -fa on -ctk q8_0 -ctv q8_0 -fit off"
      for spec in "1 1500000 1800000" "2 600000 900000" "3 380000 620000"; do
        set -- $spec
        python3 benchmarks/bench_together_bare.py --bin-dir /tmp/lb/bin --model /tmp/big.gguf --n $1 --low $2 --high $3 \
          --budget 7 --args "$A" --out "$OUT/together-n$1.json" >>"$OUT/together.jsonl" 2>&1
      done ;;
    held80)
      env -u PYTHONPATH python3 -c "import torch,time; x=torch.empty(80*2**30,dtype=torch.uint8,device='cuda'); x.fill_(1); torch.cuda.synchronize(); time.sleep(3000)" &
      HOLD=$!; sleep 8; nvidia-smi --query-gpu=memory.used,memory.total --format=csv >"$OUT/held80-smi.txt"
      for shape in "default|" "np16|-np 16" "fa-off|-fa off"; do
        python3 benchmarks/bench_layouts_gpu.py --bin-dir /tmp/lb/bin --model /tmp/big.gguf --tag held80-cuda- --shape "$shape" \
          --ctx 262144 --out /tmp/h.json --logs /tmp/gt-logs >>"$OUT/held80.jsonl" 2>&1
      done
      kill $HOLD ;;
  esac
done
cd /tmp && tar czf "$OUT/gt-logs.tar.gz" gt-logs 2>/dev/null
ls -la "$OUT"

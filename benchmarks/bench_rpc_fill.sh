#!/usr/bin/env bash
# Three RPC workers (the pinned ggml-rpc-server) on 127.0.0.1, each in a cgroup v1 memory group of its own
# (500 / 400 / 170 MiB), the 12-layer spread model of tests/attempts/test_rpc_real.py, safe-llama's plan from the
# declared budgets, then ONE request whose prompt fills the planned context (token ids, n_predict 2): the
# workers' peak charge (memory.max_usage_in_bytes) against their limits, and their OOM kills.
#   sudo bash benchmarks/bench_rpc_fill.sh         (root: it creates and removes the cgroups; minutes of CPU)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
B=${SAFE_LLAMA_BIN_DIR:-$("$PY" -c "import os; from safe_llama.paths import pinned_bin_dir; print(pinned_bin_dir('cpu', os.environ))")}
WORK=$(mktemp -d)
LIMITS=(500 400 170)
PORTS=(50140 50141 50142)
"$PY" -c "from tests.tiny_gguf import write_tiny_gguf; write_tiny_gguf('$WORK/m12.gguf', n_layer=12, n_head=8, n_head_kv=8, head_dim=64, n_ff=4096, n_ctx_train=65536, sparse=True)"
cleanup() {
  pkill -f "port 50145" || true; sleep 1
  for p in "${PORTS[@]}"; do pkill -f "ggml-rpc-server -p $p" || true; done; sleep 1
  for i in 0 1 2; do rmdir /sys/fs/cgroup/memory/sl-bench-fill$i 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
R=""; M=""
for i in 0 1 2; do
  g=/sys/fs/cgroup/memory/sl-bench-fill$i; mkdir -p $g; echo $((LIMITS[i] << 20)) > $g/memory.limit_in_bytes
  setsid sh -c "echo \$\$ > $g/cgroup.procs; exec $B/ggml-rpc-server -p ${PORTS[i]}" > "$WORK/w$i.log" 2>&1 &
  R+="${R:+,}127.0.0.1:${PORTS[i]}"; M+="${M:+,}127.0.0.1:${PORTS[i]}=${LIMITS[i]}M"
done
sleep 1
SAFE_LLAMA_BIN_DIR=$B XDG_CACHE_HOME=$WORK/cache "$PY" -m safe_llama --rpc-memory "$M" server -m "$WORK/m12.gguf" \
  --rpc "$R" -c 16384 --port 50145 > "$WORK/head.log" 2>&1 &
for _ in $(seq 240); do curl -sf localhost:50145/health > /dev/null && break; sleep 0.5; done
grep "^safe-llama" "$WORK/head.log"
CTX=$(grep -o -- "-c [0-9]*, the largest" "$WORK/head.log" | grep -o "[0-9]*" | head -1)
"$PY" - "${CTX:-16384}" <<'PY'
import json, sys, time, urllib.request
ctx = int(sys.argv[1])
body = json.dumps({"prompt": [300 + i % 25 for i in range(ctx - 16)], "n_predict": 2, "cache_prompt": False}).encode()
start = time.time()
try:
    with urllib.request.urlopen(urllib.request.Request("http://127.0.0.1:50145/completion", body,
                                {"Content-Type": "application/json"}), timeout=3000) as answer:
        print(f"-c {ctx}: status {answer.status} in {time.time() - start:.0f} s, "
              f"{json.loads(answer.read()).get('tokens_evaluated')} tokens evaluated")
except OSError as err:
    print(f"-c {ctx}: the request failed: {err}")
PY
for i in 0 1 2; do
  g=/sys/fs/cgroup/memory/sl-bench-fill$i
  echo "worker ${PORTS[i]}: limit ${LIMITS[i]} MiB, peak $(( $(cat $g/memory.max_usage_in_bytes) >> 20 )) MiB, $(grep oom_kill $g/memory.oom_control | tail -1)"
done

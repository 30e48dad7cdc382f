#!/usr/bin/env bash
# On the GPU machine (device tool), from the project root, after .gpu/build.sh (CUDA in /tmp/lb/bin): issue 37's
# time to /health 200 (benchmarks/bench_gpu_ready.py), safe-llama installed in a venv as a user's pip install would
# be, against bare llama-server; and the early start's kill path on the real driver. Results under $OUT.
#   bash benchmarks/gpu_ready.sh interpreter|kill|empty|held [RUNS]
# kill: a launch record made on the empty GPU, then 80 GiB held by PyTorch: the server's early start spawns its
# child while NVML answers, is told the free memory moved, kills the child and plans; a shim in front of
# llama-server logs each exec, nvidia-smi shows what the GPU holds before and after.
# Not run yet: written on 2026-12-02 when this session had no device time left (issue 37 says what it is for).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gr-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
unset PYTHONPATH
[ -x /tmp/venv/bin/python ] || python3 -m venv --without-pip /tmp/venv
site=$(/tmp/venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
printf '/tmp/site\n%s\n' "$PWD" >"$site/safe-llama-dev.pth"
PY=/tmp/venv/bin/python
[ -f /tmp/big.gguf ] || $PY -c "from tests.tiny_gguf import write_tiny_gguf as w; w('/tmp/big.gguf', n_layer=8, \
n_head=16, n_head_kv=16, head_dim=256, n_ff=64, n_ctx_train=2_000_000)"
HOLD="import torch,time; x=torch.empty(80*2**30,dtype=torch.uint8,device='cuda'); x.fill_(1); torch.cuda.synchronize(); \
print('held', flush=True); time.sleep(3000)"
smi() { nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader; }
what=$1; runs=${2:-9}
case $what in
  interpreter)
    for i in 1 2 3; do $PY -c pass; done
    $PY -c "import subprocess,time,statistics as s; t=[]
for i in range(21):
    a=time.perf_counter(); subprocess.run(['$PY','-c','pass']); t.append(time.perf_counter()-a)
print('venv python -c pass, median of 21: %.1f ms' % (1000*s.median(t)))" | tee "$OUT/interpreter.txt" ;;
  kill)
    shim=/tmp/shim-bin; mkdir -p $shim "$OUT"
    printf '#!/bin/sh\necho "$(date +%%s.%%N) $$" >>/tmp/shim-execs\nexec /tmp/lb/bin/llama-server "$@"\n' >$shim/llama-server
    chmod +x $shim/llama-server; rm -f /tmp/shim-execs
    cache=$(mktemp -d); port=18123
    run_once() {  # safe-llama server until /health 200, then SIGTERM; prints seconds to ready
      $PY - "$@" <<'EOF'
import os, signal, subprocess, sys, time, urllib.request
port = sys.argv[sys.argv.index("--port") + 1]
began = time.monotonic()
proc = subprocess.Popen(["/tmp/venv/bin/python", "-m", "safe_llama", "server", *sys.argv[1:]], stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL, stderr=open("/tmp/kill-" + str(int(began)) + ".log", "w"))
ready = None
while time.monotonic() - began < 120 and proc.poll() is None and ready is None:
    try:
        if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).status == 200:
            ready = time.monotonic() - began
    except Exception:
        time.sleep(0.005)
time.sleep(3)  # its record, written after /health
proc.send_signal(signal.SIGTERM); proc.wait(60)
print(f"ready after {ready} s, exit {proc.returncode}")
EOF
    }
    export XDG_CACHE_HOME=$cache SAFE_LLAMA_BIN_DIR=$shim
    args="-m /tmp/big.gguf -c 2000000 -ngl 99 --host 127.0.0.1 --port $port"
    { echo "empty: $(smi)"; run_once $args; echo "records: $(ls $cache/safe-llama/launch)"
      run_once $args; echo "second start (early, from the record), execs so far: $(wc -l </tmp/shim-execs)"
      env HOLD="$HOLD" python3 -c "import os; exec(os.environ['HOLD'])" >/tmp/hold.out & hold=$!
      while ! grep -q held /tmp/hold.out 2>/dev/null; do sleep 0.2; done
      echo "held: $(smi)"; before=$(wc -l </tmp/shim-execs)
      run_once $args; echo "with 80 GiB held, execs of llama-server in that launch: $(( $(wc -l </tmp/shim-execs) - before ))"
      echo "held, after: $(smi)"; kill $hold; wait $hold 2>/dev/null; sleep 2; echo "after: $(smi)"
      cat /tmp/shim-execs; ls -t /tmp/kill-*.log | head -1 | xargs grep "safe-llama:" ; } 2>&1 | tee "$OUT/kill.txt" ;;
  empty|held)
    HOLD_PYTHON=$(command -v python3) $PY benchmarks/bench_gpu_ready.py --python $PY --bin-dir /tmp/lb/bin \
      --model /tmp/big.gguf --out "$OUT/gpu-ready-$what.json" --logs /tmp/gr-logs --runs "$runs" --planned-runs 1 \
      --conditions "$what" 2>&1 | tee "$OUT/gpu-ready-$what.txt"
    (cd /tmp && tar czf "$OUT/gpu-ready-logs-$what.tar.gz" gr-logs) ;;
esac

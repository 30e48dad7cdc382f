"""In the guest: one request whose prompt fills llama-server's context (its /props n_ctx), on loopback; prints
GUEST lines with what happened. Exit 0: answered 200. A third argument "props": only its n_ctx; "short": a
64-token prompt; a number: a prompt of that many tokens."""

import json
import sys
import time
import urllib.request

port, label = int(sys.argv[1]), sys.argv[2]
base = f"http://127.0.0.1:{port}"
deadline = time.monotonic() + 300
props = None
while props is None and time.monotonic() < deadline:
    try:
        with urllib.request.urlopen(f"{base}/props", timeout=10) as answer:  # noqa: S310 (loopback http)
            props = json.load(answer)
    except OSError:
        time.sleep(1)
if props is None:
    print(f"GUEST {label}_n_ctx=none")
    sys.exit(2)
n_ctx = int(props["default_generation_settings"]["n_ctx"])
print(f"GUEST {label}_n_ctx={n_ctx}", flush=True)
if sys.argv[3:] == ["props"]:  # only what the server planned
    sys.exit(0)
how = sys.argv[3] if sys.argv[3:] else "full"
length = 64 if how == "short" else int(how) if how.isdigit() else n_ctx - 16
prompt = [300 + i % 25 for i in range(length)]  # token ids past the byte tokens: one cell each
body = json.dumps({"prompt": prompt, "n_predict": 2, "cache_prompt": False}).encode()
started = time.monotonic()
request = urllib.request.Request(f"{base}/completion", body, {"Content-Type": "application/json"})  # noqa: S310
try:
    with urllib.request.urlopen(request, timeout=1500) as answer:  # noqa: S310 (loopback http)
        status = answer.status
except OSError as err:
    status = 0
    print(f"GUEST {label}_error={type(err).__name__}", flush=True)
print(f"GUEST {label}_status={status} {label}_s={time.monotonic() - started:.1f}", flush=True)
sys.exit(0 if status == 200 else 1)

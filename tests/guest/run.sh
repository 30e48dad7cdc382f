#!/bin/sh
# Runs inside the guest of scripts/guest-image.sh (systemd as PID 1, cgroup v2), as root, from its payload disk
# (/payload): installs safe-llama as the README says for a system-wide install (a virtual environment in
# /opt/safe-llama/venv from a wheel, links in /usr/local/bin, the pinned llama.cpp and a model under
# /opt/safe-llama), runs the shipped unit with MemoryMax=, and prints one "GUEST key=value" line per finding
# for tests/attempts/test_systemd_guest.py. Every wait is bounded.
set -u
P=/payload
. $P/payload.env   # BIN_DIR MODEL_NAME MEMORY_MAX MEMORY_MAX_AFTER
say() { echo "GUEST $*"; }
now() { cut -d' ' -f1 /proc/uptime; }
unit=safe-llama-server
cg=/sys/fs/cgroup/system.slice/$unit.service

t0=$(now)
python3 -m venv /opt/safe-llama/venv
/opt/safe-llama/venv/bin/pip install -q --no-compile --no-index --find-links $P/wheels safe-llama || { say install=failed; exit 1; }
for t in safe-llama safe-llama-cli safe-llama-server safe-llama-completion; do
  ln -sf /opt/safe-llama/venv/bin/$t /usr/local/bin/$t
done
install -d -m 0755 "$BIN_DIR" /opt/safe-llama/models
install -m 0755 $P/bin/* "$BIN_DIR/"
install -m 0644 $P/$MODEL_NAME /opt/safe-llama/models/
install -m 0644 $P/README.md /opt/safe-llama/README.md
say install_s=$(echo "$(now) - $t0" | bc 2>/dev/null || python3 -c "print(round($(now) - $t0, 1))")

install -m 0644 $P/safe-llama-server.service /etc/systemd/system/
install -d -m 0755 /etc/safe-llama /etc/systemd/system/$unit.service.d
install -m 0600 /dev/null /etc/safe-llama/server.env
echo "LLAMA_ARG_MODEL=/opt/safe-llama/models/$MODEL_NAME" >/etc/safe-llama/server.env
printf '[Service]\nMemoryMax=%s\nMemorySwapMax=0\nRestartSec=30\n' "$MEMORY_MAX" >/etc/systemd/system/$unit.service.d/memory.conf
systemctl daemon-reload

# 1. READY under systemd (Type=notify: start returns once safe-llama sent READY=1)
t0=$(now)
systemctl start $unit; say start_rc=$?
say ready_s=$(python3 -c "print(round($(now) - $t0, 1))")
say state=$(systemctl show -P ActiveState $unit) substate=$(systemctl show -P SubState $unit)
say memory_max=$(cat $cg/memory.max)
say controllers=$(tr ' ' , </sys/fs/cgroup/cgroup.controllers)
say pid1=$(cat /proc/1/comm)
main=$(systemctl show -P MainPID $unit); server=$(pgrep -x llama-server | head -n 1)
say main=$main
say oom_adj_supervisor=$(cat /proc/$main/oom_score_adj) oom_adj_server=$(cat /proc/${server:-0}/oom_score_adj 2>/dev/null)
journalctl -u $unit -o cat --no-pager | grep '^safe-llama' | sed 's/^/PLAN /'

# 2. a request under the limit: one that fills the context (FILL=full; under software emulation a 12k-cell
# prompt takes longer than CI has), or a short one that shows it serves (FILL=short), or FILL=N tokens
python3 $P/fill.py 8080 first "${FILL:-short}"
say fill_rc=$?
say peak_after_fill=$(cat $cg/memory.peak 2>/dev/null || echo none)
say oom_kills_after_fill=$(sed -n 's/^oom_kill //p' $cg/memory.events)
# by then the ready server's supervision is the small handed supervisor's, in the same MainPID
say main_after_fill=$(systemctl show -P MainPID $unit) handed=$(tr '\0' ' ' </proc/$main/cmdline | grep -c 'import handed')

# 3. a kill for lack of memory once ready: the limit lowered under the running server. The kernel's OOM killer takes
# llama-server (the unit's OOMScoreAdjust= keeps safe-llama below it); safe-llama sees it, remembers it for the
# plan's key and exits 137. The limit is put back while Restart= waits (RestartSec= raised by this test's drop-in),
# so the restart has the first key again and plans below the plan that was killed.
systemctl set-property --runtime $unit MemoryMax="$MEMORY_MAX_AFTER"
for i in $(seq 1 300); do
  [ "$(systemctl show -P SubState $unit)" = auto-restart ] && break
  sleep 1
done
say substate_after_kill=$(systemctl show -P SubState $unit) exit_code_after_kill=$(systemctl show -P ExecMainCode $unit) \
  exit_status_after_kill=$(systemctl show -P ExecMainStatus $unit)
systemctl set-property --runtime $unit MemoryMax="$MEMORY_MAX"
for i in $(seq 1 600); do
  [ "$(systemctl show -P NRestarts $unit)" -ge 1 ] && [ "$(systemctl show -P ActiveState $unit)" = active ] && break
  sleep 1
done
journalctl -k -o cat --no-pager | grep -E 'Killed process|invoked oom-killer|no killable' | sed 's/^/KERNEL /'
say restarts=$(systemctl show -P NRestarts $unit) state_after_restart=$(systemctl show -P ActiveState $unit)
say memory_max_after=$(cat $cg/memory.max)
journalctl -u $unit -o cat --no-pager | grep '^safe-llama' | sed 's/^/PLAN /'
python3 $P/fill.py 8080 after_restart props; say after_restart_props_rc=$?

# 4. SIGTERM: systemctl stop, and how it ended
t0=$(now)
systemctl stop $unit
say stop_s=$(python3 -c "print(round($(now) - $t0, 1))")
say result=$(systemctl show -P Result $unit) exec_status=$(systemctl show -P ExecMainStatus $unit) \
  exec_code=$(systemctl show -P ExecMainCode $unit)
journalctl -u $unit -o cat --no-pager | tail -n 5 | sed 's/^/TAIL /'
exit 0

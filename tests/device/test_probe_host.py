"""probe_host: cgroup v1/v2 memory from temporary trees, RLIMIT_AS in a real child, psutil on this host."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import psutil

from safe_llama.device.probe_host import probe_host, read_cgroup_memory, read_meminfo
from safe_llama.device.proc import run_capture

GIB = 1 << 30


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def v2_tree(root: Path, own: str = "system.slice/llama.service") -> tuple[Path, Path]:
    """A cgroup v2 mount with a slice limit of 8 GiB and a service limit of 6 GiB (systemd MemoryMax=)."""
    cgroup_root = root / "fs"
    write(cgroup_root / "cgroup.controllers", "cpu io memory pids\n")
    write(cgroup_root / "system.slice" / "memory.max", f"{8 * GIB}\n")
    service = cgroup_root / own
    write(service / "memory.max", f"{6 * GIB}\n")
    write(service / "memory.current", f"{2 * GIB}\n")
    write(service / "memory.stat", f"anon {GIB}\nfile {GIB}\ninactive_file {512 << 20}\nactive_file 1\n")
    proc = root / "proc-self-cgroup"
    write(proc, f"0::/{own}\n")
    return proc, cgroup_root


def test_v2_systemd_service(tmp_path: Path) -> None:
    proc, cgroup_root = v2_tree(tmp_path)
    cgroup, note = read_cgroup_memory(proc_cgroup=proc, cgroup_root=cgroup_root)
    assert cgroup is not None
    assert cgroup.version == 2
    assert cgroup.max_bytes == 6 * GIB
    assert cgroup.limit_dir == str(cgroup_root / "system.slice" / "llama.service")
    assert (cgroup.current_bytes, cgroup.inactive_file_bytes) == (2 * GIB, 512 << 20)
    assert "cgroup v2" in note


def test_v2_parent_limit_binds(tmp_path: Path) -> None:
    proc, cgroup_root = v2_tree(tmp_path)
    write(cgroup_root / "system.slice" / "llama.service" / "memory.max", "max\n")
    write(cgroup_root / "system.slice" / "memory.max", f"{3 * GIB}\n")
    cgroup, _ = read_cgroup_memory(proc_cgroup=proc, cgroup_root=cgroup_root)
    assert cgroup is not None
    assert cgroup.max_bytes == 3 * GIB
    assert cgroup.limit_dir == str(cgroup_root / "system.slice")


def test_v2_unlimited(tmp_path: Path) -> None:
    proc, cgroup_root = v2_tree(tmp_path)
    write(cgroup_root / "system.slice" / "llama.service" / "memory.max", "max\n")
    write(cgroup_root / "system.slice" / "memory.max", "max\n")
    cgroup, _ = read_cgroup_memory(proc_cgroup=proc, cgroup_root=cgroup_root)
    assert cgroup is not None
    assert (cgroup.max_bytes, cgroup.limit_dir, cgroup.current_bytes) == (None, None, 2 * GIB)


def test_container_with_cgroup_namespace(tmp_path: Path) -> None:
    """Inside a container the process sees "0::/" and the mount root is its own cgroup (docker -m 4g)."""
    cgroup_root = tmp_path / "fs"
    write(cgroup_root / "cgroup.controllers", "memory\n")
    write(cgroup_root / "memory.max", f"{4 * GIB}\n")
    write(cgroup_root / "memory.current", f"{GIB}\n")
    write(tmp_path / "cg", "0::/\n")
    cgroup, _ = read_cgroup_memory(proc_cgroup=tmp_path / "cg", cgroup_root=cgroup_root)
    assert cgroup is not None
    assert (cgroup.max_bytes, cgroup.current_bytes) == (4 * GIB, GIB)


def test_container_without_namespace_falls_back_to_the_mount_root(tmp_path: Path) -> None:
    cgroup_root = tmp_path / "fs"
    write(cgroup_root / "cgroup.controllers", "memory\n")
    write(cgroup_root / "memory.max", f"{4 * GIB}\n")
    write(tmp_path / "cg", "0::/system.slice/docker-0123abcd.scope\n")
    cgroup, _ = read_cgroup_memory(proc_cgroup=tmp_path / "cg", cgroup_root=cgroup_root)
    assert cgroup is not None
    assert cgroup.max_bytes == 4 * GIB


def test_hybrid_uses_the_v1_memory_controller(tmp_path: Path) -> None:
    """systemd's hybrid layout: a v2 'unified' mount without the memory controller, v1 memory beside it."""
    cgroup_root = tmp_path / "fs"
    write(cgroup_root / "unified" / "cgroup.controllers", "")
    memory = cgroup_root / "memory"
    write(memory / "memory.limit_in_bytes", "9223372036854771712\n")
    write(memory / "job" / "memory.limit_in_bytes", f"{5 * GIB}\n")
    write(memory / "job" / "memory.usage_in_bytes", f"{GIB}\n")
    write(memory / "job" / "memory.stat", f"cache 1\ninactive_file 7\ntotal_inactive_file {256 << 20}\n")
    write(tmp_path / "cg", "12:memory:/job\n5:cpu,cpuacct:/job\n0::/job\n")
    cgroup, note = read_cgroup_memory(proc_cgroup=tmp_path / "cg", cgroup_root=cgroup_root)
    assert cgroup is not None
    assert (cgroup.version, cgroup.max_bytes, cgroup.current_bytes) == (1, 5 * GIB, GIB)
    assert cgroup.inactive_file_bytes == 256 << 20
    assert "v1" in note


def test_v1_unlimited_is_none(tmp_path: Path) -> None:
    memory = tmp_path / "fs" / "memory"
    write(memory / "memory.limit_in_bytes", "9223372036854771712\n")
    write(memory / "memory.usage_in_bytes", "100\n")
    write(tmp_path / "cg", "4:memory:/\n")
    cgroup, _ = read_cgroup_memory(proc_cgroup=tmp_path / "cg", cgroup_root=tmp_path / "fs")
    assert cgroup is not None
    assert cgroup.max_bytes is None


def test_no_cgroup_information(tmp_path: Path) -> None:
    cgroup, note = read_cgroup_memory(proc_cgroup=tmp_path / "missing", cgroup_root=tmp_path)
    assert cgroup is None
    assert "not Linux" in note
    write(tmp_path / "cg", "0::/\n")
    cgroup, note = read_cgroup_memory(proc_cgroup=tmp_path / "cg", cgroup_root=tmp_path / "empty")
    assert cgroup is None
    assert "no cgroup memory controller" in note


def test_rlimit_as_in_a_real_child() -> None:
    code = (
        "import resource\n"
        "resource.setrlimit(resource.RLIMIT_AS, (3 << 30, resource.RLIM_INFINITY))\n"
        "from safe_llama.device.probe_host import read_rlimit_as\n"
        "print(read_rlimit_as())\n"
    )
    done = run_capture([sys.executable, "-c", code], env=os.environ)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(3 << 30)


def test_this_host() -> None:
    host = probe_host()
    assert 0 < host.available_bytes <= host.total_bytes
    assert host.cgroup_note


def test_meminfo_is_what_psutil_reports() -> None:
    read = read_meminfo()
    assert read is not None
    assert read[0] == psutil.virtual_memory().total
    assert abs(read[1] - psutil.virtual_memory().available) < 256 << 20  # the host moves between the reads


def test_no_mem_available_falls_back_to_psutil(tmp_path: Path) -> None:
    write(tmp_path / "meminfo", "MemTotal:       1024 kB\nMemFree:         512 kB\n")
    assert read_meminfo(tmp_path / "meminfo") is None
    host = probe_host(meminfo=tmp_path / "meminfo")
    assert host.total_bytes == psutil.virtual_memory().total


def test_oom_counters_and_evidence(tmp_path: Path) -> None:
    """Only the group's own counter is read with the machine's, and only the group's names a child: a parent's
    rises for its other groups' kills, the machine's for any process's."""
    from safe_llama.device.probe_host import oom_counters, watch_oom

    proc_cgroup = tmp_path / "cgroup"
    proc_cgroup.write_text("4:memory:/a/b\n0::/\n")
    (tmp_path / "fs" / "memory").mkdir(parents=True)
    (tmp_path / "fs" / "memory" / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 9\n")
    leaf = tmp_path / "fs" / "memory" / "a" / "b"
    leaf.mkdir(parents=True)
    (leaf / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    (leaf / "memory.failcnt").write_text("3\n")
    (leaf / "cgroup.procs").write_text("100\n101\n")
    (leaf.parent / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n")
    vmstat = tmp_path / "vmstat"
    vmstat.write_text("nr_free_pages 1\noom_kill 7\n")

    def read() -> dict[str, int]:
        return oom_counters(proc_cgroup=proc_cgroup, cgroup_root=tmp_path / "fs", vmstat=vmstat)

    before = read()
    own = f"{leaf}/memory.oom_control oom_kill"
    assert before == {own: 0, f"{vmstat} oom_kill": 7}  # no parent, no failcnt (a limit hit is no kill)
    roots = {"proc_cgroup": proc_cgroup, "cgroup_root": tmp_path / "fs"}
    watch = watch_oom(101, 0.0, before, members={100, 101}, **roots)
    assert (watch.group, watch.group_counter) == (str(leaf), own)
    assert watch_oom(101, 0.0, before, members={100}, **roots).group_counter is None  # shared: names no one
    (leaf.parent / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 6\n")
    vmstat.write_text("nr_free_pages 1\noom_kill 8\n")
    assert watch.evidence(read(), still_own=True, kernel_line=None) is None  # a parent's and the machine's
    assert watch.no_evidence(read(), still_own=True, kernel_log=False) == (
        "no evidence of OOM: its cgroup's oom_kill did not rise, the kernel's log unreadable; "
        f"{vmstat} oom_kill rose from 7 to 8, a kill anywhere on the host"
    )
    (leaf / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    assert watch.evidence(read(), still_own=True, kernel_line=None) == f"{own} rose from 0 to 1"
    assert watch.evidence(read(), still_own=False, kernel_line=None) is None  # another member's kill
    line = "Memory cgroup out of memory: Killed process 101 (llama-server)"
    assert watch.evidence(read(), still_own=False, kernel_line=line) == f"the kernel logged: {line}"

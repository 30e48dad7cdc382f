"""One GPU's free memory now, by the key a launch record keeps for it (NVML's GPU UUID, an amdgpu device's PCI
address): the early start's one vendor reading (remembered/early.py), read before llama.cpp starts.

Owns that single reading, begun before the early start's other checks and collected after them; must stay light
(os and time; select for NVML's answer, signal only to kill a child that takes too long or is not wanted; ctypes
and NVML only in a forked child, whose threads never reach the supervisor: probe_free.NvmlRead says why) and must
not match a reading to a llama.cpp device (free_memory.py does, when the plan is made).
"""

from __future__ import annotations

import os
import time

NVML_LIBRARY = "libnvidia-ml.so.1"
NVML_TIMEOUT = 5.0  # seconds a forked NVML read may take before it is killed (a wedged driver)
NVML = "nvml"
AMDGPU = "amdgpu sysfs"  # probe_free.FreeReading.source of each


class Reading:
    """One reading begun: NVML's runs in a forked child while the caller does other work (the early start checks
    the rest of its record meanwhile); `result()` waits for it (at most NVML_TIMEOUT seconds from its start),
    `cancel()` drops it. Either reaps the child once."""

    def __init__(self, value: int | None = None, child: tuple[int, int, float] | None = None) -> None:
        self._value = value
        self._child = child  # (pid, the pipe's read end, the monotonic deadline)

    def result(self) -> int | None:
        """The free bytes (None: no reading now)."""
        if self._child is None:
            return self._value
        import select

        pid, read_end, deadline = self._child
        self._child = None
        chunks = []
        try:
            while select.select([read_end], [], [], max(deadline - time.monotonic(), 0.0))[0]:
                chunk = os.read(read_end, 64)
                if not chunk:
                    break
                chunks.append(chunk)
            else:
                _kill(pid)
                return None
        finally:
            os.close(read_end)
            os.waitpid(pid, 0)
        text = b"".join(chunks)
        self._value = int(text) if text.isdigit() and len(text) < 24 else None
        return self._value

    def cancel(self) -> None:
        """Not wanted any more (a check before it failed): the child is killed and reaped."""
        if self._child is not None:
            pid, read_end, _ = self._child
            self._child = None
            _kill(pid)
            os.close(read_end)
            os.waitpid(pid, 0)


def _kill(pid: int) -> None:
    import signal

    os.kill(pid, signal.SIGKILL)


def begin(source: str, key: str, *, library: str = NVML_LIBRARY, sys_root: str = "/sys") -> Reading:
    """The free bytes of the GPU whose reading (source) had this key, begun: NVML's in a forked child, amdgpu's
    counters at once (two small reads)."""
    if source == NVML:
        return _nvml_begin(library, key)
    if source == AMDGPU:
        return Reading(_amdgpu_free(sys_root, key))
    return Reading()


def _amdgpu_free(sys_root: str, bdf: str) -> int | None:
    folder = os.path.join(sys_root, "bus", "pci", "devices", os.path.basename(bdf))
    try:
        with open(os.path.join(folder, "mem_info_vram_total"), "rb") as f:
            total = int(f.read(64))
        with open(os.path.join(folder, "mem_info_vram_used"), "rb") as f:
            used = int(f.read(64))
    except (OSError, ValueError):
        return None
    return max(total - used, 0)


def _nvml_begin(library: str, uuid: str) -> Reading:
    """NVML's free figure for the GPU of this UUID, read in a forked child (at most NVML_TIMEOUT seconds)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: read, write the figure, leave at once (no atexit, no parent buffers)
        try:
            os.close(read_end)
            free = nvml_read(library, uuid)
            os.write(write_end, b"" if free is None else str(free).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    return Reading(child=(pid, read_end, time.monotonic() + NVML_TIMEOUT))


def nvml_read(library: str, uuid: str) -> int | None:
    """nvmlDeviceGetMemoryInfo's free bytes of the GPU with this UUID, in this process (the forked child's
    part; probe_free.read_nvml reads every GPU, with their names and addresses, when a plan is made)."""
    import ctypes

    try:
        nvml = ctypes.CDLL(library)
    except OSError:
        return None
    if nvml.nvmlInit_v2() != 0:
        return None
    handle = ctypes.c_void_p()
    memory = (ctypes.c_ulonglong * 3)()  # nvmlMemory_t: total, free, used
    if nvml.nvmlDeviceGetHandleByUUID(uuid.encode(), ctypes.byref(handle)) != 0:
        return None
    if nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory)) != 0:
        return None
    return int(memory[1])

"""One GPU's free memory now, by the key a launch record keeps for it (NVML's GPU UUID, an amdgpu device's PCI
address): the early start's one vendor reading (remembered/early.py), read before llama.cpp starts.

Owns that single reading; must stay light (os; select and signal for NVML's read; ctypes and NVML only in a
forked child, whose threads never reach the supervisor: probe_free.NvmlRead says why) and must not match a
reading to a llama.cpp device (free_memory.py does, when the plan is made).
"""

from __future__ import annotations

import os

NVML_LIBRARY = "libnvidia-ml.so.1"
NVML_TIMEOUT = 5.0  # seconds a forked NVML read may take before it is killed (a wedged driver)
NVML = "nvml"
AMDGPU = "amdgpu sysfs"  # probe_free.FreeReading.source of each


def free_now(source: str, key: str, *, library: str = NVML_LIBRARY, sys_root: str = "/sys") -> int | None:
    """The free bytes of the GPU whose reading (source) had this key; None when it cannot be read now."""
    if source == NVML:
        return _nvml_free(library, key)
    if source == AMDGPU:
        return _amdgpu_free(sys_root, key)
    return None


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


def _nvml_free(library: str, uuid: str) -> int | None:
    """NVML's free figure for the GPU of this UUID, read in a forked child (at most NVML_TIMEOUT seconds)."""
    import select
    import signal

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
    chunks = []
    try:
        while select.select([read_end], [], [], NVML_TIMEOUT)[0]:
            chunk = os.read(read_end, 64)
            if not chunk:
                break
            chunks.append(chunk)
        else:
            os.kill(pid, signal.SIGKILL)
            return None
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    text = b"".join(chunks)
    return int(text) if text.isdigit() and len(text) < 24 else None


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

"""The other safe-llama launches on this machine, counted once: what each reserved in the ledger (its plan's
device and host bytes) less what of it the figure a plan starts from already shows (NVML's per-process use is
in the device's free figure, a process's resident memory in its cgroup's charge and in MemAvailable); a share
of a budget (--share); and the words for both.

Owns that arithmetic and its words; must not read anything (device/ledger.py reads the ledger and the
per-process figures, the probes the rest). Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from safe_llama.device.host_budget import HostLimit
from safe_llama.device.limits import Sourced
from safe_llama.units import human

# a launch's state in the ledger: started, not planned yet; planned (its bytes); its llama.cpp ready (all allocated)
ARRIVING, PLANNED, READY = "arriving", "planned", "ready"


@dataclass(frozen=True)
class Launch:
    """One launch as the ledger keeps it (device/ledger.py reads and writes these)."""

    pid: int  # the launcher's (safe-llama's) process id; llama.cpp runs as its child
    start: int  # the launcher's start time (clock ticks after boot, /proc/PID/stat field 22): a reused pid differs
    tool: str  # cli | server | completion
    label: str  # who it is for people: "profile chat" (a unit's instance), "model NAME.gguf"
    state: str  # ARRIVING (started, not planned yet: its bytes are 0), PLANNED or READY
    device: str  # the device's key (device_key); "" when the plan puts nothing on a device
    device_name: str  # llama.cpp's name for it (CUDA0)
    device_bytes: int  # what the plan puts there, with the runtime's own part
    host_bytes: int  # what the plan keeps resident on the host (what a cgroup charges)
    cgroup: str  # the cgroup folder whose limit the plan kept to; "" none

    def who(self) -> str:
        return f"safe-llama {self.tool} pid {self.pid} ({self.label})"


@dataclass(frozen=True)
class Visible:
    """What of one launch the machine shows now, read with the figure the plan starts from: its llama.cpp's use
    of the device (NVML, per process) and its resident memory; None where no such figure exists: then a READY
    launch counts as all allocated and a PLANNED one as none (the safe side: what it allocated already counts
    twice until it is ready)."""

    device_bytes: int | None = None
    host_bytes: int | None = None


NOTHING_SEEN = Visible()


def visible_of(
    children: Mapping[int, Sequence[int]], resident: Mapping[int, int], gpu_use: Mapping[int, int] | None
) -> dict[int, Visible]:
    """Each launcher's Visible: its children's (llama.cpp's) resident bytes, and their device use where the
    vendor reports it per process (gpu_use: by pid, None when it does not)."""
    out = {}
    for pid, kids in children.items():
        device = None if gpu_use is None else sum(gpu_use.get(kid, 0) for kid in kids)
        # its children only: a plan counts its launcher's growth alone (what it held when it probed was charged
        # then, and is in the figures of every launch that probes after it)
        host = sum(resident.get(kid, 0) for kid in kids) if kids else None  # none seen: hidden, or not started
        out[pid] = Visible(device, host)
    return out


def device_key(backend: str, name: str | None, uuid: str | None, pci_bdf: str | None) -> str:
    """The same GPU seen by two launches, whatever CUDA_VISIBLE_DEVICES numbers it: NVML's UUID, else its PCI
    address, else the backend and llama.cpp's name."""
    if uuid:
        return uuid
    if pci_bdf:
        return f"pci {pci_bdf}"
    return f"{backend} {name}" if name else ""


def _unseen(reserved: int, seen: int | None, state: str) -> int:
    if seen is None:
        return 0 if state == READY else reserved
    return max(reserved - seen, 0)


def unseen_device(launch: Launch, visible: Visible) -> int:
    """The part of a launch's device reservation the device's free figure does not show yet."""
    return _unseen(launch.device_bytes, visible.device_bytes, launch.state)


def unseen_host(launch: Launch, visible: Visible) -> int:
    """The part of its host reservation neither its cgroup's charge nor MemAvailable shows yet."""
    return _unseen(launch.host_bytes, visible.host_bytes, launch.state)


@dataclass(frozen=True)
class Others:
    """The other launches a plan shares this machine with, and what of theirs it must leave alone."""

    launches: tuple[Launch, ...]  # every other live launch, on any device
    arriving: int  # how many of them started and have not planned yet
    device: Sourced[int] | None  # reserved on this plan's device and not yet in its free figure
    host_cgroup: int  # reserved in this plan's cgroup and not yet charged there
    host_ram: int  # reserved anywhere on the host and not yet resident

    def held_lines(self) -> tuple[str, ...]:
        """One line per launch: "CUDA0: 62.10 GiB held by safe-llama server pid 1234 (profile chat)"."""
        lines = []
        for launch in self.launches:
            if launch.device_bytes and launch.device_name:
                lines.append(f"{launch.device_name}: {human(launch.device_bytes)} held by {launch.who()}")
            if launch.host_bytes:
                lines.append(f"host: {human(launch.host_bytes)} held by {launch.who()}")
        return tuple(lines)

    def implied_share(self) -> float | None:
        """Without --share, launches that start together split what is free: 1/(1 + those still arriving)."""
        return 1 / (1 + self.arriving) if self.arriving else None


NO_OTHERS = Others((), 0, None, 0, 0)


def others(launches: Sequence[Launch], visible: Mapping[int, Visible], *, device: str, cgroup: str) -> Others:
    """What the other launches reserved that this plan's figures do not show yet, each launch counted once:
    on this device (by its key), in this cgroup, on the host. visible: by launcher pid."""
    on_device = [launch for launch in launches if device and launch.device == device]
    unseen = [(launch, unseen_device(launch, visible.get(launch.pid, NOTHING_SEEN))) for launch in on_device]
    total = sum(bytes_ for _, bytes_ in unseen)
    counted = [launch for launch, bytes_ in unseen if bytes_]
    device_figure = None
    if total:
        names = ", ".join(launch.who() for launch in counted)
        device_figure = Sourced(total, "probed", f"reserved by {names} and not yet allocated")
    ram = sum(unseen_host(launch, visible.get(launch.pid, NOTHING_SEEN)) for launch in launches)
    in_group = sum(
        unseen_host(launch, visible.get(launch.pid, NOTHING_SEEN))
        for launch in launches
        if cgroup and launch.cgroup == cgroup
    )
    arriving = sum(1 for launch in launches if launch.state == ARRIVING)
    return Others(tuple(launches), arriving, device_figure, in_group, ram)


def host_limits_with(
    limits: Sequence[HostLimit],
    reserved: Others,
    share: float | None,
    ceilings: Mapping[str, int],
    why: str,
    own: int = 0,
) -> tuple[HostLimit, ...]:
    """The host limits less what other launches reserved and the cgroup or RAM does not show yet, and at most
    the share of each limit's ceiling (ceilings: by kind, the cgroup's memory.max, the RAM's total) less what
    this launcher holds already (own: charged before its plan, which counts only its growth), each said in
    its detail."""
    out = []
    for limit in limits:
        budget = limit.budget
        minus = {"cgroup": reserved.host_cgroup, "ram": reserved.host_ram}.get(limit.kind, 0)
        if minus and budget.source != "declared":  # a declared budget is the user's word, as a declared device
            budget = Sourced(
                max(budget.value - minus, 0),
                budget.source,
                f"{budget.detail}, less {human(minus)} other safe-llama launches reserved and do not hold yet",
            )
        ceiling = ceilings.get(limit.kind)
        if share is not None and ceiling is not None and int(ceiling * share) - own < budget.value:
            held = f" less {human(own)} this launcher holds" if own else ""
            budget = Sourced(
                max(int(ceiling * share) - own, 0),
                "declared",
                f"share {share:.2g} of {human(ceiling)} ({limit.kind}, {why}){held}",
            )
        out.append(replace(limit, budget=budget))
    return tuple(out)


def shared_device(memory: int, share: float, runtime: int, why: str) -> Sourced[int]:
    """A share of the device's memory, its runtime's own part inside it."""
    less = f" less {human(runtime)} for its runtime" if runtime else ""
    return Sourced(
        max(int(memory * share) - runtime, 0), "declared", f"share {share:.2g} of {human(memory)} ({why}){less}"
    )

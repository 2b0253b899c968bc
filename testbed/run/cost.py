"""Emulation cost: where the machine's CPU went while a run moved its frames.

Every emulated frame costs CPU in the GPU agents, Open vSwitch, the kernel (veth, qdiscs,
softirqs), and per sample or event in the switch-queue emulator and the controller. When the
sum nears the machine, timers slip and queues appear that no switch would have; this module
says where the time went, per component and per delivered frame.

``Snapshot`` (thin edge) reads the CPU time of each component's processes
(``/proc/<pid>/stat``: every thread) and of the whole machine (``/proc/stat``); ``breakdown``
(pure) turns two snapshots into CPU-seconds per component: the processes' own time, then the
kernel's (softirqs, interrupts and system time no listed process was charged), then what is
left (other processes of the machine). Their sum is the machine's busy time.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Dict, Iterable, Mapping, Tuple

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
# The order every table and results file lists them in.
COMPONENTS = ("agents", "open_vswitch", "switch_queue_emulator", "controller", "runner",
              "kernel", "other")
OVS_PIDFILES = ("/var/run/openvswitch/ovs-vswitchd.pid", "/var/run/openvswitch/ovsdb-server.pid")


@dataclass(frozen=True)
class Snapshot:
    """CPU seconds so far: (user, system) per component, and the machine's counters."""

    wall_s: float
    processes: Mapping[str, Tuple[float, float]]
    machine: Mapping[str, float]  # user, nice, system, idle, iowait, irq, softirq, steal

    def of(self, component: str) -> Tuple[float, float]:
        """A component's (user, system) seconds; one not running yet has spent none."""
        return self.processes.get(component, (0.0, 0.0))

    @classmethod
    def take(cls, pids: Mapping[str, Iterable[int]]) -> "Snapshot":
        procs = {}
        for name, group in pids.items():
            user = system = 0.0
            for pid in group:
                u, s = process_cpu_s(pid)
                user, system = user + u, system + s
            procs[name] = (user, system)
        return cls(time.monotonic(), procs, machine_cpu_s())


def process_cpu_s(pid: int) -> Tuple[float, float]:
    """(user, system) CPU seconds of every thread of ``pid`` so far; zeros once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0, 0.0
    return int(fields[11]) * TICK_S, int(fields[12]) * TICK_S  # utime, stime


def machine_cpu_s(path: str = "/proc/stat") -> Dict[str, float]:
    with open(path, encoding="ascii") as f:
        values = [int(x) * TICK_S for x in f.readline().split()[1:9]]
    names = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    return dict(zip(names, values + [0.0] * (len(names) - len(values))))


def ovs_pids() -> list:
    """ovs-vswitchd and ovsdb-server, from their pid files (empty where they are absent)."""
    out = []
    for path in OVS_PIDFILES:
        try:
            with open(path, encoding="ascii") as f:
                out.append(int(f.read().strip()))
        except (OSError, ValueError):
            pass
    return out


def system_part(before: Snapshot, after: Snapshot) -> Dict[str, float]:
    """CPU seconds each component's processes spent in the kernel (pure)."""
    return {name: max(0.0, s1 - before.of(name)[1]) for name, (_u1, s1) in after.processes.items()}


def breakdown(before: Snapshot, after: Snapshot) -> Dict[str, float]:
    """CPU seconds per component between two snapshots (pure). The kernel's share is the
    machine's kernel-mode time (system, softirq, interrupts) that no listed process was
    charged (a softirq that interrupts a process is charged to it); ``other`` is the user
    time of every other process on the machine."""
    out: Dict[str, float] = dict.fromkeys(COMPONENTS, 0.0)
    user = system = 0.0
    for name, (u1, s1) in after.processes.items():
        u0, s0 = before.of(name)
        du, ds = max(0.0, u1 - u0), max(0.0, s1 - s0)
        out[name] = du + ds
        user, system = user + du, system + ds
    m = {k: after.machine[k] - before.machine[k] for k in after.machine}
    out["kernel"] = max(0.0, m["system"] + m["irq"] + m["softirq"] - system)
    out["other"] = max(0.0, m["user"] + m["nice"] - user)
    return out


def cost_report(before: Snapshot, after: Snapshot, frames: int, cpus: int) -> dict:
    """The ``emulation_cost`` of a run: CPU seconds and microseconds per delivered frame for
    every component, the machine's busy share over the window (pure)."""
    cpu = breakdown(before, after)
    wall = max(1e-9, after.wall_s - before.wall_s)
    total = sum(cpu.values())
    per = (lambda s: round(s * 1e6 / frames, 2)) if frames else (lambda s: None)
    return {"window_s": round(wall, 3), "frames_delivered": frames, "cpus": cpus,
            "busy_share": round(total / (wall * cpus), 3),
            "cpu_s": {name: round(cpu[name], 3) for name in COMPONENTS},
            "in_kernel_s": {name: round(v, 3) for name, v in system_part(before, after).items()},
            "us_per_frame": {name: per(cpu[name]) for name in COMPONENTS},
            "total_cpu_s": round(total, 3), "total_us_per_frame": per(total)}

"""Whether this machine can hold a fabric at all: refused up front, before anything starts.

Each GPU is an agent process in its own namespace (Python with Scapy's layers: 73 MB resident
mid-run, measured; 90 MB leaves room for records that grow with the iterations), each
neighbour host a flow process; the controller (59 MB), the queue emulator (31 MB), the runner
(up to 176 MB in the soak) and Mininet's shells take the rest of the base. A fabric whose
processes cannot fit in the memory the kernel reports available would be killed midway or swap
its timing away.
"""
from __future__ import annotations

from ..base.errors import ConfigError
from ..base.topology import FabricPlan

AGENT_MB = 90
NEIGHBOUR_MB = 60
BASE_MB = 500  # controller, queue emulator, runner, Mininet's shells


def memory_needed_mb(plan: FabricPlan) -> int:
    return BASE_MB + AGENT_MB * len(plan.gpus) + NEIGHBOUR_MB * len(plan.neighbours)


def mem_available_mb(meminfo: str = "/proc/meminfo") -> int:
    with open(meminfo, encoding="ascii") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    raise OSError("no MemAvailable in /proc/meminfo")


def check(plan: FabricPlan, available_mb: int) -> None:
    need = memory_needed_mb(plan)
    if need > available_mb:
        raise ConfigError(
            f"topology: {len(plan.gpus)} GPUs need about {need / 1024:.1f} GiB for their "
            f"agents, controller and emulator; this machine has {available_mb / 1024:.1f} GiB "
            "available: use fewer leaves or GPUs per leaf")

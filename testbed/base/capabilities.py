"""What this kernel and machine can do, as data: detected at run time by
``testbed.fabric.capabilities.detect`` (never assumed), read by the plan and the fabric."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Dict, Optional

from .errors import CapabilityError

REQUIRED_QDISCS = ("htb", "bfifo", "pfifo_head_drop", "tbf")


@dataclass(frozen=True)
class Capabilities:
    root: bool
    qdiscs: Dict[str, Optional[bool]]  # None: could not probe (not root)
    ovs_running: bool
    ovs_version: Optional[str]
    openvswitch_module: bool
    os_ken: bool
    mininet: bool
    tshark: bool
    rxe_module: str = "missing"  # rdma_rxe: "loaded" | "available" (modprobe can) | "missing"
    perftest: bool = False  # ib_write_lat/ib_write_bw and the rdma tool
    bpf_marking: Optional[bool] = False  # the tc BPF marking program runs (testbed.fabric.bpfmark)
    nic_in_c: bool = False  # the GPU agents' C extension (traffic/_nicio.c) is built
    # the allocator ovs-vswitchd runs with ("tcmalloc", "jemalloc", "glibc"; None: unknown)
    ovs_allocator: Optional[str] = None

    @property
    def rxe(self) -> bool:
        """Real RoCE verbs traffic (``--traffic rxe``) can run here."""
        return self.rxe_module != "missing" and self.perftest

    @property
    def datapath(self) -> str:
        """OVS datapath to use: the kernel one when its module is loaded, else userspace."""
        return "kernel" if self.openvswitch_module else "user"

    @property
    def netem(self) -> bool:
        return bool(self.qdiscs.get("netem"))

    @property
    def red(self) -> bool:
        return bool(self.qdiscs.get("red"))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["datapath"] = self.datapath
        d["rxe"] = self.rxe
        return d

    def problems_for_run(self):
        """Reasons a run cannot start on this machine (empty if it can)."""
        problems = []
        if not self.root:
            problems.append("must run as root (sudo)")
        if not self.mininet:
            problems.append("Mininet is not importable: run scripts/install.sh")
        if not self.os_ken:
            problems.append("os-ken is not importable: run scripts/install.sh")
        if not self.ovs_running:
            problems.append("Open vSwitch is not running: run scripts/install.sh "
                            "(it starts ovsdb-server and ovs-vswitchd)")
        for q in REQUIRED_QDISCS:
            if self.qdiscs.get(q) is False:
                problems.append(f"the kernel lacks the {q} qdisc (needed to shape links)")
        return problems

    def require_run(self) -> None:
        problems = self.problems_for_run()
        if problems:
            raise CapabilityError("; ".join(problems))

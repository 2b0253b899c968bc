"""What this kernel and machine can do, detected at run time (never assumed).

Queueing disciplines are probed by really creating them on a veth pair inside a throw-away
network namespace (``unshare --net``): the namespace and the veth vanish with the probe process,
so detection leaves nothing behind and never touches the machine's own interfaces.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from typing import Dict, Optional

from .. import PROJECT_ROOT
from ..base.capabilities import Capabilities

# qdisc name -> tc arguments that create it on a veth
QDISC_PROBES = {
    "htb": "root handle 1: htb default 1",
    "bfifo": "root bfifo limit 30000",
    "pfifo_head_drop": "root pfifo_head_drop limit 10",
    "netem": "root netem delay 1ms",
    "red": "root red limit 400000 min 30000 max 90000 avpkt 1000 burst 55 probability 0.1 "
           "ecn nodrop",
    "tbf": "root tbf rate 10mbit burst 10kb latency 10ms",
}


def probe_qdiscs() -> Dict[str, Optional[bool]]:
    """Try each qdisc on a veth in a private namespace; None for all when not root."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("tc"):
        return {q: None for q in QDISC_PROBES}
    script = ["ip link add tbprobe0 type veth peer name tbprobe1 || exit 3"]
    for name, args in QDISC_PROBES.items():
        script.append(f"if tc qdisc add dev tbprobe0 {args} 2>/dev/null; then echo {name}=1;"
                      f" tc qdisc del dev tbprobe0 root; else echo {name}=0; fi")
    try:
        out = subprocess.run(["unshare", "--net", "sh", "-c", "\n".join(script)],
                             capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {q: None for q in QDISC_PROBES}
    found = dict(line.split("=") for line in out.split() if "=" in line)
    return {q: (found[q] == "1") if q in found else None for q in QDISC_PROBES}


def ovs_status():
    """(running, version) of Open vSwitch, asked through ovs-vsctl."""
    if not shutil.which("ovs-vsctl"):
        return False, None
    try:
        show = subprocess.run(["ovs-vsctl", "--timeout=3", "show"], capture_output=True,
                              text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False, None
    if show.returncode != 0:
        return False, None
    version = None
    for line in show.stdout.splitlines():
        if "ovs_version" in line:
            version = line.split(":", 1)[1].strip().strip('"')
    return True, version


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def detect() -> Capabilities:
    running, version = ovs_status()
    return Capabilities(
        root=os.geteuid() == 0,
        qdiscs=probe_qdiscs(),
        ovs_running=running,
        ovs_version=version,
        openvswitch_module=os.path.exists("/sys/module/openvswitch"),
        os_ken=_importable("os_ken"),
        mininet=_importable("mininet") and bool(shutil.which("mnexec")),
        tshark=bool(shutil.which("tshark")),
        rxe_module=rxe_module(),
        perftest=all(shutil.which(t) for t in ("ib_write_lat", "ib_write_bw", "rdma")),
        bpf_marking=probe_bpf_marking(),
        nic_in_c=_importable("traffic._nicio"),
        ovs_allocator=ovs_allocator(),
    )


def ovs_allocator(pidfile: str = "/var/run/openvswitch/ovs-vswitchd.pid") -> Optional[str]:
    """Which malloc ovs-vswitchd runs with, from the libraries it mapped (None: not known)."""
    try:
        with open(pidfile, encoding="ascii") as f:
            pid = int(f.read().strip())
        with open(f"/proc/{pid}/maps", encoding="ascii", errors="replace") as f:
            maps = f.read()
    except (OSError, ValueError):
        return None
    return allocator_in(maps)


def allocator_in(maps: str) -> str:
    """The malloc a process's memory map (``/proc/<pid>/maps``) shows it was linked with."""
    for name in ("tcmalloc", "jemalloc"):
        if f"/lib{name}" in maps:
            return name
    return "glibc"


def probe_bpf_marking() -> Optional[bool]:
    """Whether the ECN marking program loads, attaches and marks a frame: its self-test, run
    in a throw-away namespace. None when not root (cannot tell)."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return None
    try:
        done = subprocess.run(["unshare", "--net", sys.executable, "-m", "testbed.fabric.bpfmark"],
                              capture_output=True, text=True, timeout=30,
                              cwd=PROJECT_ROOT)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and done.stdout.strip() == "ok"


def rxe_module() -> str:
    """Whether the soft-RoCE driver is loaded, could be loaded, or is missing."""
    if os.path.exists("/sys/module/rdma_rxe"):
        return "loaded"
    try:
        dry = subprocess.run(["modprobe", "-n", "-q", "rdma_rxe"], capture_output=True,
                             timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "missing"
    return "available" if dry.returncode == 0 else "missing"

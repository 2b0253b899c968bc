"""What the runner tells the switch-queue emulator process: the fabric, the classes it acts
for, the rates, how marking is applied, where to report. A frozen dataclass, JSON on the wire
(``testbed.base.contract``); built by ``testbed.switchq.handle``, read by
``testbed.switchq.emulator``."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

from controllers.classes import TrafficClass

from ..base.contract import Contract
from ..base.topology import FabricPlan


@dataclass(frozen=True)
class EmulatorConfig(Contract):
    plan: FabricPlan
    classes: Tuple[TrafficClass, ...]
    interval_us: float  # the sample interval: the emulated reaction time
    mtu: int  # the links' MTU
    host_rate_mbit: float
    fabric_rate_mbit: float
    nic_queue_bytes: int
    out: str  # the report (JSON)
    timeline: str = ""  # the queue timeline (CSV); "" for none
    host_pids: Dict[str, int] = field(default_factory=dict)  # host -> its namespace's pid
    events: str = ""  # the controller's event socket; "" for none
    switch_rate_headroom: float = 0.0
    delayed: Tuple[str, ...] = ()  # interfaces with a netem delay line (their backlog lags)
    ecn_marking: Optional[str] = "sampled"  # sampled (here), red (the kernel), None (no ECN)
    marking_via: str = "openflow"  # sampled marking applied by bpf or openflow
    queue_counting: str = "netlink"  # the acting class's backlog from bpf counters or netlink
    watch: Optional[Dict[int, Tuple[int, ...]]] = None  # adaptive routing: dpid -> ports
    seed: int = 1
    # a split fabric: this server's nodes, who owns each node, and the PFC relay's sockets
    nodes: Tuple[str, ...] = ()
    server: str = ""
    owner: Dict[str, str] = field(default_factory=dict)
    pfc_listen: str = ""
    pfc_peers: Dict[str, str] = field(default_factory=dict)

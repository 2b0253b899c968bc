"""What the runner tells the switch-queue emulator process (the fabric, the classes it acts
for, the rates, how marking is applied, where to report) and what the emulator reports when it
stops. Frozen dataclasses, JSON on the wire (``testbed.base.contract``); the configuration
built by ``testbed.switchq.handle`` and read by ``testbed.switchq.emulator``, the report the
other way."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

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


@dataclass(frozen=True)
class EmulatorReport(Contract):
    """What the switch-queue emulator reports when it stops (its ``out`` file; emulated
    time). A split fabric's emulators, one per server, are merged into one
    (``testbed.switchq.handle.merge_reports``)."""
    interval_us: float = 0.0  # the sample interval
    acting_classes: Tuple[str, ...] = ()  # the classes whose backlog samples act on
    acting_backlog_from: str = ""  # how samples read it: bpf (kernel counters) or netlink
    quiet_below_bytes: int = 0  # every acting queue below this: samples spaced out
    quiet_samples_skipped: int = 0
    # how far the kernel counters were off at the full samples {min, p1, p50, p99, max, checks}
    counter_error_bytes: Optional[Dict[str, int]] = None
    all_classes_every_us: float = 0.0  # every class's backlog is read this often
    scheduling: str = "normal"  # how the process got the CPU
    counters: Dict[str, int] = field(default_factory=dict)
    # how long samples took and how far apart they started {mean, p99, max, max_gap, gap_p99,
    # gaps_over_3_intervals}
    sample_ms: Dict[str, float] = field(default_factory=dict)
    max_backlog: Dict[str, Dict[str, int]] = field(default_factory=dict)  # port: class: bytes
    ecn: Dict[str, Dict[str, float]] = field(default_factory=dict)  # port: toggles, marking_ms
    pfc: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # queue: node, events, paused_ms
    pfc_pause_events: int = 0
    pfc_paused_ms: float = 0.0
    credit: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # queue: node, waits, waited_ms
    credit_buffer_bytes: Optional[int] = None
    credit_waits: int = 0
    credit_wait_ms: float = 0.0
    # per lossless lane: flow_control, holds_above_bytes, buffer_bytes, holds, held_ms
    lanes: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    # each switch hop's forwarding time: {bucket: packets} (testbed.fabric.bpfforward)
    forwarding_histogram: Optional[Dict[str, int]] = None
    forwarding_note: Optional[str] = None
    # per GPU: its NIC's (paused ns, resumed ns) spans, for the fidelity monitor
    gpu_pauses_ns: Dict[str, Tuple[Tuple[int, int], ...]] = field(default_factory=dict)
    servers: int = 1  # the emulators reporting: one per server of a split fabric

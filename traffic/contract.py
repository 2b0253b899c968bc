"""What the runner tells an agent process: the GPUs it serves and where it writes their
records; and what an agent tells the runner of each GPU at the end (``AgentSummary``). Frozen
dataclasses, JSON on the wire (``to_dict`` / ``from_dict``: the one contract mechanism,
``testbed.base.contract``); built by pure functions in the runner
(``testbed.run.agent_processes.agent_configs``), read by ``traffic.agent``.

Times are emulated nanoseconds (the runner has applied the time scale); rates bit/s.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple, Union

from testbed.base.contract import Contract

from .jobgraph import JobGraph


@dataclass(frozen=True)
class QpLimiter:
    """DCQCN's per-QP rate limiters on the GPU NIC (``traffic.ratelimit``): the HTB qdisc of
    the class RoCE data travels in, and its QP classes' settings (``testbed.fabric.shaping``)."""
    major: int
    open_bytes: int
    burst: int
    quantum: int


@dataclass(frozen=True)
class Transport:
    """The NIC's RC transport and congestion control, the same for every GPU of a run."""
    congestion_control: str  # "dcqcn" or "none"
    qps_per_peer: int
    entropy: str  # "per-qp" or "per-packet"
    ack_every: int
    rto_ns: int  # the first retransmission timeout; it doubles per retry
    ack_timeout_ns: int  # up to the local ACK timeout (4.096 us x 2^ib_timeout, scaled)
    retry_limit: int  # the QP errors after this many local ACK timeouts without progress
    stall_ns: int  # or after this long without progress, if shorter: how long the run waits
    reorder_ns: int  # a fabric that may reorder a QP: how long a gap may wait before its NAK
    go_back_0: bool  # restart a message from its first packet on loss (the strawman)
    dcqcn_timer_ns: int
    dcqcn_byte_counter: int
    dcqcn_clamp_target: bool
    cnp_interval_ns: int
    roce_tos: int
    ack_tos: int
    cnp_tos: int
    qp_limiter: Optional[QpLimiter] = None  # None: no DCQCN, nothing to pace
    # entropy per-qp: a QP idle this long starts a new flowlet with a new UDP source port
    # (the policy's flowlet switching, scaled; 0: a QP keeps its port)
    flowlet_gap_ns: int = 0


@dataclass(frozen=True)
class WorkloadSpec:
    """One collective the GPU replays (a size sweep has one per size)."""
    collective: str
    size: int
    iterations: int
    chunks: int = 1
    group: int = 1  # GPUs per server, else per leaf (the hierarchical collective's groups)
    pxn: bool = False  # an all-to-all over PXN, on servers of ``group`` GPUs


@dataclass(frozen=True)
class Job:
    """A training job every GPU of the run replays: its iteration graph, in emulated time."""
    graph: JobGraph
    iterations: int


@dataclass(frozen=True)
class ScaleUp:
    """The server's scale-up domain (NVLink-class): a transfer between two GPUs of one server
    leaves the sender after its earlier scale-up transfers at ``ns_per_byte`` and arrives
    ``latency_ns`` later, without touching the Ethernet fabric (emulated time)."""
    ns_per_byte: float
    latency_ns: int


@dataclass(frozen=True)
class Compute:
    ns: int = 0  # each iteration's compute phase
    jitter_ns: int = 0


@dataclass(frozen=True)
class Straggler:
    delay_ns: int
    distribution: str  # "fixed", "uniform" or "exponential"
    probability: float


@dataclass(frozen=True)
class Peer:
    rank: int
    host: str
    ip: str
    mac: str
    delay_ns: int = 0  # what this GPU's RNIC holds a frame from this peer for (path delay)


@dataclass(frozen=True)
class GpuConfig(Contract):
    rank: int
    host: str
    intf: str
    ip: str
    mac: str
    ranks: int
    workloads: Tuple[WorkloadSpec, ...]
    mtu: int  # RoCE path MTU
    compute: Compute
    straggler: Optional[Straggler]
    seed: int
    transport: Transport
    link_rate_bps: float
    out_dir: str
    peers: Tuple[Peer, ...]
    netns_pid: int = 0  # the host's namespace, known once the fabric is up
    # the RNIC's delay line (traffic.delayline): each arriving frame is held for its peer's
    # delay_ns plus its own transmission at link_rate_bps
    delay_line: bool = False
    server: Tuple[int, ...] = ()  # the ranks of its server (itself included), if more than one
    scale_up: Optional[ScaleUp] = None  # how they reach each other


@dataclass(frozen=True)
class AgentConfig(Contract):
    """One agent process: its GPUs (one event loop serves them all), its records' folder and
    the job they replay instead of their collective workloads, if any. A server's GPUs are
    always in one process: their scale-up transfers are the loop's timers."""
    gpus: Tuple[GpuConfig, ...]
    out_dir: str
    job: Optional[Job] = None


# --- what the runner (and the mechanism tests) tell a flow process (traffic.flows) ----------

@dataclass(frozen=True)
class Bursts:
    """Synchronised bursts (an incast): ``packets`` each, every ``period_us`` from
    ``start_ns`` until ``duration_s`` has passed."""
    packets: int
    period_us: float
    duration_s: float
    start_ns: int = 0


@dataclass(frozen=True)
class FlowConfig(Contract):
    """One ``python -m traffic.flows send|recv`` process. A field left None takes its mode's
    default (RoCE sender: DSCP 26 with ECT(0), 4,096 B payloads back to back; UDP sender: DSCP
    0, 64 B every 1,000 us; receiver: 600 s)."""
    out: str  # where the summary goes (JSON)
    kind: str = "roce"  # senders: roce | udp
    start: str = ""  # "stdin": print ready, then wait for ``go <start_ns>``
    ip: str = ""  # receivers: the address to listen on
    duration_s: Optional[float] = None  # receivers: listen this long; udp: send this long
    intf: str = ""  # roce: the NIC
    src_mac: str = ""
    src_ip: str = ""
    dst_mac: str = ""
    dst_ip: str = ""
    sport: Union[int, str, None] = None  # roce: a port or "per-packet"; udp: bind to it
    dscp: Optional[int] = None
    ecn: Optional[int] = None
    dqpn: int = 0x10000
    payload: Optional[int] = None
    seed: int = 1
    packets: int = 0
    interval_us: Optional[float] = None  # pacing between packets
    rate_mbit: float = 0.0  # udp with duration_s: the rate
    start_ns: int = 0  # 0: now
    bursts: Optional[Bursts] = None


@dataclass(frozen=True)
class FlowsSent(Contract):
    """What a ``traffic.flows`` sender tells the runner (its ``out`` file)."""
    sent: int = 0
    bursts: int = 0  # a bursting sender's bursts
    send_errors: int = 0  # udp: datagrams the NIC's full queue refused


@dataclass(frozen=True)
class FlowSeen(Contract):
    """What a receiver saw of one flow: packets, of them CE-marked, and their one-way
    latencies (us) where the packet carried its send time."""
    packets: int = 0
    ce: int = 0
    latency_us: Tuple[float, ...] = ()


@dataclass(frozen=True)
class FlowsReceived(Contract):
    """What a ``traffic.flows`` receiver tells the runner: per flow (``<kind> <source ip>``)."""
    flows: Dict[str, FlowSeen] = field(default_factory=dict)


@dataclass(frozen=True)
class QpSeen(Contract):
    """What a QP in error saw last: its requester's counters."""
    acks: int = 0
    naks: int = 0
    timeouts: int = 0
    retransmitted: int = 0


@dataclass(frozen=True)
class QpFailure(Contract):
    """What NCCL's warning would name of a QP in error (``traffic.rnic.Rnic.qp_failure``)."""
    peer_rank: int
    peer_host: str
    qpn: int
    psn: int  # the oldest unacknowledged
    retries: int
    last_progress_ns: int  # since the job's start
    seen: QpSeen = QpSeen()


@dataclass(frozen=True)
class JobFailure(Contract):
    """A GPU's word that its job failed (``traffic.gpu.Gpu.fail``: the agent's ``failed``
    line; emulated ns since the job's start)."""
    reason: str  # retry-exceeded (a QP spent its retry budget) or stalled
    host: str
    rank: int
    iteration: int
    at_ns: int
    detail: str = ""
    no_progress_ns: int = 0
    status: Optional[str] = None  # the QP's work completion status, as NCCL reports it
    qp: Optional[QpFailure] = None  # the QP in error, if one was


@dataclass(frozen=True)
class LagSummary(Contract):
    """How late a loop acted on its timers (``traffic.metrics.LagHistogram.summary``): each
    quantile's upper bound, and the histogram's counts, which pool over agents."""
    count: int = 0
    p50_us: Optional[float] = None
    p95_us: Optional[float] = None
    p99_us: Optional[float] = None
    max_us: Optional[float] = None
    counts: Tuple[int, ...] = ()


@dataclass(frozen=True)
class AgentSummary(Contract):
    """What an agent writes of each GPU when its iterations are done (``<host>.summary.json``,
    ``traffic.records``; read by ``testbed.results.collect``)."""
    rank: int
    host: str
    # the GPU's counters and its RNIC's, its QPs' summed (req_*, resp_*): a counter never
    # incremented is absent (``counter``)
    counters: Dict[str, int] = field(default_factory=dict)
    rx_packets: int = 0  # data packets received
    # how late the loop acted on its timers, all kinds together and per kind
    loop_lag: Optional[LagSummary] = None
    loop_lag_by_timer: Dict[str, LagSummary] = field(default_factory=dict)
    first_start_lag_us: Optional[float] = None  # its first compute phase's timer, us late
    scheduling: str = "normal"  # how the agent process got the CPU (traffic.agent.on_time)
    # per peer rank: data frames, their bytes, control frames, their bytes sent
    frames_to: Dict[str, Tuple[int, ...]] = field(default_factory=dict)

    def counter(self, name: str) -> int:
        return self.counters.get(name, 0)

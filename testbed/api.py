"""The Python API for scenario tests: run a scenario, get a typed result.

    from testbed.api import run_scenario
    result = run_scenario("oversubscribed", policies=["hyperscale", "lossless"],
                          workload={"iterations": 2})
    assert result.policy("lossless").drops == 0
    assert result.policy("lossless").cct_us.p50 < result.policy("hyperscale").cct_us.p50

``run_scenario`` takes a built-in name, a YAML file, a mapping or a ``Scenario``, plus partial
overrides; ``load_result`` reads a saved run directory. Results are frozen dataclasses mirroring
``results.json`` (docs/results.md); every figure keeps its name and unit suffix from there, and
``raw`` holds the whole dictionary for anything not surfaced here. A counter whose mechanism
was absent (no ECN, no PFC, no DCQCN) is ``None``. Times are emulated, as in ``results.json``;
``modelled`` holds the same time figures in the modelled fabric's time (divided by the time
scale), which is what compares across machines and rates:

    assert result.policy("lossless").modelled.cct_us.p50 < 200  # us at 100 Gbit/s

Why one module over 400 lines: the typed results are one tree - run, policy, collective and
job figures, their modelled twins - whose field declarations are results.json's reference
(docs/results.md is generated from them); split, each figure's meaning would sit apart from
its neighbours.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple, Union

from .base.errors import ConfigError
from .results import breakdown
from .scenario.config import Scenario

OPERATIONS_CSV = (breakdown.FILE, breakdown.COLUMN_DOCS)  # a run's operations.csv: its columns


def _from(cls, data: Optional[Mapping[str, Any]]):
    """``cls`` from the keys of ``data`` it declares (absent ones: their default, None for a
    figure); None for None."""
    if data is None:
        return None
    values = {}
    for f in dataclasses.fields(cls):
        if f.name == "raw":
            values["raw"] = dict(data)
        elif f.name in data:
            v = data[f.name]
            values[f.name] = tuple(v) if isinstance(v, list) else v
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            values[f.name] = None
    return cls(**values)


@dataclass(frozen=True)
class Percentiles:
    p50: Optional[float] = None
    p99: Optional[float] = None
    p999: Optional[float] = None
    max: Optional[float] = None
    mean: Optional[float] = None
    count: Optional[int] = None


@dataclass(frozen=True)
class Cct:
    p50: Optional[float] = None
    p99: Optional[float] = None
    max: Optional[float] = None
    mean: Optional[float] = None
    per_iteration: Tuple[float, ...] = ()


@dataclass(frozen=True)
class Jitter:
    ipdv_abs_p50: Optional[float] = None
    ipdv_abs_p99: Optional[float] = None
    ipdv_abs_max: Optional[float] = None
    ipdv_count: Optional[int] = None
    p99_minus_p50: Optional[float] = None


@dataclass(frozen=True)
class StragglerIdle:
    per_iteration: Tuple[float, ...] = ()
    total: Optional[float] = None
    mean: Optional[float] = None


@dataclass(frozen=True)
class Modelled:
    """The time figures in the modelled fabric's time (results.json ``modelled``)."""
    cct_us: Optional[Cct] = None
    latency_us: Optional[Percentiles] = None
    jitter_us: Optional[Jitter] = None
    straggler_idle_us: Optional[StragglerIdle] = None
    pfc_paused_ms: Optional[float] = None
    latency_queueing_us: Optional[Percentiles] = None
    path_delay_us: Optional[Dict[str, float]] = None
    latency_floor_us: Optional[Dict[str, Optional[float]]] = None
    iteration_us: Optional[Cct] = None  # a training job's figures (below)
    job_compute_us: Optional[float] = None
    exposed_comm_us: Optional[Dict[str, float]] = None
    ideal_iteration_us: Optional[float] = None
    pipeline_bubble_us: Optional[float] = None
    network_cost_us: Optional[float] = None
    idle_gpu_us: Optional[float] = None

    @classmethod
    def parse(cls, d: Optional[Mapping[str, Any]]) -> Optional["Modelled"]:
        if not d:
            return None
        return cls(_from(Cct, d.get("cct_us")), _from(Percentiles, d.get("latency_us")),
                   _from(Jitter, d.get("jitter_us")),
                   _from(StragglerIdle, d.get("straggler_idle_us")), d.get("pfc_paused_ms"),
                   _from(Percentiles, d.get("latency_queueing_us")), d.get("path_delay_us"),
                   d.get("latency_floor_us"), _from(Cct, d.get("iteration_us")),
                   d.get("job_compute_us"), d.get("exposed_comm_us"),
                   d.get("ideal_iteration_us"), d.get("pipeline_bubble_us"),
                   d.get("network_cost_us"), d.get("idle_gpu_us"))


@dataclass(frozen=True)
class Fidelity:
    verdict: Optional[str] = None
    problems: Tuple[str, ...] = ()
    advice: Optional[str] = None
    checks: Optional[Dict[str, dict]] = None

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"


# the figures only a run of a training job writes (jobs: only with several jobs)
JOB_FIGURES = frozenset({"iteration_us", "job_compute_us", "exposed_comm_us",
                         "ideal_iteration_us", "pipeline_bubble_us", "network_cost_us",
                         "idle_gpu_us", "job", "jobs"})


def figure(doc: str, default: Any = None, unit: str = ""):
    """A field of results.json, with its meaning (docs/results.md is generated from these)."""
    return field(default=default, metadata={"doc": doc, "unit": unit})


@dataclass(frozen=True)
class CollectiveResult:
    """One collective at one size (``collectives[]``; a sweep has one per size). With a single
    size these figures are also at the policy's level."""
    collective: Optional[str] = figure("the collective's name")
    size_bytes: Optional[int] = figure("buffer size per GPU", unit="B")
    iterations: Optional[int] = figure("iterations replayed")
    ranks: Optional[int] = figure("GPUs taking part")
    cct_us: Optional[Cct] = figure(
        "collective completion time {p50, p99, max, mean, per_iteration}: last rank done minus "
        "first rank start", unit="us, emulated")
    latency_us: Optional[Percentiles] = figure(
        "one-way latency of every data packet {p50, p99, p999, max, mean, count}: the "
        "receiver's kernel receive time minus the sender's kernel transmit time",
        unit="us, emulated")
    jitter_us: Optional[Jitter] = figure(
        "IPDV (RFC 3393): difference of consecutive packets' one-way delays per flow, in send "
        "order {ipdv_abs_p50, ipdv_abs_p99, ipdv_abs_max, ipdv_count}; and p99_minus_p50, the "
        "latency spread", unit="us, emulated")
    tail_ratio_p99_p50: Optional[float] = figure("latency p99 / p50")
    algbw_gbps_emulated: Optional[float] = figure(
        "nccl-tests algorithm bandwidth from the median CCT", unit="Gbit/s")
    busbw_gbps_emulated: Optional[float] = figure(
        "nccl-tests bus bandwidth: algbw x busbw_factor", unit="Gbit/s")
    algbw_gbps_modelled: Optional[float] = figure("algbw x time scale", unit="Gbit/s")
    busbw_gbps_modelled: Optional[float] = figure("busbw x time scale", unit="Gbit/s")
    busbw_factor: Optional[float] = figure("nccl-tests' bus bandwidth factor of the collective")
    straggler_idle_us: Optional[StragglerIdle] = figure(
        "sum over ranks of (the slowest rank's finish - the rank's own finish) {per_iteration, "
        "total, mean}, a rank's finish being the end of its own work", unit="us, emulated")
    extrapolation: Optional[Dict[str, Any]] = figure(
        "the same mean lag on extrapolate_gpus GPUs: (N - 1) x lag GPU-seconds per step, "
        "emulated and modelled")
    bytes_sent_per_rank: Optional[Dict[str, Any]] = figure(
        "over the fabric, per iteration: {expected by the schedule, measured from delivered "
        "packets}", unit="B")
    scale_up_bytes_per_iteration: Optional[int] = figure(
        "bytes the collective moved inside servers (scale-up), per iteration", unit="B")
    packets_received: Optional[int] = figure("data packets of this collective received")
    retransmissions_received: Optional[int] = figure("of which retransmissions")
    ecn_marked_packets: Optional[int] = figure("of which CE-marked (null without ECN)")
    modelled: Optional[Modelled] = figure(
        "the time figures (latency_us, jitter_us, cct_us, straggler_idle_us) in the modelled "
        "fabric's time: emulated / time_scale")
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def parse(cls, d: Mapping[str, Any]) -> "CollectiveResult":
        c = _from(cls, d)
        return dataclasses.replace(
            c, cct_us=_from(Cct, d.get("cct_us")),
            latency_us=_from(Percentiles, d.get("latency_us")),
            jitter_us=_from(Jitter, d.get("jitter_us")),
            straggler_idle_us=_from(StragglerIdle, d.get("straggler_idle_us")),
            modelled=Modelled.parse(d.get("modelled")))


@dataclass(frozen=True)
class PolicyResult:
    """One policy's run (``policies.<name>``)."""
    name: str = field(metadata={"doc": "the policy (the key under policies)"})
    gpus: Optional[int] = figure("GPUs in the fabric")
    duration_s: Optional[float] = figure("wall time of the policy's run, build to teardown",
                                         unit="s")
    packets_sent: Optional[int] = figure(
        "data packets put on the wire, retransmissions included")
    packets_received: Optional[int] = figure("data packets that arrived")
    drops: Optional[int] = figure("packets_sent - packets_received")
    switch_queue_drops: Optional[int] = figure("drops counted by the switch ports' class FIFOs")
    nic_queue_drops: Optional[int] = figure("drops counted by the GPU NICs' class FIFOs")
    drops_by_port: Optional[Dict[str, Any]] = figure("those drops per port and class")
    queued_at_end: Optional[int] = figure(
        "frames still queued in switch ports or GPU NICs when the collectives had ended and the "
        "fabric had had up to 3 s to drain: in flight, not lost")
    unexplained_drops: Optional[int] = figure(
        "drops no emulated buffer, socket or queued_at_end accounts for (emulator artefacts; "
        "should be 0)")
    rx_socket_drops: Optional[int] = figure("frames the agents' receive sockets dropped")
    retransmitted_packets: Optional[int] = figure("go-back-N: packets sent again")
    naks: Optional[int] = figure("NAKs (PSN sequence errors) sent by receivers")
    rto_timeouts: Optional[int] = figure("retransmission timeouts")
    out_of_order_dropped: Optional[int] = figure(
        "packets a responder dropped while waiting for a missing PSN")
    ecn_marked_packets: Optional[int] = figure(
        "CE-marked data packets received (null: no ECN marking in this policy)")
    cnps_sent: Optional[int] = figure("CNPs sent by receivers (null: no DCQCN)")
    cnps_received: Optional[int] = figure("CNPs received by senders (null: no DCQCN)")
    dcqcn_min_rate_mbit: Optional[float] = figure(
        "the lowest rate a DCQCN rate limiter was set to", unit="Mbit/s, emulated")
    pfc_pause_events: Optional[int] = figure("PFC pauses sent (null: no PFC)")
    pfc_paused_ms: Optional[float] = figure(
        "time queues spent paused, summed (null: no PFC)", unit="ms, emulated")
    latency_us: Optional[Percentiles] = figure(
        "one-way latency of every data packet {p50, p99, p999, max, mean, count}",
        unit="us, emulated")
    latency_app_clock: Optional[int] = figure(
        "packets whose kernel transmit time was missing: their send time stood in")
    latency_queueing_us: Optional[Percentiles] = figure(
        "one-way latency less the modelled fixed path delay of each packet (its GPU pair's "
        "switch ports and cables, and its own transmission; null when path_delay is off): the "
        "queueing and forwarding measured on the packets", unit="us, emulated")
    path_delay_us: Optional[Dict[str, float]] = figure(
        "the modelled fixed path delay of a full data frame {same_leaf, cross_leaf}: switch "
        "ports, cables and its transmission, as applied (0 when path_delay is off)",
        unit="us, emulated")
    latency_floor_us: Optional[Dict[str, Optional[float]]] = figure(
        "the lowest one-way latency measured {same_leaf, cross_leaf} (null: no such pair "
        "carried traffic)", unit="us, emulated")
    jitter_us: Optional[Jitter] = figure(
        "IPDV {ipdv_abs_p50, ipdv_abs_p99, ipdv_abs_max, ipdv_count, p99_minus_p50}",
        unit="us, emulated")
    tail_ratio_p99_p50: Optional[float] = figure("latency p99 / p50")
    cct_us: Optional[Cct] = figure(
        "collective completion time {p50, p99, max, mean, per_iteration}", unit="us, emulated")
    algbw_gbps_emulated: Optional[float] = figure("nccl-tests algorithm bandwidth",
                                                  unit="Gbit/s")
    busbw_gbps_emulated: Optional[float] = figure("nccl-tests bus bandwidth", unit="Gbit/s")
    busbw_gbps_modelled: Optional[float] = figure("busbw x time scale", unit="Gbit/s")
    straggler_idle_us: Optional[StragglerIdle] = figure(
        "idle time the slowest rank caused {per_iteration, total, mean}", unit="us, emulated")
    extrapolation: Optional[Dict[str, Any]] = figure(
        "the straggler's cost on extrapolate_gpus GPUs, GPU-seconds per step")
    collectives: Tuple[CollectiveResult, ...] = figure(
        "one entry per collective and size (below); empty when a job ran", default=())
    iteration_us: Optional[Cct] = figure(
        "a training job's iteration time, first rank's start to last rank's end {p50, p99, "
        "max, mean, per_iteration}", unit="us, emulated")
    job_compute_us: Optional[float] = figure("a job's compute per GPU and iteration",
                                             unit="us, emulated")
    exposed_comm_us: Optional[Dict[str, float]] = figure(
        "a job's exposed communication per GPU and iteration: the time its compute stream "
        "waited, per kind it waited for (dp, tp, pp, ep, ...) and total", unit="us, emulated")
    ideal_iteration_us: Optional[float] = figure(
        "the job's iteration with free communication (its graph replayed)", unit="us, emulated")
    pipeline_bubble_us: Optional[float] = figure(
        "the free-network iteration's idle time per GPU (the pipeline bubble)",
        unit="us, emulated")
    network_cost_us: Optional[float] = figure("iteration p50 - ideal iteration",
                                              unit="us, emulated")
    idle_gpu_us: Optional[float] = figure("idle GPU time per iteration, summed over GPUs",
                                          unit="us, emulated")
    job: Optional[Dict[str, Any]] = figure(
        "a job's name, ranks, byte_scale, latency_share (per-message latency's share of fabric "
        "transfer time) and byte_scale_warning, exposed_share, bytes_per_iteration {fabric, "
        "scale_up} per kind, bytes_sent_per_rank {expected, measured}, "
        "full_size_iteration_ms_modelled, idle_gpu_seconds_on_n_gpus {gpus, modelled (as run), "
        "full_size (times the byte scale)} per iteration, and operations: per "
        "communication kind, collective, group and size its count, time p50 (modelled) and "
        "algbw/busbw (Gbit/s)")
    operations: Tuple[Dict[str, Any], ...] = figure(
        "the per-operation breakdown (operations.csv): per job, layer, kind (compute or the "
        "communication's kind), collective, group size and bytes: count, and per GPU and "
        "iteration compute_us, exposed_us (the compute stream's waits charged to it), comm_us "
        "(its spans), time_us_p50 of one op, algbw/busbw (Gbit/s)", unit="us, modelled",
        default=())
    jobs: Tuple[Dict[str, Any], ...] = figure(
        "several jobs on the fabric: each one's figures (the job figures above, its job and "
        "modelled; job.gpus names its GPUs); the figures above are the first one's",
        default=())
    modelled: Optional[Modelled] = figure(
        "the time figures in the modelled fabric's time (emulated / time_scale), pfc_paused_ms "
        "included: what the tables show and what compares across time scales")
    agents_reporting: Optional[int] = figure("agent processes whose records were read")
    agent_loop_lag_us: Optional[Dict[str, Any]] = figure(
        "how late the agents acted on their timers, pooled over agents; by_timer splits it by "
        "kind", unit="us")
    nic_backpressure_waits: Optional[int] = figure(
        "times an agent found its NIC's queue full and waited")
    rx_invalid: Optional[int] = figure(
        "frames the agents dropped as no valid RoCE packet of this run (truncated, unknown "
        "opcode, wrong source, forged probe header)")
    rx_bad_icrc: Optional[int] = figure("frames dropped for a wrong ICRC")
    rx_foreign_qp: Optional[int] = figure("frames for a QP the receiver does not have")
    rx_unexpected_messages: Optional[int] = figure("messages no transfer expects")
    rx_no_timestamp: Optional[int] = figure("frames received without a kernel timestamp")
    per_gpu: Optional[Dict[str, Any]] = figure(
        "per GPU: rank, packets sent and received, latency p50/p99 of what it received, timer "
        "lag, foreign packets")
    latency_us_by_path: Optional[Dict[str, Any]] = figure(
        "split fabrics only: latency percentiles between GPUs on one server and across servers "
        "(the latter include the servers' clock offset)", unit="us, emulated")
    spine_load_packets: Optional[Dict[str, int]] = figure("packets each spine forwarded")
    switch_queues: Optional[Dict[str, Any]] = figure(
        "the switch-queue emulator's report: per-queue pauses, marking time per port, largest "
        "backlog per port and class, sampling cost")
    reaction_time_us: Optional[float] = figure("the emulator's sample interval",
                                               unit="us, emulated")
    ecn_marking: Optional[str] = figure(
        "how switches set CE: red (kernel qdisc), sampled (the emulator), null (no ECN)")
    ecn_marking_via: Optional[str] = figure(
        "sampled marking applied by bpf (the tc program) or openflow (marking groups)")
    red_marked_by_port: Optional[Dict[str, int]] = figure("with RED: the CE marks each port set")
    per_hop_latency: Optional[Dict[str, Any]] = figure(
        "the per-hop model (forwarding, pipeline_ns, cable_m, time_scale), the mechanism that "
        "applied it (netem, nic: the receiving RNIC's delay line, off), the delay per port kind "
        "modelled and the part netem applied, applied (false: off), path_us_applied (the fixed "
        "path delay without the frame's transmission), transmission (whether each frame's own "
        "transmission was added), and measured_min_us {same_leaf, cross_leaf}")
    emulation_cost: Optional[Dict[str, Any]] = figure(
        "CPU per delivered frame by component (agents, Open vSwitch, emulator, controller, "
        "runner, kernel) and the CPUs' busy share while the traffic ran (testbed.run.cost)")
    fidelity: Optional[Fidelity] = figure(
        "the fidelity monitor's checks with measured values and tolerances, verdict (ok or "
        "outside tolerance), problems and advice (docs/fidelity.md)")
    background: Optional[Dict[str, Any]] = figure(
        "per noisy flow: sent, received, latency or rate and jitter; incast: bursts, packets "
        "sent and received by the target")
    pcap: Optional[Dict[str, Dict[str, Any]]] = figure(
        "measurement.pcap: per GPU, its capture file and the packets it holds")
    rxe: Optional[Dict[str, Any]] = figure(
        "--traffic rxe only: mode, endpoints, devices, and per perftest test the command, exit "
        "code, figures, the endpoint NICs' packet counters and error if it failed")
    params: Optional[Dict[str, Any]] = figure("the policy's parameters as run")
    traffic_classes: Tuple[str, ...] = figure("the policy's traffic classes", default=())
    congestion_control: Optional[str] = figure("dcqcn or none, as run")
    rto_us: Optional[float] = figure("the NICs' retransmission timeout as run (modelled us)")
    warnings: Tuple[str, ...] = figure(
        "anything that makes the figures less trustworthy", default=())
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def parse(cls, name: str, d: Mapping[str, Any]) -> "PolicyResult":
        p = _from(cls, dict(d, name=name))
        fid = d.get("fidelity")
        return dataclasses.replace(
            p, latency_us=_from(Percentiles, d.get("latency_us")),
            latency_queueing_us=_from(Percentiles, d.get("latency_queueing_us")),
            jitter_us=_from(Jitter, d.get("jitter_us")), cct_us=_from(Cct, d.get("cct_us")),
            iteration_us=_from(Cct, d.get("iteration_us")),
            straggler_idle_us=_from(StragglerIdle, d.get("straggler_idle_us")),
            collectives=tuple(CollectiveResult.parse(c) for c in d.get("collectives") or ()),
            fidelity=_from(Fidelity, fid) if fid else None,
            modelled=Modelled.parse(d.get("modelled")))

    def collective(self, size_bytes: Optional[int] = None) -> CollectiveResult:
        """The collective's figures (at ``size_bytes`` in a sweep)."""
        for c in self.collectives:
            if size_bytes is None or c.size_bytes == size_bytes:
                return c
        sizes = ", ".join(str(c.size_bytes) for c in self.collectives)
        raise KeyError(f"{self.name}: no collective of {size_bytes} B (sizes: {sizes})")


@dataclass(frozen=True)
class RunResult:
    run_dir: str
    status: str
    scenario: Scenario
    policies: Dict[str, PolicyResult]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    def policy(self, name: str) -> PolicyResult:
        if name not in self.policies:
            raise KeyError(f"policy {name!r} was not run (ran: {', '.join(self.policies)})")
        return self.policies[name]

    @classmethod
    def parse(cls, run_dir: str, d: Mapping[str, Any]) -> "RunResult":
        return cls(run_dir, d.get("status", "unknown"), Scenario.from_dict(d["scenario"]),
                   {n: PolicyResult.parse(n, p) for n, p in (d.get("policies") or {}).items()},
                   dict(d))


def load_result(run_dir: str) -> RunResult:
    """The result of a saved run (its ``results.json``)."""
    from .results.rundata import load_results

    data = load_results(run_dir)
    try:
        return RunResult.parse(run_dir, data)
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"{os.path.join(run_dir, 'results.json')}: not a testbed results "
                          f"file ({e})")


ScenarioLike = Union[str, Mapping[str, Any], Scenario]


def scenario_of(spec: ScenarioLike, policies=None, **overrides) -> Scenario:
    """A ``Scenario`` from a built-in name, a file, a mapping or a ``Scenario``, with overrides
    (partial sections, e.g. ``workload={"iterations": 2}``)."""
    from .scenario.catalog import find

    if isinstance(spec, Scenario):
        scenario = spec
    elif isinstance(spec, Mapping):
        scenario = Scenario.from_dict(spec)
    else:
        scenario = find(str(spec))
    if overrides:
        scenario = scenario.override(overrides)
    if policies:
        scenario = scenario.with_policies(policies)
    return scenario


def run_scenario(spec: ScenarioLike, policies=None, out_root: str = "results",
                 progress=lambda message: None, **overrides) -> RunResult:
    """Run a scenario on real fabrics (root and Open vSwitch needed) and return its result."""
    from .run import runner

    results, run_dir = runner.run(scenario_of(spec, policies, **overrides), out_root=out_root,
                                  progress=progress)
    return RunResult.parse(run_dir, results)

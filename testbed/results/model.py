"""The typed results of a run: every figure results.json holds, declared once.

The producers build these where the figures are made (``testbed.run.runner`` turns each
policy's figures into a ``PolicyResult`` with ``strict=True``: a figure nobody declared is an
error there, not a key a reader misses), results.json is written from ``to_json()``, and the
table, the report, the nccl-tests output and the API read attributes. docs/results.md is
generated from the declarations (their ``doc`` and ``unit``).

Time, one mechanism: a field is a time on the run's clock when its unit says so (``us,
emulated``) or its metadata (``time_field``: a time summary's percentiles, not its counts;
``time=True``: the records that hold times). ``in_modelled_time(scale)`` gives the view with
every such field divided by the time scale (what ``RunResult.policy`` returns; its
``emulated`` is the record as run), and results.json's ``modelled`` sections are that view's
figures, written beside the measured ones (``with_modelled``) for readers of the file.

Why one module over 400 lines: the results are one tree - run, policy, collective and job
figures, their modelled twins - whose field declarations are results.json's reference; split,
each figure's meaning would sit apart from its neighbours.
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, FrozenSet, Mapping, Optional, Tuple

from traffic.contract import QpSeen

from ..base.contract import ContractError, dump, load
from ..base.errors import ResultsError
from ..job.bytescale import BufferRegime, RecoveryRegime
from ..switchq.contract import EmulatorReport
from ..scenario.config import Scenario
from ..scenario.timescale import Calibration

NOT_JSON = {"json": False}  # a field of the object, not a key of results.json


def in_json(f: dataclasses.Field) -> bool:
    """Whether a record's field is a key of results.json (not ``NOT_JSON``)."""
    return f.metadata.get("json", True)


class Record:
    """A node of results.json: its keys are the dataclass fields (those without ``NOT_JSON``),
    read by the contract loader (``testbed.base.contract``) by their declared types."""

    OMITTED_WHEN_EMPTY: ClassVar[FrozenSet[str]] = frozenset()  # left out of JSON when None

    @classmethod
    def json_keys(cls) -> FrozenSet[str]:
        return frozenset(f.name for f in dataclasses.fields(cls) if in_json(f))

    @classmethod
    def from_json(cls, data: Optional[Mapping[str, Any]], where: str = "",
                  strict: bool = False, **extra):
        """The record of ``data`` (None for None). ``strict``: a key not declared is an error
        naming its path (a producer's bug); otherwise it is kept in ``raw`` only (a file of
        another version). ``extra``: the object's own fields (``NOT_JSON``)."""
        if data is None:
            return None
        try:
            record = load(cls, data, where or cls.__name__, strict)
        except ContractError as e:
            raise ResultsError(str(e)) from None
        return dataclasses.replace(record, **extra) if extra else record

    def to_json(self) -> Dict[str, Any]:
        """The record as results.json holds it (every declared key; ``OMITTED_WHEN_EMPTY``
        ones only when they have a value)."""
        out = {}
        for f in dataclasses.fields(self):
            if not in_json(f):
                continue
            value = getattr(self, f.name)
            if f.name in self.OMITTED_WHEN_EMPTY and (value is None or value == ()):
                continue
            out[f.name] = dump(value)
        return out

    def in_modelled_time(self, time_scale: float):
        """The same record with its time fields in the modelled fabric's time (emulated /
        ``time_scale``)."""
        changes = {f.name: modelled_time(getattr(self, f.name), time_scale)
                   for f in dataclasses.fields(self) if is_time(f)}
        return dataclasses.replace(self, **changes) if changes else self


class View(Record):
    """A record a reader gets in modelled time (a policy, a collective, a job): its view
    keeps the record as run (``emulated``) and writes that to results.json. A record of a
    file without modelled figures (``modelled`` None) stays as it was run."""

    def to_json(self) -> Dict[str, Any]:
        """What was measured: a view writes the record as run."""
        return super().to_json() if self.as_run is None else self.as_run.to_json()

    def in_modelled_time(self, time_scale: float):
        if self.as_run is not None or self.modelled is None:
            return self
        return dataclasses.replace(super().in_modelled_time(time_scale), as_run=self)

    @property
    def time(self) -> str:
        """Which time the time figures are in: modelled (a view) or emulated (as run)."""
        return "emulated" if self.as_run is None else "modelled"

    @property
    def emulated(self):
        """The as-run twin: time figures in emulated time, as results.json holds them."""
        return self.as_run or self


# A field holds time on the run's clock when its unit says so, or its metadata (the fields
# of a time summary, and the records that hold time figures: collectives, jobs, GPUs).
TIME_UNITS = ("us, emulated", "ms, emulated")
TIME = {"time": True}


def is_time(f: dataclasses.Field) -> bool:
    return bool(f.metadata.get("time")) or f.metadata.get("unit") in TIME_UNITS


def time_field(default: Any = None):
    return field(default=default, metadata=TIME)


def modelled_time(value: Any, time_scale: float) -> Any:
    """A time figure in the modelled fabric's time: a number divided by ``time_scale``, a
    sequence or mapping of them each, a record by its own time fields; None stays None."""
    if value is None:
        return None
    if isinstance(value, Record):
        return value.in_modelled_time(time_scale)
    if isinstance(value, (tuple, list)):
        return tuple(modelled_time(v, time_scale) for v in value)
    if isinstance(value, dict):
        return {k: modelled_time(v, time_scale) for k, v in value.items()}
    return round(value / time_scale, 9)


def figure_at(record: Optional[Record], name: str) -> Any:
    """A figure of a nested record (None when the record is)."""
    return None if record is None else getattr(record, name)


def entry_of(mapping: Optional[Mapping[str, Any]], key: str) -> Any:
    """An entry of a mapping figure (None when the figure is, or has no such entry)."""
    return None if not mapping else mapping.get(key)


@dataclass(frozen=True)
class Percentiles(Record):
    p50: Optional[float] = time_field()
    p99: Optional[float] = time_field()
    p999: Optional[float] = time_field()
    max: Optional[float] = time_field()
    mean: Optional[float] = time_field()
    count: Optional[int] = None


@dataclass(frozen=True)
class Cct(Record):
    p50: Optional[float] = time_field()
    p99: Optional[float] = time_field()
    max: Optional[float] = time_field()
    mean: Optional[float] = time_field()
    per_iteration: Tuple[float, ...] = time_field(())


@dataclass(frozen=True)
class Jitter(Record):
    ipdv_abs_p50: Optional[float] = time_field()
    ipdv_abs_p99: Optional[float] = time_field()
    ipdv_abs_max: Optional[float] = time_field()
    ipdv_count: Optional[int] = None
    p99_minus_p50: Optional[float] = time_field()


@dataclass(frozen=True)
class StragglerIdle(Record):
    per_iteration: Tuple[float, ...] = time_field(())
    total: Optional[float] = time_field()
    mean: Optional[float] = time_field()


@dataclass(frozen=True)
class Modelled(Record):
    """The time figures in the modelled fabric's time (results.json ``modelled``): what
    ``in_modelled_time`` gives, written beside the figures as run for readers of the file
    (``of``)."""
    cct_us: Optional[Cct] = None
    latency_us: Optional[Percentiles] = None
    jitter_us: Optional[Jitter] = None
    straggler_idle_us: Optional[StragglerIdle] = None
    pfc_paused_ms: Optional[float] = None
    credit_wait_ms: Optional[float] = None
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

    OMITTED_WHEN_EMPTY = frozenset({"cct_us", "latency_us", "jitter_us", "straggler_idle_us",
                                    "pfc_paused_ms", "credit_wait_ms", "latency_queueing_us",
                                    "path_delay_us",
                                    "latency_floor_us", "iteration_us", "job_compute_us",
                                    "exposed_comm_us", "ideal_iteration_us",
                                    "pipeline_bubble_us", "network_cost_us", "idle_gpu_us"})


@dataclass(frozen=True)
class Check(Record):
    """One check of the fidelity monitor (``testbed.run.fidelity``): ok (None: nothing to
    judge, ``note`` says why) and what it measured, with its tolerance. A figure the check
    could not measure is left out of results.json."""
    ok: Optional[bool] = None
    note: Optional[str] = None

    @classmethod
    def _measured(cls) -> FrozenSet[str]:
        return frozenset(f.name for f in dataclasses.fields(cls) if f.name != "ok")


@dataclass(frozen=True)
class InterDequeueCheck(Check):
    """Busy NICs pace frames one serialization time apart (deviations in frame times)."""
    busy_gaps: Optional[int] = None
    share_within_tolerance: Optional[float] = None
    tolerance: Optional[float] = None
    required_share: Optional[float] = None
    deviation_p10: Optional[float] = None
    deviation_p50: Optional[float] = None
    deviation_p90: Optional[float] = None
    paused_gaps_left_out: Optional[int] = None
    shaper_burst_bytes: Optional[int] = None
    shaper_run_ahead_us_max: Optional[float] = None


@dataclass(frozen=True)
class IdlePathCheck(Check):
    """What the emulator adds to a path apart from the queues it models (us)."""
    paths: Optional[int] = None
    destinations: Optional[int] = None
    overhead_from: Optional[str] = None  # forwarding (timed in the kernel) or latency floor
    overhead_us: Optional[float] = None
    allowed_overhead_us: Optional[float] = None
    forwarding_us: Optional[Dict[str, Any]] = None
    hops: Optional[int] = None
    min_latency_us_median: Optional[float] = None
    min_latency_us_worst: Optional[float] = None
    floor_overhead_us: Optional[float] = None
    overhead_us_worst: Optional[float] = None
    overhead_us_lowest: Optional[float] = None


@dataclass(frozen=True)
class CpuCheck(Check):
    """The machine's CPUs, sampled while the traffic ran (busy shares)."""
    samples: Optional[int] = None
    busy_mean: Optional[float] = None
    busy_p90: Optional[float] = None
    busy_max: Optional[float] = None
    allowed_busy_p90: Optional[float] = None
    headroom_p90: Optional[float] = None
    cpus: Optional[int] = None


@dataclass(frozen=True)
class TimerLag(Record):
    """How late the agents acted on one kind of timer (us)."""
    count: Optional[int] = None
    p50_us: Optional[float] = None
    p95_us: Optional[float] = None
    max_us: Optional[float] = None


@dataclass(frozen=True)
class AgentLoopLag(Record):
    """How late the agents acted on their timers, pooled over agents (us): each quantile's
    upper bound (``traffic.metrics.LagHistogram``), and per kind of timer."""
    count: Optional[int] = None
    p50_us: Optional[float] = None
    p95_us: Optional[float] = None
    p99_us: Optional[float] = None
    max_us: Optional[float] = None
    first_start_lag_us_max: Optional[float] = None  # the very first start, all ranks at once
    scheduling: Optional[str] = None  # how the agent processes got the CPU
    by_timer: Dict[str, TimerLag] = field(default_factory=dict)


@dataclass(frozen=True)
class LagCheck(Check):
    """How late the agents acted on their timers (us); by_timer per kind of timer."""
    p50_us: Optional[float] = None
    p95_us: Optional[float] = None
    p99_us: Optional[float] = None
    max_us: Optional[float] = None
    samples: Optional[int] = None
    allowed_p95_us: Optional[float] = None
    first_start_lag_us_max: Optional[float] = None
    scheduling: Optional[str] = None
    by_timer: Optional[Dict[str, TimerLag]] = None


@dataclass(frozen=True)
class DropsCheck(Check):
    """Packets lost outside every emulated buffer."""
    unexplained_drops: Optional[int] = None


for _check in (InterDequeueCheck, IdlePathCheck, CpuCheck, LagCheck, DropsCheck):
    _check.OMITTED_WHEN_EMPTY = _check._measured()


@dataclass(frozen=True)
class FidelityChecks(Record):
    inter_dequeue: Optional[InterDequeueCheck] = None
    idle_path_latency: Optional[IdlePathCheck] = None
    cpu: Optional[CpuCheck] = None
    agent_loop_lag: Optional[LagCheck] = None
    emulator_drops: Optional[DropsCheck] = None

    OMITTED_WHEN_EMPTY = frozenset({"inter_dequeue", "idle_path_latency", "cpu",
                                    "agent_loop_lag", "emulator_drops"})

    def items(self):
        """(name, check) of every check the run made."""
        return [(f.name, getattr(self, f.name)) for f in dataclasses.fields(self)
                if getattr(self, f.name) is not None]


@dataclass(frozen=True)
class Fidelity(Record):
    verdict: Optional[str] = None
    problems: Tuple[str, ...] = ()
    advice: Optional[str] = None
    checks: Optional[FidelityChecks] = None

    OMITTED_WHEN_EMPTY = frozenset({"advice"})

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"


@dataclass(frozen=True)
class Extrapolation(Record):
    """The straggler's cost on ``gpus`` GPUs (``traffic.metrics.extrapolate_idle``): each of
    the other gpus - 1 waits as long as a rank waited here on average, per step."""
    gpus: Optional[int] = None
    mean_lag_us_emulated: Optional[float] = None
    mean_lag_us_modelled: Optional[float] = None
    gpu_seconds_per_step_emulated: Optional[float] = None
    gpu_seconds_per_step_modelled: Optional[float] = None


@dataclass(frozen=True)
class PerHopLatency(Record):
    """The per-hop latency model of a policy and what applied it
    (``testbed.fabric.network.Fabric.hop_delays``, ``testbed.base.hops``)."""
    forwarding: Optional[str] = None  # store_and_forward or cut_through
    pipeline_ns: Optional[float] = None
    cable_m: Optional[float] = None
    extra_us: Optional[float] = None
    time_scale: Optional[float] = None
    mechanism: Optional[str] = None  # netem, nic (the receiving RNIC's delay line) or off
    delay_us_modelled: Dict[str, float] = field(default_factory=dict)  # per port kind
    delay_us_netem: Dict[str, float] = field(default_factory=dict)  # the part netem applied
    applied: Optional[bool] = None  # false: off
    path_us_applied: Dict[str, float] = field(default_factory=dict)  # same_leaf, cross_leaf
    transmission: Optional[bool] = None  # each frame's own transmission added
    measured_min_us: Dict[str, Optional[float]] = field(default_factory=dict)


@dataclass(frozen=True)
class EmulationCost(Record):
    """Where the machine's CPU went while the traffic ran (``testbed.run.cost.cost_report``):
    per component (agents, open_vswitch, emulator, controller, runner, kernel, other)."""
    window_s: Optional[float] = None  # the traffic's wall time
    frames_delivered: Optional[int] = None
    cpus: Optional[int] = None
    busy_share: Optional[float] = None  # CPU seconds / (window x CPUs)
    cpu_s: Dict[str, float] = field(default_factory=dict)
    in_kernel_s: Dict[str, float] = field(default_factory=dict)  # the system time of cpu_s
    us_per_frame: Dict[str, Optional[float]] = field(default_factory=dict)  # per delivered frame
    total_cpu_s: Optional[float] = None
    total_us_per_frame: Optional[float] = None  # None: no frame delivered
    agents_start_cpu_s: Optional[float] = None  # the agents' CPU before the traffic started


@dataclass(frozen=True)
class SwitchQueues(EmulatorReport, Record):
    """The switch-queue emulator's report as results.json holds it (``switch_queues``; the
    fields of ``testbed.switchq.contract.EmulatorReport``): the per-GPU pause spans and the
    raw forwarding histogram stay with the fidelity monitor, the forwarding time per hop is
    summarised (``forwarding_us``)."""
    gpu_pauses_ns: Dict[str, Tuple[Tuple[int, int], ...]] = field(default_factory=dict,
                                                                  metadata=NOT_JSON)
    forwarding_histogram: Optional[Dict[str, int]] = field(default=None, metadata=NOT_JSON)
    forwarding_us: Optional[Dict[str, Any]] = None

    @classmethod
    def of(cls, report: EmulatorReport, forwarding_us: Optional[dict]) -> "SwitchQueues":
        kept = {f.name: getattr(report, f.name) for f in dataclasses.fields(report)
                if f.name not in ("gpu_pauses_ns", "forwarding_histogram")}
        return cls(**kept, forwarding_us=forwarding_us)


@dataclass(frozen=True)
class FanInRound(Record):
    """A fan-in's figures (modelled; ``testbed.results.fanin``), or their mean over an
    iteration's fan-ins: Jain's index of the senders' throughputs, the receiver's throughput
    while all of them send (Gbit/s), that window's length and the whole fan-in's (us)."""
    jain: float = 1.0
    gbps_modelled: float = 0.0
    all_send_us: float = 0.0
    whole_us: float = 0.0


@dataclass(frozen=True)
class FanIn(Record):
    """A job's fan-ins of one communication kind (``fan_in.<kind>``): receivers, the most
    senders into one, the iterations with fan-ins and per such iteration its mean round."""
    receivers: int = 0
    senders: int = 0
    iterations: Tuple[int, ...] = ()
    per_iteration: Tuple[FanInRound, ...] = ()


@dataclass(frozen=True)
class RxeTest(Record):
    """One perftest test between the rxe endpoints (``rxe.tests.<test>``;
    ``testbed.fabric.rxe``): its client command, exit code, figures (perftest's columns;
    null: no result line), log, the clock that turned cycles into us, the runs it took, the
    endpoint NICs' packet counters, and why it failed."""
    command: str = ""
    exit_code: Optional[int] = None
    results: Optional[Dict[str, Optional[float]]] = None
    log: Optional[str] = None
    clock: Optional[Dict[str, Any]] = None
    error: Optional[str] = None
    uncalibrated: Optional[bool] = None  # failed for perftest's clock calibration
    attempts: Optional[int] = None  # runs it took (again when the clock was uncalibrated)
    nic_packets: Dict[str, int] = field(default_factory=dict)

    OMITTED_WHEN_EMPTY = frozenset({"clock", "error", "uncalibrated", "attempts"})


@dataclass(frozen=True)
class Rxe(Record):
    """``--traffic rxe``: the endpoints of the kernel's RoCE (rdma_rxe) and what perftest
    measured between them (``rxe``)."""
    mode: Optional[str] = None
    kernel: Optional[str] = None
    endpoints: Tuple[str, ...] = ()
    path: Optional[str] = None
    devices: Tuple[str, ...] = ()
    gid_index: Dict[str, int] = field(default_factory=dict)
    traffic_class: Optional[int] = None
    size_bytes: Optional[int] = None
    tests: Dict[str, RxeTest] = field(default_factory=dict)

    def figure(self, test: str, name: str) -> Any:
        """A figure of one test (None: not run or not measured; "failed")."""
        t = self.tests.get(test)
        if t is None:
            return None
        return "failed" if t.error else entry_of(t.results, name)


@dataclass(frozen=True)
class JobFailed(Record):
    """A policy's job failed (``job_failed``; ``traffic.contract.JobFailure`` in modelled
    us): who, which QP if one, what it saw, and one line as NCCL's warning would read."""
    reason: Optional[str] = None  # retry-exceeded or stalled
    host: Optional[str] = None
    rank: Optional[int] = None
    iteration: Optional[int] = None  # from 0
    detail: Optional[str] = None
    status: Optional[str] = None
    peer_rank: Optional[int] = None
    peer_host: Optional[str] = None
    qpn: Optional[int] = None
    psn: Optional[int] = None
    retries: Optional[int] = None
    seen: Optional[QpSeen] = None
    at_us: Optional[float] = None
    no_progress_us: Optional[float] = None
    last_progress_us: Optional[float] = None
    text: str = ""

    OMITTED_WHEN_EMPTY = frozenset({"peer_rank", "peer_host", "qpn", "psn", "retries", "seen",
                                    "last_progress_us"})


@dataclass(frozen=True)
class GpuFigures(Record):
    """One GPU's packets, the latency of what it received (us, emulated) and how late its
    agent acted (``per_gpu.<host>``)."""
    rank: Optional[int] = None
    packets_sent: Optional[int] = None
    packets_received: Optional[int] = None
    latency_us_p50: Optional[float] = time_field()
    latency_us_p99: Optional[float] = time_field()
    loop_lag_us_p99: Optional[float] = None  # the agent's own lag, not the fabric's time
    rx_foreign_qp: Optional[int] = None


@dataclass(frozen=True)
class BytesPerRank(Record):
    """Per rank, the payload one iteration sends over the fabric: as the schedule or job
    graph says, and as the receivers' packet records show it delivered (B)."""
    expected: Dict[str, int] = field(default_factory=dict)
    measured: Dict[str, Optional[int]] = field(default_factory=dict)


@dataclass(frozen=True)
class Operation(Record):
    """A job's communications of one kind, collective, group size and size: how many, the
    median time of one (us, modelled) and the bandwidths that reached (Gbit/s)."""
    kind: Optional[str] = None
    collective: Optional[str] = None
    group: Optional[int] = None
    bytes: Optional[int] = None
    count: Optional[int] = None
    time_us_p50: Optional[float] = None
    algbw_gbps: Optional[float] = None
    busbw_gbps: Optional[float] = None


@dataclass(frozen=True)
class IdleOnGpus(Record):
    """The idle GPU time per iteration on ``gpus`` GPUs (GPU-seconds, modelled): as run and
    times the byte scale (full size)."""
    gpus: Optional[int] = None
    modelled: Optional[float] = None
    full_size: Optional[float] = None


@dataclass(frozen=True)
class Job(Record):
    """A training job as run (``job``; in ``jobs[]``, each one's): its size and byte scale,
    the regimes its scaled messages keep, its traffic and operations."""
    name: Optional[str] = None
    ranks: Optional[int] = None
    byte_scale: Optional[float] = None
    exposed_share: Optional[float] = None
    bytes_per_iteration: Dict[str, Dict[str, int]] = field(default_factory=dict)
    full_size_iteration_ms_modelled: Optional[float] = None
    idle_gpu_seconds_on_n_gpus: Optional[IdleOnGpus] = None
    operations: Tuple[Operation, ...] = ()
    latency_share: Optional[float] = None
    byte_scale_warning: Optional[str] = None
    buffer_regime: Optional[BufferRegime] = None
    recovery_regime: Optional[RecoveryRegime] = None
    gpus: Tuple[int, ...] = ()
    bytes_sent_per_rank: Optional[BytesPerRank] = None


def figure(doc: str, default: Any = None, unit: str = "", time: bool = False):
    """A field of results.json, with its meaning (docs/results.md is generated from these);
    ``time``: records whose own time fields the modelled view converts."""
    return field(default=default, metadata={"doc": doc, "unit": unit, "time": time})


@dataclass(frozen=True)
class CollectiveResult(View):
    """One collective at one size (``collectives[]``; a sweep has one per size)."""
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
    extrapolation: Optional[Extrapolation] = figure(
        "the same mean lag on extrapolate_gpus GPUs: (N - 1) x lag GPU-seconds per step, "
        "emulated and modelled")
    bytes_sent_per_rank: Optional[BytesPerRank] = figure(
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
    as_run: Optional[Any] = field(default=None, repr=False, compare=False, metadata=NOT_JSON)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False,
                                metadata=NOT_JSON)


@dataclass(frozen=True)
class JobResult(View):
    """A training job's figures (``jobs[]``: one per job on the fabric, in the scenario's
    order; ``job.gpus`` names its GPUs)."""
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
    job: Optional[Job] = figure(
        "a job's name, ranks, byte_scale, latency_share (per-message latency's share of fabric "
        "transfer time), buffer_regime (a QP's median message at this byte scale against the "
        "smallest RoCE buffer of a switch port: message_bytes, buffer_bytes, ratio, "
        "full_size_ratio, kept), recovery_regime (the same against what a QP sends in one "
        "retransmission timeout, the longest of the lossy policies without congestion control: "
        "message_bytes, recovery_bytes, ratio, full_size_ratio, kept; ratio null when there is "
        "none) and byte_scale_warning, exposed_share, bytes_per_iteration {fabric, scale_up} "
        "per kind, bytes_sent_per_rank {expected, measured}, "
        "full_size_iteration_ms_modelled, idle_gpu_seconds_on_n_gpus {gpus, modelled (as run), "
        "full_size (times the byte scale)} per iteration, and operations: per "
        "communication kind, collective, group and size its count, time p50 (modelled) and "
        "algbw/busbw (Gbit/s)")
    fan_in: Optional[Dict[str, FanIn]] = figure(
        "its fan-ins (several GPUs writing to one at once; empty: none), per "
        "communication kind: receivers, senders (most into one), iterations and "
        "per_iteration (mean over its "
        "fan-ins: receivers, and rounds of one op per sender): jain (Jain's index of the "
        "senders' throughputs), gbps_modelled (the receiver's throughput while all of them "
        "send), all_send_us (the last one's start to the first one's end) and whole_us (first "
        "start to last end), modelled")
    modelled: Optional[Modelled] = figure(
        "the time figures (iteration_us, job_compute_us, exposed_comm_us, ideal_iteration_us, "
        "pipeline_bubble_us, network_cost_us, idle_gpu_us) in the modelled fabric's time: "
        "emulated / time_scale")
    as_run: Optional[Any] = field(default=None, repr=False, compare=False, metadata=NOT_JSON)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False,
                                metadata=NOT_JSON)


# what results/2 also wrote at a policy's level: the figures of its one collective, its
# first job's (results/3 keeps them in collectives[] and jobs[] only; ``PolicyResult``
# reads them from there)
COLLECTIVE_FIGURES = ("cct_us", "algbw_gbps_emulated", "busbw_gbps_emulated",
                      "busbw_gbps_modelled", "straggler_idle_us", "extrapolation")
JOB_FIGURES = tuple(f.name for f in dataclasses.fields(JobResult)
                    if in_json(f) and f.name != "modelled")


@dataclass(frozen=True)
class PolicyResult(View):
    """One policy's run (``policies.<name>``)."""
    name: str = field(default="", metadata={
        "doc": "the policy, or a variant's label (the key under policies)", "json": False})
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
    link_losses: Optional[int] = figure(
        "packets the lossy links lost (topology.lossy_links; null: none), control included")
    link_losses_by_port: Optional[Dict[str, Any]] = figure(
        "what each end of a lossy link lost: RoCE data and other packets")
    queued_at_end: Optional[int] = figure(
        "frames still queued in switch ports or GPU NICs when the collectives had ended and the "
        "fabric had had up to 3 s to drain: in flight, not lost")
    unexplained_drops: Optional[int] = figure(
        "drops no emulated buffer, lossy link, socket or queued_at_end accounts for (emulator "
        "artefacts; should be 0)")
    rx_socket_drops: Optional[int] = figure("frames the agents' receive sockets dropped")
    retransmitted_packets: Optional[int] = figure("go-back-N: packets sent again")
    naks: Optional[int] = figure("NAKs (PSN sequence errors) sent by receivers")
    rto_timeouts: Optional[int] = figure("retransmission timeouts")
    out_of_order_dropped: Optional[int] = figure(
        "packets a responder dropped while waiting for a missing PSN")
    new_flowlets: Optional[int] = figure(
        "flowlets senders started with a new UDP source port after idling longer than the "
        "policy's flowlet gap (lossless: flowlet_gap_us), each placed anew by adaptive routing")
    ecn_marked_packets: Optional[int] = figure(
        "CE-marked data packets received (null: no ECN marking in this policy)")
    cnps_sent: Optional[int] = figure("CNPs sent by receivers (null: no DCQCN)")
    cnps_received: Optional[int] = figure("CNPs received by senders (null: no DCQCN)")
    dcqcn_min_rate_mbit: Optional[float] = figure(
        "the lowest rate a DCQCN rate limiter was set to", unit="Mbit/s, emulated")
    pfc_pause_events: Optional[int] = figure("PFC pauses sent (null: no PFC)")
    pfc_paused_ms: Optional[float] = figure(
        "time queues spent paused, summed (null: no PFC)", unit="ms, emulated")
    credit_waits: Optional[int] = figure(
        "times a queue stopped to wait for credits: the next hop's lane had no room for what "
        "it could send (null: no credits; policy_params.lossless.flow_control)")
    credit_wait_ms: Optional[float] = figure(
        "time queues spent waiting for credits, summed; per queue in switch_queues.credit "
        "(null: no credits)", unit="ms, emulated")
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
    collectives: Tuple[CollectiveResult, ...] = figure(
        "one entry per collective and size (below); empty when a job ran", default=(),
        time=True)
    operations: Tuple[Dict[str, Any], ...] = figure(
        "the per-operation breakdown (operations.csv): per job, layer, kind (compute or the "
        "communication's kind), collective, group size and bytes: count, and per GPU and "
        "iteration compute_us, exposed_us (the compute stream's waits charged to it), comm_us "
        "(its spans), time_us_p50 of one op, algbw/busbw (Gbit/s)", unit="us, modelled",
        default=())
    jobs: Tuple[JobResult, ...] = figure(
        "a training job's figures, one entry per job on the fabric (below); absent when "
        "collectives ran", default=(), time=True)
    modelled: Optional[Modelled] = figure(
        "the time figures in the modelled fabric's time (emulated / time_scale), pfc_paused_ms "
        "and credit_wait_ms included: what the tables show and what compares across time "
        "scales")
    agents_reporting: Optional[int] = figure("agent processes whose records were read")
    agent_loop_lag_us: Optional[AgentLoopLag] = figure(
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
    per_gpu: Optional[Dict[str, GpuFigures]] = figure(
        "per GPU: rank, packets sent and received, latency p50/p99 of what it received, timer "
        "lag, foreign packets", time=True)
    latency_us_by_path: Optional[Dict[str, Optional[Percentiles]]] = figure(
        "split fabrics only: latency percentiles between GPUs on one server and across servers "
        "(the latter include the servers' clock offset)", unit="us, emulated")
    spine_load_packets: Optional[Dict[str, int]] = figure("packets each spine forwarded")
    switch_queues: Optional[SwitchQueues] = figure(
        "the switch-queue emulator's report (servers: the emulators reporting, one per server "
        "of a split fabric): the RoCE lane's per-queue pauses (pfc) or credit "
        "waits (credit); per lossless lane (lanes: RoCE's, and under credits the CNPs' own) "
        "its flow control, threshold, buffer, holds and held_ms; marking time per port, "
        "largest backlog per port and class, sampling cost; forwarding_us: the switches' "
        "forwarding time per hop, timed in the kernel on every RoCE packet {hops, bucket_us, "
        "p10_us, p50_us, p90_us, p99_us} (emulated; null where the kernel could not, "
        "forwarding_note says why)")
    reaction_time_us: Optional[float] = figure("the emulator's sample interval",
                                               unit="us, emulated")
    ecn_marking: Optional[str] = figure(
        "how switches set CE: red (kernel qdisc), sampled (the emulator), null (no ECN)")
    ecn_marking_via: Optional[str] = figure(
        "sampled marking applied by bpf (the tc program) or openflow (marking groups)")
    red_marked_by_port: Optional[Dict[str, int]] = figure("with RED: the CE marks each port set")
    per_hop_latency: Optional[PerHopLatency] = figure(
        "the per-hop model (forwarding, pipeline_ns, cable_m, time_scale), the mechanism that "
        "applied it (netem, nic: the receiving RNIC's delay line, off), the delay per port kind "
        "modelled and the part netem applied, applied (false: off), path_us_applied (the fixed "
        "path delay without the frame's transmission), transmission (whether each frame's own "
        "transmission was added), and measured_min_us {same_leaf, cross_leaf}")
    emulation_cost: Optional[EmulationCost] = figure(
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
    rxe: Optional[Rxe] = figure(
        "--traffic rxe only: mode, endpoints, devices, and per perftest test the command, exit "
        "code, figures, the endpoint NICs' packet counters and error if it failed")
    policy: Optional[str] = figure("the policy run (for a variant: the policy its label runs)")
    params: Optional[Dict[str, Any]] = figure("the policy's parameters as run")
    traffic_classes: Tuple[str, ...] = figure("the policy's traffic classes", default=())
    congestion_control: Optional[str] = figure("dcqcn or none, as run")
    rto_us: Optional[float] = figure("the NICs' retransmission timeout as run (modelled us)")
    retry_budget: Optional[Dict[str, Any]] = figure(
        "how long a QP may go without progress before it errors: ack_timeout_us (4.096 us x "
        "2^transport.ib_timeout), retry_limit, budget_us (their product), budget_emulated_s "
        "(the same on this run's clock), stall_limit_us (the budget, or how long the run can "
        "wait if shorter) and reachable (false: no QP can spend its budget in this run)",
        unit="us, modelled")
    job_failed: Optional[JobFailed] = figure(
        "the job failed under this policy (null: it did not): reason (retry-exceeded: a QP "
        "spent its retry budget and completed with status IBV_WC_RETRY_EXC_ERR, as NCCL "
        "reports it; stalled: no progress for as long as the run waits, the budget not spent, "
        "its outcome unknown), host, rank, and for a QP peer_host, peer_rank, qpn, psn (the "
        "oldest unacknowledged), retries, last_progress_us, seen {acks, naks, timeouts, "
        "retransmitted}; iteration (from 0), at_us, no_progress_us, detail and text (one "
        "line). The figures above count the iterations finished before it",
        unit="us, modelled")
    warnings: Tuple[str, ...] = figure(
        "anything that makes the figures less trustworthy", default=())
    as_run: Optional[Any] = field(default=None, repr=False, compare=False, metadata=NOT_JSON)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False,
                                metadata=NOT_JSON)

    # figures a run writes only where they apply: split fabrics, jobs, one collective
    OMITTED_WHEN_EMPTY = frozenset({"latency_us_by_path", "jobs"})

    @classmethod
    def from_json(cls, data: Optional[Mapping[str, Any]], where: str = "",
                  strict: bool = False, **extra):
        """As ``Record.from_json``; a file of results/2 (its first collective's and job's
        figures also at the policy's level) is read as results/3 (``upgraded``)."""
        return super().from_json(data if strict or data is None else upgraded(data), where,
                                 strict, **extra)

    @property
    def only_collective(self) -> Optional[CollectiveResult]:
        """The collective of a run of one collective at one size (None otherwise)."""
        return self.collectives[0] if len(self.collectives) == 1 else None

    @property
    def first_job(self) -> Optional[JobResult]:
        return self.jobs[0] if self.jobs else None


    def collective(self, size_bytes: Optional[int] = None) -> CollectiveResult:
        """The collective's figures (at ``size_bytes`` in a sweep)."""
        for c in self.collectives:
            if size_bytes is None or c.size_bytes == size_bytes:
                return c
        sizes = ", ".join(str(c.size_bytes) for c in self.collectives)
        raise KeyError(f"{self.name}: no collective of {size_bytes} B (sizes: {sizes})")


# the figures of the one collective run (None in a sweep or a job) and of the first job, read
# at the policy under their names
for _name in COLLECTIVE_FIGURES:
    setattr(PolicyResult, _name,
            property(lambda self, n=_name: figure_at(self.only_collective, n)))
for _name in JOB_FIGURES:
    setattr(PolicyResult, _name, property(lambda self, n=_name: figure_at(self.first_job, n)))


def upgraded(policy: Mapping[str, Any]) -> Dict[str, Any]:
    """A policy of results.json as results/3 holds it: results/2 also wrote its one
    collective's figures (``COLLECTIVE_FIGURES``) and its first job's (``JOB_FIGURES``) at
    the policy's level, a single job nowhere else; those move into ``collectives[]`` and
    ``jobs[]``, with their modelled twins."""
    d = dict(policy)
    modelled = dict(d.get("modelled") or {})

    def moved(names) -> Dict[str, Any]:
        out = {k: d.pop(k) for k in names if k in d}
        twins = {k: modelled.pop(k) for k in names if k in modelled}
        if twins:
            out["modelled"] = twins
        return out

    collective, job = moved(COLLECTIVE_FIGURES), moved(JOB_FIGURES)
    if collective and not d.get("collectives"):
        d["collectives"] = [collective]  # a file that held the one collective only here
    if job and not d.get("jobs"):
        d["jobs"] = [job]
    if "modelled" in d:
        d["modelled"] = modelled
    return d


def with_modelled(record: View, time_scale: float) -> View:
    """``record`` as run with its ``modelled`` section (``Modelled``'s fields of its view in
    modelled time), and so each collective's and job's: what results.json holds."""
    changes = {}
    for name in ("collectives", "jobs"):
        if name in record.__dataclass_fields__:
            changes[name] = tuple(with_modelled(r, time_scale) for r in getattr(record, name))
    record = dataclasses.replace(record, modelled=None, **changes)
    view = dataclasses.replace(record, modelled=Modelled()).in_modelled_time(time_scale)
    mine = set(record.__dataclass_fields__)
    return dataclasses.replace(record, modelled=Modelled(**{
        f.name: getattr(view, f.name) for f in dataclasses.fields(Modelled) if f.name in mine}))


@dataclass(frozen=True)
class CpuWakeup(Record):
    """The PM QoS request a run held to keep idle CPUs quick to wake
    (``testbed.run.wakeup``): held, the latency asked, the kernel's cpuidle driver, and why
    it was not held or changes nothing."""
    held: bool = False
    max_latency_us: Optional[int] = None
    cpuidle_driver: Optional[str] = None
    note: Optional[str] = None

    OMITTED_WHEN_EMPTY = frozenset({"note"})


@dataclass(frozen=True)
class RejectedAttempt(Record):
    """A run at ``auto`` the fidelity monitor rejected before this one
    (``testbed.scenario.timescale.Attempt``)."""
    host_rate_mbit: Optional[float] = None
    problems: Dict[str, Tuple[str, ...]] = field(default_factory=dict)  # per rejected policy
    kept_in: Optional[str] = None  # its directory, relative to the run's


@dataclass(frozen=True)
class TimeScaleChoice(Record):
    """How the run's GPU NIC rate was chosen (``testbed.scenario.timescale.Choice``)."""
    host_rate_mbit: Optional[float] = None
    chosen_by: Optional[str] = None  # auto (from the calibration) or scenario
    predicted_busy: Optional[float] = None
    target_busy: Optional[float] = None
    fits_mbit: Optional[float] = None
    warning: Optional[str] = None
    learned_cap_mbit: Optional[float] = None
    workload_hops: Optional[float] = None
    attempts: Tuple[RejectedAttempt, ...] = ()
    calibration: Optional[Calibration] = None


@dataclass(frozen=True)
class RunResult:
    """A run: its scenario, status and each policy's result (``policies``: in modelled time
    when the run has modelled figures, each one's ``emulated`` as run), and what results.json
    says about the run as a whole."""
    run_dir: str
    status: str
    scenario: Scenario
    policies: Dict[str, PolicyResult]
    time_scale: float = 1.0
    modelled: bool = False  # the policies' time figures are the modelled fabric's
    run_id: Optional[str] = None
    started: Optional[str] = None
    finished: Optional[str] = None
    version: Optional[str] = None
    schema: Optional[str] = None
    error: Optional[str] = None
    time_scale_choice: Optional[TimeScaleChoice] = None  # docs/results.md, top level
    time_scale_not_scaled: Tuple[str, ...] = ()
    capabilities: Optional[Dict[str, Any]] = None
    link_emulation: Optional[Dict[str, Any]] = None
    cluster: Optional[Dict[str, Any]] = None
    cpu_wakeup: Optional[CpuWakeup] = None
    teardown_leftovers_removed: Tuple[str, ...] = ()
    superseded: Optional[str] = None  # in a rejected attempt's copy: why it was run again
    # with scenario.repeat > 1: each policy's later runs (policies holds the first), and the
    # headline figures over all of them {figure: {median, min, max, values}}, modelled
    repeats: Dict[str, Tuple[PolicyResult, ...]] = field(default_factory=dict)
    spread: Dict[str, Dict[str, Dict[str, Any]]] = field(default_factory=dict)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    # the run-level keys of results.json besides scenario, status, policies and repeats
    TOP = ("run_id", "started", "finished", "version", "schema", "error", "time_scale_choice",
           "time_scale_not_scaled", "capabilities", "link_emulation", "cluster", "cpu_wakeup",
           "teardown_leftovers_removed", "superseded")
    FILE_KEYS = TOP + ("status", "time_scale", "spread")  # read by type; not policies

    def runs(self, name: str) -> Tuple[PolicyResult, ...]:
        """Every run of a policy (``repeat``), the first first."""
        return (self.policy(name),) + self.repeats.get(name, ())

    def policy(self, name: str) -> PolicyResult:
        if name not in self.policies:
            raise KeyError(f"policy {name!r} was not run (ran: {', '.join(self.policies)})")
        return self.policies[name]

    @classmethod
    def of(cls, run_dir: str, d: Mapping[str, Any], policies: Mapping[str, PolicyResult],
           repeats: Mapping[str, Tuple[PolicyResult, ...]]) -> "RunResult":
        """The run of results.json's run-level keys ``d`` and its policies as run: in modelled
        time when every policy has modelled figures."""
        hints = typing.get_type_hints(cls)
        try:  # the run-level keys the file has, by their declared types
            top = {k: load(hints[k], v, k, strict=False) for k, v in d.items()
                   if k in cls.FILE_KEYS and v is not None}
        except ContractError as e:
            raise ResultsError(str(e)) from None
        scale = top.pop("time_scale", None) or 1.0
        modelled = bool(policies) and all(p.modelled for p in policies.values())
        if modelled:
            policies = {n: p.in_modelled_time(scale) for n, p in policies.items()}
            repeats = {n: tuple(p.in_modelled_time(scale) for p in runs)
                       for n, runs in repeats.items()}
        return cls(run_dir, top.pop("status", "unknown"), Scenario.from_dict(d["scenario"]),
                   dict(policies), scale, modelled, repeats=dict(repeats), raw=dict(d), **top)

    @classmethod
    def from_json(cls, run_dir: str, d: Mapping[str, Any]) -> "RunResult":
        policies = {n: PolicyResult.from_json(p, f"policies.{n}", name=n)
                    for n, p in (d.get("policies") or {}).items()}
        repeats = {n: tuple(PolicyResult.from_json(p, f"repeats.{n}[{k}]", name=n)
                            for k, p in enumerate(runs))
                   for n, runs in (d.get("repeats") or {}).items()}
        return cls.of(run_dir, d, policies, repeats)

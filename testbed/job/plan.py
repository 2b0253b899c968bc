"""A scenario's training job as the graph its GPUs replay, pure: the model and parallelism
its ``workload.job`` section names, the byte scale that fits an iteration into the emulation,
and the estimate of an iteration's time that chooses it.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Dict, List, Optional, Tuple

from traffic.collectives import KINDS, bus_bandwidth_factor
from traffic.jobgraph import (COMM, COMPUTE, Comm, JobGraph, Op, comm_transfers, replay,
                              same_server, with_pxn)

from ..base.errors import ConfigError
from ..base.topology import FabricPlan
from . import aicb, chakra, graphfile
from .bytescale import (HONEST_LATENCY_SHARE, MESSAGE_LATENCY_US, RECOVERY_STRETCH,
                        BufferRegime, RecoveryRegime, auto_byte_scale, buffer_regime,
                        latency_share, recovery_bytes, recovery_regime, recovery_scale,
                        roce_ports, step_down)
from .build import Parallelism, build, check_parallelism
from .model import PRESETS, GpuModel, Model

SHAPE_KEYS = ("layers", "hidden", "heads", "seq_len", "vocab", "experts", "top_k")


@dataclass(frozen=True)
class JobPlan:
    graph: JobGraph  # modelled ns, bytes divided by byte_scale
    byte_scale: float
    full_iteration_ns: float  # the estimate at full size, modelled
    latency_share: float  # per-message latency's share of fabric transfer time at byte_scale
    warning: str = ""  # why the byte scale may change the answer, if it may
    parts: Tuple["JobPart", ...] = ()  # the jobs, each on its GPUs
    regime: BufferRegime = BufferRegime()  # messages against the fabric's buffers
    recovery: RecoveryRegime = RecoveryRegime()  # ... against a timeout's sending

    @property
    def model(self) -> Optional[Model]:
        """The first job's model (None for a job from a file)."""
        return self.parts[0].model

    @property
    def parallelism(self) -> Optional[Parallelism]:
        return self.parts[0].parallelism


def model_of(job) -> Model:
    """The preset with the scenario's overrides, or a custom model from them alone."""
    given = {k: getattr(job, k) for k in SHAPE_KEYS}
    unset = {"vocab": -1, "experts": -1}
    if job.model == "custom":
        missing = [k for k in SHAPE_KEYS[:4] if not given[k]]
        if missing:
            raise ConfigError(f"workload.job: a custom model needs {', '.join(missing)}")
        vocab = max(0, given["vocab"])
        experts = max(0, given["experts"])
        return Model("custom", given["layers"], given["hidden"], given["heads"],
                     given["seq_len"], vocab, experts, given["top_k"] or (2 if experts else 0))
    base = PRESETS[job.model]
    changes = {k: v for k, v in given.items() if v != unset.get(k, 0)}
    if changes.get("experts") == 0:
        changes["top_k"] = 0
    return dataclasses.replace(base, **changes)


def parallelism_of(job, gpus: int) -> Parallelism:
    dp = job.dp or max(1, gpus // (job.tp * job.pp))
    return Parallelism(dp=dp, tp=job.tp, pp=job.pp, ep=job.ep, micro_batches=job.micro_batches,
                       micro_batch_size=job.micro_batch_size,
                       bucket_bytes=int(job.bucket_mb * (1 << 20)),
                       bytes_per_element=job.bytes_per_element, dp_collective=job.dp_collective)


def check_fits(scenario) -> None:
    """ConfigError unless the scenario's jobs fit their models (or files) and the fabric."""
    w = scenario.workload
    if w.job.enabled and w.jobs:
        raise ConfigError("workload: give job or jobs, not both")
    jobs = w.all_jobs
    gpus = scenario.topology.gpus
    for k, job in enumerate(jobs):
        where = "workload.job" if w.job.enabled else f"workload.jobs[{k}]"
        if job.model and job.file:
            raise ConfigError(f"{where}: give model or file, not both")
        if not job.enabled:
            raise ConfigError(f"{where}: give a model or a file")
    for job, ranks in zip(jobs, job_ranks(jobs, gpus)):
        if job.file:
            graph = load_file(job.file, job.format, job.comm_groups)
            if graph.ranks != len(ranks):
                raise ConfigError(f"workload.job.file: {job.file} has {graph.ranks} ranks, "
                                  f"the job {len(ranks)} GPUs")
        else:
            check_parallelism(model_of(job), parallelism_of(job, len(ranks)), len(ranks))


def load_file(path: str, fmt: str = "auto", groups: str = "") -> JobGraph:
    """A job's graph from a file (modelled ns, full size), checked."""
    stamp = tuple(os.stat(p).st_mtime_ns for p in (path, groups) if p and os.path.exists(p))
    return _load_file(path, fmt, groups, stamp)


@lru_cache(maxsize=8)
def _load_file(path: str, fmt: str, groups: str, _stamp) -> JobGraph:
    if fmt == "auto":
        fmt = ("graph" if path.endswith((".yaml", ".yml", ".json")) else
               "aicb" if _starts_with(path, aicb.MAGIC) else "chakra")
    if fmt == "graph":
        return graphfile.load(path)
    return graphfile.checked(aicb.load(path) if fmt == "aicb" else chakra.load(path, groups),
                             path)


def _starts_with(path: str, magic: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(magic)) == magic.encode()
    except OSError:
        return False


def scaled_bytes(graph: JobGraph, byte_scale: float) -> JobGraph:
    """Every comm's size and compute span divided by ``byte_scale``."""
    if byte_scale == 1:
        return graph
    comms = tuple(dataclasses.replace(c, size=max(len(c.group), int(c.size / byte_scale)))
                  for c in graph.comms)
    return dataclasses.replace(graph.scaled(1 / byte_scale), comms=comms)


def comm_cost(scenario) -> Callable[[Comm], int]:
    """A comm's modelled ns on an idle fabric: its bytes on the busiest link of a rank at the
    scale-up rate inside a server, else the fabric's (no latency, no congestion)."""
    t = scenario.topology
    per_server = t.gpus_per_server

    def cost(comm: Comm) -> int:
        kind = KINDS[comm.collective]
        n = len(comm.group)
        factor = bus_bandwidth_factor(kind, n) if kind != "sendrecv" else 1.0
        inside = all(same_server(r, comm.group[0], per_server) for r in comm.group)
        gbyte_s = t.scale_up_gbyte_s if inside else t.modelled_rate_gbit / 8
        return int(comm.size * factor / gbyte_s)  # bandwidth only: the idle fabric's floor

    return cost


def iteration_ns(graph: JobGraph, scenario) -> float:
    """An iteration's modelled time when every comm takes its idle-fabric cost."""
    return replay(graph, lambda r, op: op.ns, comm_cost(scenario)).end


@dataclass(frozen=True)
class JobPart:
    """One job of a scenario, on its GPUs."""
    name: str
    ranks: Tuple[int, ...]  # the fabric's ranks it runs on, in the job's rank order
    model: Optional[Model]  # None for a job from a file
    parallelism: Optional[Parallelism]


def plan_job(scenario, byte_scale: Optional[float] = None) -> Optional[JobPlan]:
    """The scenario's jobs (None without one) as one graph over the fabric's GPUs, at one
    byte scale: the given one, else the jobs' number, else ``auto``: the 1-2-5 step that brings
    an iteration near ``iteration_s`` of emulated time, lowered until the scaled messages are
    honest. GPUs no job uses stay idle."""
    jobs = scenario.workload.all_jobs
    if not jobs:
        return None
    gpus = scenario.topology.gpus
    parts, fulls, builders = [], [], []
    for job, ranks in zip(jobs, job_ranks(jobs, gpus)):
        if job.file:
            full = load_file(job.file, job.format, job.comm_groups)
            builders.append(lambda s, full=full: scaled_bytes(full, s))
            parts.append(JobPart(full.name, ranks, None, None))
        else:
            model, par = model_of(job), parallelism_of(job, len(ranks))
            gpu = GpuModel(job.gpu_tflops, job.gpu_efficiency)
            full = build(model, par, gpu)
            builders.append(lambda s, m=model, p=par, g=gpu: build(m, p, g, s))
            parts.append(JobPart(model.name, ranks, model, par))
        fulls.append(full)
    def on_fabric(graphs: List[JobGraph]) -> JobGraph:
        """The jobs' graphs as one over the fabric's GPUs, all-to-alls over PXN if asked."""
        g = merge(graphs, [p.ranks for p in parts], gpus)
        return with_pxn(g, scenario.topology.gpus_per_server) if scenario.workload.pxn else g

    whole = on_fabric(fulls)
    full_ns = iteration_ns(whole, scenario)
    sizes = fabric_messages(whole, scenario)
    rate = scenario.topology.modelled_rate_gbit
    per_qp = [s / scenario.transport.qps_per_peer for s in sizes]
    ports = roce_ports(scenario)
    buffer = min((p.buffer_bytes for p in ports), default=None)
    recovery = recovery_bytes(scenario, ports)
    first = jobs[0]
    if byte_scale is None and first.byte_scale != "auto":
        byte_scale = float(first.byte_scale)
    chosen = byte_scale is None  # by auto
    if chosen:
        byte_scale = auto_byte_scale(full_ns * scenario.time_scale / 1e9, first.iteration_s)
        while byte_scale > 1 and (latency_share(sizes, byte_scale, rate) > HONEST_LATENCY_SHARE
                                  or not buffer_regime(per_qp, byte_scale, buffer).kept):
            byte_scale = step_down(byte_scale)
        # beyond RECOVERY_STRETCH: the faster run, warned about
        byte_scale = recovery_scale(per_qp, byte_scale, recovery,
                                    floor=byte_scale / RECOVERY_STRETCH)
    share = latency_share(sizes, byte_scale, rate)
    regime = buffer_regime(per_qp, byte_scale, buffer)
    resend = recovery_regime(per_qp, byte_scale, recovery)
    warnings = []
    if byte_scale > 1 and share > HONEST_LATENCY_SHARE:  # at full size it is the job's own
        warnings.append(
            f"byte scale {byte_scale:,g}: per-message latency ({MESSAGE_LATENCY_US:g} us) "
            f"takes {share:.0%} of the fabric's transfer time, against "
            f"{latency_share(sizes, 1, rate):.0%} at full size: the scaled job's "
            "communication is latency-bound where the real one is not")
    if not regime.kept:
        warnings.append(
            f"byte scale {byte_scale:,g}: a QP's median message is {regime.ratio:.2g}x the "
            f"smallest RoCE buffer of the run's switches ({buffer:,} B), against "
            f"{regime.full_size_ratio:.3g}x at full size: scaled messages fit buffers the "
            "real ones overflow")
    if not resend.kept:
        warnings.append(
            f"byte scale {byte_scale:,g}: a QP's median message is {resend.ratio:.2g}x what it "
            f"sends in one retransmission timeout on a lossy fabric ({recovery:,.0f} B), against "
            f"{resend.full_size_ratio:.3g}x at full size: go-back-N resends less per loss "
            "than the real job would")
    advice = " (lower workload.job.byte_scale, or leave it auto)"
    if chosen and not resend.kept:  # the only rule auto may leave unkept: say what would
        keeps = recovery_scale(per_qp, byte_scale, recovery)
        advice = (f" (auto stopped at {byte_scale:,g} to keep the run short; "
                  f"workload.job.byte_scale: {keeps:,g} keeps it, for about "
                  f"{byte_scale / keeps:,.3g}x the run time)")
    warning = "; ".join(warnings) + (advice if warnings else "")
    graph = whole if byte_scale == 1 else on_fabric([b(byte_scale) for b in builders])
    return JobPlan(graph, byte_scale, full_ns, share, warning, tuple(parts), regime, resend)


def job_size(job, gpus: int) -> int:
    """How many GPUs a job takes: its ranks, its file's ranks, or dp x tp x pp (dp 0: the
    whole fabric)."""
    if job.ranks:
        return len(job.ranks)
    if job.file:
        return load_file(job.file, job.format, job.comm_groups).ranks
    return job.dp * job.tp * job.pp if job.dp else gpus


def job_ranks(jobs, gpus: int) -> List[Tuple[int, ...]]:
    """The fabric's ranks each job runs on: its own ``ranks``, else the next free ones in
    order; ConfigError when they overlap or do not exist."""
    taken: Dict[int, int] = {}
    out = []
    for k, job in enumerate(jobs):
        where = "workload.job" if len(jobs) == 1 else f"workload.jobs[{k}]"
        if job.ranks:
            ranks = tuple(job.ranks)
        else:
            n = job_size(job, gpus if len(jobs) == 1 else 0)
            if n == 0:
                raise ConfigError(f"{where}: with several jobs, give each its ranks or dp")
            ranks = tuple([r for r in range(gpus) if r not in taken][:n])
            if len(ranks) < n:
                raise ConfigError(f"{where}: needs {n} GPUs, {len(ranks)} are free")
        bad = [r for r in ranks if not 0 <= r < gpus]
        if bad or len(set(ranks)) != len(ranks):
            raise ConfigError(f"{where}.ranks: {list(ranks)} are not distinct GPUs of the "
                              f"fabric's {gpus}")
        for r in ranks:
            if r in taken:
                raise ConfigError(f"{where}.ranks: GPU {r} is already job {taken[r]}'s")
            taken[r] = k
        out.append(ranks)
    return out


def merge(graphs: List[JobGraph], ranks: List[Tuple[int, ...]], gpus: int) -> JobGraph:
    """Several jobs' graphs as one over the fabric's ranks (GPUs no job uses idle)."""
    if len(graphs) == 1 and ranks[0] == tuple(range(gpus)):
        return graphs[0]
    programs: List[Tuple[Op, ...]] = [(Op(COMPUTE, "idle"),)] * gpus
    comms: List[Comm] = []
    for g, where in zip(graphs, ranks):
        base = len(comms)
        comms += [dataclasses.replace(c, group=tuple(where[r] for r in c.group))
                  for c in g.comms]
        for local, prog in enumerate(g.programs):
            programs[where[local]] = tuple(
                dataclasses.replace(op, comm=op.comm + base) if op.kind == COMM else op
                for op in prog)
    return JobGraph(tuple(programs), tuple(comms), " + ".join(g.name for g in graphs))


def fabric_messages(graph: JobGraph, scenario) -> List[float]:
    """The sizes of the transfers one iteration sends over the fabric (bytes, unscaled). A
    transfer split over several QPs still waits for one path latency: its parts go at once."""
    per_server = scenario.topology.gpus_per_server
    return [nbytes for comm in graph.comms for src, dst, nbytes in comm_transfers(comm)
            if not same_server(src, dst, per_server)]


def switch_hops(scenario) -> float:
    """The switches a byte of the scenario's workload crosses on the fabric, byte-weighted (1
    within a leaf, 3 across: leaf, spine, leaf; a server's own transfers stay on its
    scale-up domain): what Open vSwitch forwards per byte a NIC sends, against the ring the
    machine was calibrated with (pure)."""
    plan = FabricPlan.for_topology(scenario.topology)
    leaf = {h.rank: h.leaf for h in plan.gpus}
    per_server = scenario.topology.gpus_per_server
    job = plan_job(scenario, byte_scale=1.0)
    comms = (job.graph.comms if job else
             [Comm(scenario.workload.collective, tuple(range(scenario.topology.gpus)),
                   scenario.workload.size_bytes)])
    weighted = total = 0.0
    for comm in comms:
        for src, dst, nbytes in comm_transfers(comm):
            if job and same_server(src, dst, per_server):
                continue
            weighted += nbytes * (1 if leaf[src] == leaf[dst] else 3)
            total += nbytes
    return weighted / total if total else 1.0

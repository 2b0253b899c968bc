"""A scenario's training job as the graph its GPUs replay, pure: the model and parallelism
its ``workload.job`` section names, the byte scale that fits an iteration into the emulation,
and the estimate of an iteration's time that chooses it.
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, List, Optional

from traffic.collectives import KINDS, bus_bandwidth_factor
from traffic.jobgraph import Comm, JobGraph, collective_of, replay

from ..base.errors import ConfigError
from . import aicb, chakra, graphfile
from .build import Parallelism, build, validate
from .model import PRESETS, GpuModel, Model

SHAPE_KEYS = ("layers", "hidden", "heads", "seq_len", "vocab", "experts", "top_k")
# A message's fixed one-way latency across leaves in the modelled fabric: the hop model's
# store-and-forward Ethernet path at 100 Gbit/s (docs/fabric.md; measured 2.29 us)
MESSAGE_LATENCY_US = 2.5
# A byte scale is honest while per-message latency takes at most this share of the fabric's
# transfer times (byte-weighted): scaled messages stay bandwidth-dominated, as at full size
HONEST_LATENCY_SHARE = 0.1


@dataclass(frozen=True)
class JobPlan:
    graph: JobGraph  # modelled ns, bytes divided by byte_scale
    byte_scale: float
    model: Optional[Model]  # None for a job from a file
    parallelism: Optional[Parallelism]
    full_iteration_ns: float  # the estimate at full size, modelled
    latency_share: float  # per-message latency's share of fabric transfer time at byte_scale
    warning: str = ""  # why the byte scale may change the answer, if it may


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
    """ConfigError unless the scenario's job fits its model (or file) and fabric."""
    job = scenario.workload.job
    gpus = scenario.topology.gpus
    if job.model and job.file:
        raise ConfigError("workload.job: give model or file, not both")
    if job.file:
        graph = load_file(job.file, job.format, job.comm_groups)
        if graph.ranks != gpus:
            raise ConfigError(f"workload.job.file: {job.file} has {graph.ranks} ranks, the "
                              f"fabric {gpus} GPUs")
    elif job.model:
        validate(model_of(job), parallelism_of(job, gpus), gpus)


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
        inside = len({r // per_server for r in comm.group}) == 1
        gbyte_s = t.scale_up_gbyte_s if inside else t.modelled_rate_gbit / 8
        return int(comm.size * factor / gbyte_s)  # bandwidth only: the idle fabric's floor

    return cost


def iteration_ns(graph: JobGraph, scenario) -> float:
    """An iteration's modelled time when every comm takes its idle-fabric cost."""
    return replay(graph, lambda r, op: op.ns, comm_cost(scenario)).end


def ideal_ns(graph: JobGraph) -> float:
    """An iteration's modelled time with free communication: the compute model's."""
    return replay(graph, lambda r, op: op.ns, lambda comm: 0).end


def plan_job(scenario, byte_scale: Optional[float] = None) -> Optional[JobPlan]:
    """The scenario's job (None without one) at its byte scale: the given one, else the
    scenario's number, else ``auto``: the 1-2-5 step that brings an iteration near
    ``iteration_s`` of emulated time, lowered until the scaled messages are honest."""
    job = scenario.workload.job
    if not job.enabled:
        return None
    model = par = None
    if job.file:
        full = load_file(job.file, job.format, job.comm_groups)
    else:
        model = model_of(job)
        par = parallelism_of(job, scenario.topology.gpus)
        gpu = GpuModel(job.gpu_tflops, job.gpu_efficiency)
        full = build(model, par, gpu)
    full_ns = iteration_ns(full, scenario)
    sizes = fabric_messages(full, scenario)
    rate = scenario.topology.modelled_rate_gbit
    if byte_scale is None and job.byte_scale != "auto":
        byte_scale = float(job.byte_scale)
    if byte_scale is None:
        byte_scale = auto_byte_scale(full_ns * scenario.time_scale / 1e9, job.iteration_s)
        while byte_scale > 1 and latency_share(sizes, byte_scale, rate) > HONEST_LATENCY_SHARE:
            byte_scale = step_down(byte_scale)
    share = latency_share(sizes, byte_scale, rate)
    warning = ""
    if share > HONEST_LATENCY_SHARE:
        warning = (f"byte scale {byte_scale:,g}: per-message latency ({MESSAGE_LATENCY_US:g} us) "
                   f"takes {share:.0%} of the fabric's transfer time, against "
                   f"{latency_share(sizes, 1, rate):.0%} at full size: the scaled job's "
                   "communication is latency-bound where the real one is not (lower "
                   "workload.job.byte_scale, or leave it auto)")
    graph = (scaled_bytes(full, byte_scale) if model is None or byte_scale == 1
             else build(model, par, gpu, byte_scale))
    return JobPlan(graph, byte_scale, model, par, full_ns, share, warning)


def fabric_messages(graph: JobGraph, scenario) -> List[float]:
    """The sizes of the transfers one iteration sends over the fabric (bytes, unscaled). A
    transfer split over several QPs still waits for one path latency: its parts go at once."""
    per_server = scenario.topology.gpus_per_server
    out = []
    for comm in graph.comms:
        g = comm.group
        out += [t.nbytes for t in collective_of(comm).transfers
                if g[t.src] // per_server != g[t.dst] // per_server]
    return out


def latency_share(sizes: List[float], byte_scale: float, rate_gbit: float) -> float:
    """Byte-weighted share of a message's time its fixed latency takes, at ``byte_scale``."""
    if not sizes:
        return 0.0
    lat, total, weighted = MESSAGE_LATENCY_US * 1000, 0.0, 0.0
    for size in sizes:
        scaled = max(1.0, size / byte_scale)
        wire = scaled * 8 / rate_gbit  # ns
        total += scaled
        weighted += scaled * lat / (lat + wire)
    return weighted / total


def auto_byte_scale(emulated_s: float, target_s: float) -> float:
    """The 1-2-5 step at or above ``emulated_s / target_s`` (at least 1)."""
    want = emulated_s / target_s
    if want <= 1:
        return 1.0
    decade = 10 ** math.floor(math.log10(want))
    return float(next(decade * m for m in (1, 2, 5, 10) if decade * m >= want))


def step_down(scale: float) -> float:
    """The 1-2-5 step below ``scale``."""
    decade = 10 ** math.floor(math.log10(scale) + 1e-9)
    mantissa = scale / decade
    lower = [m for m in (1, 2, 5) if m < mantissa - 1e-9]
    return float(decade * lower[-1] if lower else decade / 2)

"""A scenario's training job as the graph its GPUs replay, pure: the model and parallelism
its ``workload.job`` section names, the byte scale that fits an iteration into the emulation,
and the estimate of an iteration's time that chooses it.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Optional

from traffic.collectives import KINDS, bus_bandwidth_factor
from traffic.jobgraph import Comm, JobGraph, replay

from ..base.errors import ConfigError
from .build import Parallelism, build, validate
from .model import PRESETS, GpuModel, Model

SHAPE_KEYS = ("layers", "hidden", "heads", "seq_len", "vocab", "experts", "top_k")


@dataclass(frozen=True)
class JobPlan:
    graph: JobGraph  # modelled ns, bytes divided by byte_scale
    byte_scale: float
    model: Model
    parallelism: Parallelism
    full_iteration_ns: float  # the estimate at full size, modelled


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
    """ConfigError unless the scenario's job fits its model and fabric."""
    job = scenario.workload.job
    if job.enabled:
        gpus = scenario.topology.gpus
        validate(model_of(job), parallelism_of(job, gpus), gpus)


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
        return int(comm.size * factor / gbyte_s)

    return cost


def iteration_ns(graph: JobGraph, scenario) -> float:
    """An iteration's modelled time when every comm takes its idle-fabric cost."""
    return replay(graph, lambda r, op: op.ns, comm_cost(scenario)).end


def ideal_ns(graph: JobGraph) -> float:
    """An iteration's modelled time with free communication: the compute model's."""
    return replay(graph, lambda r, op: op.ns, lambda comm: 0).end


def plan_job(scenario, byte_scale: Optional[float] = None) -> Optional[JobPlan]:
    """The scenario's job (None without one) at its byte scale: the given one, else the
    scenario's number, else ``auto``: the power of ten (or 2x, 5x one) that brings an
    iteration near ``iteration_s`` of emulated time."""
    job = scenario.workload.job
    if not job.enabled:
        return None
    model = model_of(job)
    par = parallelism_of(job, scenario.topology.gpus)
    gpu = GpuModel(job.gpu_tflops, job.gpu_efficiency)
    full = build(model, par, gpu)
    full_ns = iteration_ns(full, scenario)
    if byte_scale is None:
        byte_scale = (float(job.byte_scale) if job.byte_scale != "auto" else
                      auto_byte_scale(full_ns * scenario.time_scale / 1e9, job.iteration_s))
    graph = full if byte_scale == 1 else build(model, par, gpu, byte_scale)
    return JobPlan(graph, byte_scale, model, par, full_ns)


def auto_byte_scale(emulated_s: float, target_s: float) -> float:
    """The 1-2-5 step at or above ``emulated_s / target_s`` (at least 1)."""
    want = emulated_s / target_s
    if want <= 1:
        return 1.0
    decade = 10 ** math.floor(math.log10(want))
    return next(decade * m for m in (1, 2, 5, 10) if decade * m >= want)

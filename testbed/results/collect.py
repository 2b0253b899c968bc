"""Results: gather the agents' records into per-policy figures (the runner types them).

Layout of a run directory (``results/<run-id>/``)::

    results.json                 the figures below, per policy (schema RESULTS_SCHEMA; typed
                                 and written by testbed.results.model)
    operations.csv               the per-operation breakdown (testbed.results.breakdown)
    timeline-<policy>.json       the run as a Chrome trace (testbed.results.trace)
    controller-<policy>.log      the os-ken controller's log
    agent-<policy>-<k>.log       each agent process's log (it serves several GPUs)
    records/<policy>/<host>.packets.csv     one row per data packet that arrived
    records/<policy>/<host>.tx.csv          kernel transmit time of every frame it sent
    records/<policy>/<host>.iterations.csv  one row per iteration: compute, collective start
                                            and end
    records/<policy>/<host>.ops.csv         one row per transfer sent or received
    records/<policy>/<host>.spans.csv       one row per op of each iteration (compute span
                                            or communication; a job's figures come from them)
    records/<policy>/<host>.events.csv      retransmission timeouts and NAKs: when, to whom
    records/<policy>/<host>.qps.csv         DCQCN: each QP's rate over time, bytes sent
    records/<policy>/<host>.summary.json    the agent's counters and timer lag

``results.json`` is written atomically (temporary file + rename), so a reader never sees half
of it.
"""
from __future__ import annotations

from collections import Counter, defaultdict
import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from traffic import collectives, metrics
from traffic.jobgraph import collective_graph, collective_of, same_server
from traffic.contract import AgentSummary, WorkloadSpec

from . import breakdown, trace
from .fanin import fan_in
from .jobfigures import (compute_waits, fabric_bytes_sent, job_figures, ops_by_rank_iteration,
                         waited_for)
from .model import AgentLoopLag, BytesPerRank, FanIn, JobResult, TimerLag
from .packets import Packets, packets_and_gpus, read_csv, read_summaries, record_rows

# results/3: a collective's and a job's figures only in collectives[] and jobs[]
RESULTS_SCHEMA = "ai-fabric-testbed/results/3"


@dataclass
class Mechanisms:
    """Which counters mean something under a policy: absent ones are reported as null."""

    ecn: bool = True
    pfc: bool = True
    cnp: bool = True
    credit: bool = False  # InfiniBand's credits in place of PFC


@dataclass
class RunContext:
    """What ``collect`` needs to know about the run besides the records."""

    ranks: int
    workloads: Sequence[WorkloadSpec]  # as the agents got them (plan.policyrun.workload_specs)
    time_scale: float = 1.0
    extrapolate_gpus: int = 10_000
    mechanisms: Mechanisms = field(default_factory=Mechanisms)
    job: Optional[object] = None  # the training job replayed (testbed.job.plan.JobPlan)
    gpus_per_server: int = 1


def collect(records_dir: str, ctx: RunContext) -> Tuple[dict, "Packets"]:
    """Per-policy figures from the records the agents wrote into ``records_dir``.

    One-way latency of a packet = the receiver's kernel receive time - the sender's kernel
    transmit time (joined on the send time the packet carries); for a packet whose transmit
    time is missing, the send time itself stands in (counted in ``latency_app_clock``).
    """
    summaries = read_summaries(records_dir)
    packets, per_gpu, app_clock = packets_and_gpus(records_dir, summaries)
    iterations = _rows(records_dir, summaries, "iterations")
    counters: Counter = sum((Counter(s.counters) for s in summaries), Counter())
    rates = [float(r["rate_bps"]) for s in summaries
             for r in record_rows(records_dir, s.host, "qps")]
    sent = counters["tx_packets"] + counters["retransmitted"]
    received = int(packets.src.size)
    m = ctx.mechanisms
    figures = {
        "agents_reporting": len(summaries),
        "latency_app_clock": app_clock,
        **packets.latency_figures(),
        "packets_sent": sent,
        "packets_received": received,
        "drops": sent - received,
        "retransmitted_packets": counters["retransmitted"],
        "naks": counters["naks_sent"],
        "rto_timeouts": counters["timeouts"],
        "out_of_order_dropped": counters["resp_out_of_order_dropped"],
        "new_flowlets": counters["flowlets"],
        "ecn_marked_packets": counters["rx_ce"] if m.ecn else None,
        "cnps_sent": counters["cnps_sent"] if m.cnp else None,
        "cnps_received": counters["cnps_received"] if m.cnp else None,
        "dcqcn_min_rate_mbit": round(min(rates) / 1e6, 3) if rates else None,
        "rx_socket_drops": counters["rx_socket_drops"],
        "rx_invalid": counters["rx_invalid"],
        "rx_bad_icrc": counters["rx_bad_icrc"],
        "rx_unexpected_messages": counters["rx_unexpected_messages"],
        "rx_foreign_qp": counters["rx_foreign_qp"],
        "rx_no_timestamp": counters["rx_no_timestamp"],
        "nic_backpressure_waits": counters["tx_blocked"],
        "agent_loop_lag_us": _pooled_lag(summaries),
        "collectives": [_workload_figures(i, spec, ctx, packets, iterations)
                        for i, spec in enumerate(ctx.workloads)],
        "per_gpu": dict(sorted(per_gpu.items(), key=lambda kv: kv[1]["rank"])),
    }
    spans = _rows(records_dir, summaries, "spans")
    program_of = programs(ctx)
    if ctx.job is None:
        figures["operations"] = breakdown.rows("", spans, iterations, program_of, ctx.time_scale)
    else:
        figures["operations"] = []
        jobs = []
        for part in ctx.job.parts:  # one figure set per job
            ranks = set(part.ranks)
            f = job_figures(ctx.job.graph, ctx.job.byte_scale, spans, iterations,
                            ctx.time_scale, ctx.gpus_per_server, ctx.extrapolate_gpus, ranks,
                            part.name)
            f["job"] = dataclasses.replace(
                f["job"], latency_share=round(ctx.job.latency_share, 4),
                byte_scale_warning=ctx.job.warning or None, buffer_regime=ctx.job.regime,
                recovery_regime=ctx.job.recovery, gpus=tuple(sorted(ranks)),
                bytes_sent_per_rank=_job_bytes(ctx, packets, iterations, ranks))
            f["fan_in"] = _fan_in(ctx, [s for s in spans if int(s["rank"]) in ranks], packets)
            jobs.append(f)
            figures["operations"] += breakdown.rows(
                f["job"].name, [s for s in spans if int(s["rank"]) in ranks],
                [r for r in iterations if int(r["rank"]) in ranks], program_of, ctx.time_scale)
        figures["jobs"] = [JobResult.from_json(j, f"jobs[{k}]", strict=True)
                           for k, j in enumerate(jobs)]
    return figures, packets


def programs(ctx: RunContext) -> Callable[[int, int], tuple]:
    """(rank, workload index) -> the rank's ops as the agents ran them."""
    if ctx.job is not None:
        return lambda rank, _workload: ctx.job.graph.programs[rank]
    graphs = [collective_graph(spec.collective, ctx.ranks, spec.size, spec.chunks, spec.group,
                               spec.pxn) for spec in ctx.workloads]
    return lambda rank, workload: graphs[workload].programs[rank]


def timeline(records_dir: str, ctx: RunContext, queue_csvs: Sequence[str]) -> dict:
    """The run's trace (``testbed.results.trace``) from its records and the queue emulators'
    timeline CSVs."""
    summaries = read_summaries(records_dir)
    spans = _rows(records_dir, summaries, "spans")
    iterations = _rows(records_dir, summaries, "iterations")
    program_of = programs(ctx)
    by_rank_it = ops_by_rank_iteration(spans)
    waits = {}
    for row in iterations:
        r, it = int(row["rank"]), int(row["iteration"])
        ops = by_rank_it[(r, it)]
        _busy, ws = compute_waits(program_of(r, int(row["workload"])), ops,
                                  int(row["compute_start_ns"]), int(row["end_ns"]))
        waits[(r, it)] = [(w.start, w.end, waited_for(ops, w),
                           ops[w.blocker]["name"] if w.blocker in ops else "") for w in ws]
    events = {s.rank: record_rows(records_dir, s.host, "events") for s in summaries}
    return trace.build({s.rank: s.host for s in summaries}, spans, iterations, waits,
                       events, [read_csv(p, ("time_ns", "paused")) for p in queue_csvs],
                       ctx.time_scale)


def _rows(records_dir: str, summaries: List[AgentSummary], kind: str) -> List[dict]:
    """Every GPU's rows of one record file (``<host>.<kind>.csv``)."""
    return [r for s in summaries for r in record_rows(records_dir, s.host, kind)]


def _workload_figures(index: int, spec: WorkloadSpec, ctx: RunContext, packets: Packets,
                      iterations: List[dict]) -> dict:
    """The figures of one collective at one size: CCT, bandwidths, latency, stragglers."""
    rows = [r for r in iterations if int(r["workload"]) == index]
    its = sorted({int(r["iteration"]) for r in rows})
    size = spec.size
    coll = collective_of(collective_graph(spec.collective, ctx.ranks, size, spec.chunks,
                                          spec.group, spec.pxn).comms[0])  # as the agents ran it
    cct = metrics.cct_summary(metrics.iteration_cct_us(rows))
    factor = collectives.bus_bandwidth_factor(coll.kind, ctx.ranks)
    algbw = metrics.algbw_gbps(size, cct["p50"]) if cct else None
    ready: Dict[int, List[int]] = {}
    for r in rows:
        ready.setdefault(int(r["iteration"]), []).append(int(r["start_ns"]))
    complete = {i: v for i, v in ready.items() if len(v) == ctx.ranks}
    idle = metrics.straggler_idle(complete)
    mine = packets.select(np.isin(packets.iteration, its)) if its else packets.select(
        np.zeros(packets.src.size, dtype=bool))
    delivered = mine.select(mine.delivered == 1)
    moved = {}
    for rank in range(ctx.ranks):
        total = int(delivered.payload[delivered.src == rank].sum())
        moved[str(rank)] = round(total / len(its)) if its else None
    fabric = defaultdict(int)  # transfers inside a server never reach the fabric
    for t in coll.transfers:
        if not same_server(t.src, t.dst, ctx.gpus_per_server):
            fabric[t.src] += t.nbytes
    expected = {str(r): fabric[r] for r in range(ctx.ranks)}
    out = {
        "collective": coll.name,
        "size_bytes": size,
        "iterations": len(its),
        "ranks": ctx.ranks,
        "cct_us": cct,
        "algbw_gbps_emulated": _round(algbw),
        "busbw_gbps_emulated": _round(algbw * factor if algbw else None),
        "algbw_gbps_modelled": _round(algbw * ctx.time_scale if algbw else None),
        "busbw_gbps_modelled": _round(algbw * factor * ctx.time_scale if algbw else None),
        "busbw_factor": round(factor, 6),
        "bytes_sent_per_rank": BytesPerRank(expected, moved),
        "scale_up_bytes_per_iteration": coll.total_bytes() - sum(fabric.values()),
        "packets_received": int(mine.src.size),
        "retransmissions_received": int(mine.retx.sum()),
        "ecn_marked_packets": int(mine.ce.sum()) if ctx.mechanisms.ecn else None,
        **mine.latency_figures(),
        "straggler_idle_us": idle,
        "extrapolation": (metrics.extrapolate_idle(idle["mean"], ctx.ranks,
                                                   ctx.extrapolate_gpus, ctx.time_scale)
                          if idle else None),
    }
    return out


def _job_bytes(ctx: RunContext, packets: Packets, iterations: List[dict],
               ranks) -> BytesPerRank:
    """Per rank of a job, the payload one iteration sends over the fabric: as the job's graph
    says, and as the receivers' packet records show it delivered (per iteration)."""
    its = len({int(r["iteration"]) for r in iterations}) or 1
    delivered = packets.select(packets.delivered == 1)
    expected = fabric_bytes_sent(ctx.job.graph, ctx.gpus_per_server)
    return BytesPerRank(
        expected={str(r): expected[r] for r in sorted(ranks)},
        measured={str(r): round(int(delivered.payload[delivered.src == r].sum()) / its)
                  for r in sorted(ranks)})


def _fan_in(ctx: RunContext, spans: List[dict], packets: Packets) -> Dict[str, FanIn]:
    """The job's fan-ins (``testbed.results.fanin``) from its spans and delivered packets
    (empty: none)."""
    d = packets.select(packets.delivered == 1)
    rx_ns = d.sent + np.round(d.latency * 1000).astype(np.int64)
    return fan_in(ctx.job.graph, spans, d.src, d.dst, rx_ns, d.payload, ctx.time_scale)


def _pooled_lag(summaries: List[AgentSummary]) -> Optional[AgentLoopLag]:
    """How late the agents woke for their timers, over all agents; ``by_timer``: the same per
    kind of timer (compute ends, RTOs, DCQCN events, pacing, NAKs), to show which ones lag."""
    pooled = _pool([s.loop_lag.counts for s in summaries if s.loop_lag])
    if pooled is None:
        return None
    by_timer = {}
    for kind in sorted({k for s in summaries for k in s.loop_lag_by_timer}):
        hist = _pool([s.loop_lag_by_timer[kind].counts for s in summaries
                      if kind in s.loop_lag_by_timer])
        if hist is not None:
            k = hist.summary()
            by_timer[kind] = TimerLag(k.count, k.p50_us, k.p95_us, k.max_us)
    first = [s.first_start_lag_us for s in summaries if s.first_start_lag_us is not None]
    lag = pooled.summary()
    return AgentLoopLag(lag.count, lag.p50_us, lag.p95_us, lag.p99_us, lag.max_us,
                        first_start_lag_us_max=max(first) if first else None,
                        scheduling=", ".join(sorted({s.scheduling for s in summaries})),
                        by_timer=by_timer)


def _pool(counts: List[Sequence[int]]) -> Optional[metrics.LagHistogram]:
    hists = [metrics.LagHistogram(c) for c in counts if c]
    if not hists:
        return None
    pooled = hists[0]
    for h in hists[1:]:
        pooled = pooled.merge(h)
    return pooled


def _round(x, digits: int = 6):
    return None if x is None else round(float(x), digits)

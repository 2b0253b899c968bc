"""A training job's figures from its ops' spans (pure over the records' rows).

Per rank and iteration the compute stream is either busy (a compute span) or idle. An idle gap
before a compute op is charged to the op it waited for last (of those the graph makes it wait
for): a communication op's kind (dp, tp, pp, ep) - exposed communication, which for pipeline
stages includes the bubble - or ``other`` (a compute that ended late, the agent's own lag);
the gap after the last compute op, to the op that ended last. The ideal iteration replays the
graph with free communication (``traffic.jobgraph.replay``): its idle time is the pipeline
bubble, and what the run takes beyond it is the network's cost.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from typing import Dict, List, NamedTuple, Optional, Sequence, Set, Tuple

import numpy as np

from traffic import collectives, metrics
from traffic.jobgraph import COMPUTE, JobGraph, comm_transfers, replay, same_server

from .model import IdleOnGpus, Job, Operation


class Wait(NamedTuple):
    """An idle gap of a rank's compute stream (ns) and the op index it is charged to (None:
    nothing the graph names)."""
    start: int
    end: int
    blocker: Optional[int]


def job_figures(graph: JobGraph, byte_scale: float, spans: Sequence[dict],
                iterations: Sequence[dict], time_scale: float, per_server: int,
                extrapolate_gpus: int, ranks: Optional[Set[int]] = None, name: str = "") -> dict:
    """The figures of the job on ``ranks`` (default: all) of ``graph`` (modelled ns); ``spans``
    and ``iterations`` as the records' CSV rows (ns since the epoch, emulated). Times out:
    emulated us (``modelled`` figures beside them); ``job``: the job as run (``Job``)."""
    mine = set(range(graph.ranks)) if ranks is None else ranks
    spans = [s for s in spans if int(s["rank"]) in mine]
    iterations = whole_iterations([r for r in iterations if int(r["rank"]) in mine], len(mine))
    by_rank_it = ops_by_rank_iteration(spans)
    starts: Dict[int, List[int]] = defaultdict(list)
    ends: Dict[int, List[int]] = defaultdict(list)
    exposed = defaultdict(float)
    compute_total = idle_total = 0.0
    for row in iterations:
        r, it = int(row["rank"]), int(row["iteration"])
        begin, end = int(row["compute_start_ns"]), int(row["end_ns"])
        starts[it].append(begin)
        ends[it].append(end)
        ops = by_rank_it[(r, it)]
        busy, waits = compute_waits(graph.programs[r], ops, begin, end)
        compute_total += busy
        for wait in waits:
            exposed[waited_for(ops, wait)] += wait.end - wait.start
            idle_total += wait.end - wait.start
    samples = len(iterations) or 1
    its = sorted(starts)
    done = bool(its)  # none: the job failed in its first iteration
    iteration_us = metrics.cct_summary([(max(ends[i]) - min(starts[i])) / 1000 for i in its])
    timeline = replay(graph, lambda r, op: op.ns, lambda comm: 0)
    ideal_end = max(e for r in mine for _s, e in timeline.spans[r])
    compute_model = [sum(op.ns for op in graph.programs[r] if op.kind == COMPUTE) for r in mine]
    bubble_ns = float(np.mean([ideal_end - c for c in compute_model]))
    to_emulated = time_scale / 1000  # modelled ns -> emulated us
    idle_us = idle_total / samples / 1000
    figures = {
        "iteration_us": iteration_us,
        "job_compute_us": round(compute_total / samples / 1000, 3) if done else None,
        "exposed_comm_us": ({k: round(v / samples / 1000, 3) for k, v in sorted(exposed.items())
                             if v} | {"total": round(idle_us, 3)}) if done else None,
        "ideal_iteration_us": round(ideal_end * to_emulated, 3),
        "pipeline_bubble_us": round(bubble_ns * to_emulated, 3),
        "network_cost_us": (round(iteration_us["p50"] - ideal_end * to_emulated, 3)
                            if iteration_us else None),
        "idle_gpu_us": round(idle_total / len(its) / 1000, 3) if done else None,
    }
    p50 = iteration_us["p50"] if iteration_us else None
    on_n = idle_us / time_scale / 1e6 * extrapolate_gpus  # modelled GPU-s, as run
    job = Job(
        name=name or graph.name, ranks=len(mine), byte_scale=byte_scale,
        exposed_share=round(idle_us / p50, 4) if p50 else None,
        bytes_per_iteration=traffic_split(graph, per_server, mine),
        full_size_iteration_ms_modelled=(round(p50 / time_scale * byte_scale / 1000, 3)
                                         if p50 else None),
        idle_gpu_seconds_on_n_gpus=(IdleOnGpus(extrapolate_gpus, round(on_n, 6),
                                               round(on_n * byte_scale, 6)) if p50 else None),
        operations=operations(spans, time_scale))
    return {**figures, "job": job}


def whole_iterations(rows: Sequence[dict], ranks: int) -> List[dict]:
    """The rows of the iterations every one of ``ranks`` finished (a failed job leaves some
    ranks one iteration ahead of the rest)."""
    count: Dict[int, int] = defaultdict(int)
    for row in rows:
        count[int(row["iteration"])] += 1
    return [row for row in rows if count[int(row["iteration"])] == ranks]


def ops_by_rank_iteration(spans: Sequence[dict]) -> Dict[tuple, Dict[int, dict]]:
    """(rank, iteration) -> op index -> its span row."""
    out: Dict[tuple, Dict[int, dict]] = defaultdict(dict)
    for s in spans:
        out[(int(s["rank"]), int(s["iteration"]))][int(s["op"])] = s
    return out


def compute_waits(program, ops: Dict[int, dict], begin: int, end: int
                  ) -> Tuple[int, List[Wait]]:
    """(compute busy ns, the idle gaps of the compute stream) of one rank's iteration: each gap
    until a compute op, charged to the op it waited for last (of those the graph makes it wait
    for); the gap after the last compute op, to the op that ended last."""
    def ended(i: int) -> int:
        s = ops.get(i)
        return int(s["end_ns"]) if s else begin

    busy = 0
    waits: List[Wait] = []
    at = begin
    computes = sorted((int(s["start_ns"]), i) for i, s in ops.items() if s["kind"] == COMPUTE)
    for start, i in computes:
        stop = int(ops[i]["end_ns"])
        if start > at:
            after = program[i].after if i < len(program) else ()
            waits.append(Wait(at, start, max(after, key=ended) if after else None))
        busy += stop - start
        at = max(at, stop)
    if end > at and ops:
        waits.append(Wait(at, end, max(ops, key=ended)))
    return busy, waits


def waited_for(ops: Dict[int, dict], wait: Wait) -> str:
    """The kind a wait is charged to: its op's communication kind, else ``other`` (a compute
    that ended late, the agent's own lag)."""
    s = ops.get(wait.blocker) if wait.blocker is not None else None
    return (s["comm_kind"] or "other") if s and s["kind"] != COMPUTE else "other"


def fabric_bytes_sent(graph: JobGraph, per_server: int) -> Dict[int, int]:
    """Rank -> the payload bytes it sends over the fabric in one iteration."""
    out: Dict[int, int] = Counter()  # a rank that sends nothing: 0
    for comm in graph.comms:
        for src, dst, nbytes in comm_transfers(comm):
            if not same_server(src, dst, per_server):
                out[src] += nbytes
    return out


def traffic_split(graph: JobGraph, per_server: int, ranks: Optional[Set[int]] = None) -> dict:
    """Bytes one iteration moves over the fabric and inside servers (scale-up), per kind, as
    run (divided by the byte scale), of the comms among ``ranks`` (default: all)."""
    out: Dict[str, Dict[str, int]] = {"fabric": defaultdict(int), "scale_up": defaultdict(int)}
    for comm in graph.comms:
        if ranks is not None and not set(comm.group) <= ranks:
            continue
        for src, dst, nbytes in comm_transfers(comm):
            where = "scale_up" if same_server(src, dst, per_server) else "fabric"
            out[where][comm.kind] += nbytes
    return {k: dict(v) for k, v in out.items()}


def operations(spans: Sequence[dict], time_scale: float) -> Tuple[Operation, ...]:
    """Per communication (kind, collective, group size, bytes): how many, time p50 and the
    bandwidths it reached, in modelled time."""
    groups: Dict[tuple, List[float]] = defaultdict(list)
    for s in spans:
        if s["kind"] == COMPUTE:
            continue
        key = (s["comm_kind"], s["collective"], int(s["group_size"]), int(s["bytes"]))
        groups[key].append((int(s["end_ns"]) - int(s["start_ns"])) / 1000 / time_scale)
    rows = []
    for (kind, coll, n, size), times in sorted(groups.items()):
        t = float(np.percentile(times, 50))
        algbw, busbw = bandwidths(coll, n, size, t)
        rows.append(Operation(kind, coll, n, size, len(times), round(t, 3), algbw, busbw))
    return tuple(rows)


def bandwidths(collective: str, group: int, size: int, time_us: float):
    """(algbw, busbw) in Gbit/s of a communication of ``size`` bytes per rank that took
    ``time_us`` (None, None when it took no time)."""
    if time_us <= 0 or not size:
        return None, None
    kind = collectives.KINDS.get(collective, "sendrecv")
    factor = collectives.bus_bandwidth_factor(kind, group) if kind != "sendrecv" else 1.0
    algbw = metrics.algbw_gbps(size, time_us)
    return round(algbw, 3), round(algbw * factor, 3)

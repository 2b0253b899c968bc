"""The per-operation breakdown (``operations.csv``): per job, layer, kind, collective, group and
size, what a GPU's iteration spends on it - compute, communication in total, and the part of it
no compute hid (exposed) - with the bandwidths it reached. Pure over the records' rows.

Averages are per GPU and iteration of the job (all its ranks, every iteration), in modelled
microseconds; a wait of the compute stream is charged as ``testbed.results.jobfigures`` charges
it, to the op it waited for last.
"""
from __future__ import annotations

import csv
import io
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np

from traffic.jobgraph import COMPUTE

from ..base.atomic import write_atomic
from .jobfigures import bandwidths, compute_waits, ops_by_rank_iteration, waited_for

COLUMN_DOCS = {
    "policy": "the policy run",
    "job": "the job's name (empty: a run of collectives)",
    "layer": "the layer the ops' names carry (L0, L1, ...; empty: the iteration's start, the "
             "optimizer step, gradient buckets, ops of a graph file without layer names)",
    "kind": "compute, a communication's kind (dp, tp, pp, ep; coll for a collective run) or "
            "other (waits for a compute that ended late or for nothing the graph names: "
            "the agent's own lag)",
    "collective": "the communication's collective (ring, tree, all_to_all, send_recv, ...)",
    "group": "GPUs in the communication's group",
    "bytes": "bytes per GPU of one op, as run (a job's: divided by its byte scale)",
    "count": "ops of this row, all GPUs and iterations",
    "compute_us": "compute per GPU and iteration (modelled us)",
    "exposed_us": "per GPU and iteration, the time the compute stream waited for these ops: "
                  "the communication no compute hid (modelled us)",
    "comm_us": "per GPU and iteration, these ops' spans summed, hidden or not (modelled us)",
    "time_us_p50": "one op's time, median (modelled us)",
    "algbw_gbps": "bytes / time_us_p50 (Gbit/s, modelled)",
    "busbw_gbps": "algbw x the collective's bus factor, as nccl-tests (Gbit/s, modelled)",
}
COLUMNS = tuple(COLUMN_DOCS)
_LAYER = re.compile(r"\bL(\d+)\b")

Key = Tuple[str, str, str, int, int]  # layer, kind, collective, group size, bytes


@dataclass
class _Sums:
    count: int = 0
    compute_ns: int = 0
    comm_ns: int = 0
    exposed_ns: int = 0
    times_us: List[float] = field(default_factory=list)


def layer_of(name: str) -> str:
    """The layer an op's name carries (``L3``), or "" (buckets, graph files' own names)."""
    m = _LAYER.search(name)
    return f"L{m.group(1)}" if m else ""


def _key(span: dict) -> Key:
    if span["kind"] == COMPUTE:
        return layer_of(span["name"]), COMPUTE, "", 0, 0
    return (layer_of(span["name"]), span["comm_kind"] or "coll", span["collective"],
            int(span["group_size"]), int(span["bytes"]))


def rows(job: str, spans: Sequence[dict], iterations: Sequence[dict],
         program_of: Callable[[int, int], tuple], time_scale: float) -> List[dict]:
    """The breakdown of one job (or one run of collectives): ``spans`` and ``iterations`` as
    the records' rows of its ranks; ``program_of(rank, workload)`` the rank's ops as run."""
    by_rank_it = ops_by_rank_iteration(spans)
    sums: Dict[Key, _Sums] = defaultdict(_Sums)
    for row in iterations:
        r, it = int(row["rank"]), int(row["iteration"])
        ops = by_rank_it[(r, it)]
        for s in ops.values():
            k, ns = sums[_key(s)], int(s["end_ns"]) - int(s["start_ns"])
            k.count += 1
            if s["kind"] == COMPUTE:
                k.compute_ns += ns
            else:
                k.comm_ns += ns
                k.times_us.append(ns / 1000 / time_scale)
        _busy, waits = compute_waits(program_of(r, int(row["workload"])), ops,
                                     int(row["compute_start_ns"]), int(row["end_ns"]))
        for w in waits:
            other = waited_for(ops, w) == "other"  # as exposed_comm_us charges it
            sums[("", "other", "", 0, 0) if other else _key(ops[w.blocker])].exposed_ns += \
                w.end - w.start
    samples = len(iterations) or 1
    out = []
    for (layer, kind, coll, group, size), k in sorted(sums.items()):
        per = 1000 * time_scale * samples  # summed emulated ns -> modelled us per GPU-iteration
        row = {"job": job, "layer": layer, "kind": kind, "collective": coll, "group": group,
               "bytes": size, "count": k.count, "compute_us": round(k.compute_ns / per, 3),
               "exposed_us": round(k.exposed_ns / per, 3), "comm_us": round(k.comm_ns / per, 3),
               "time_us_p50": None, "algbw_gbps": None, "busbw_gbps": None}
        if k.times_us:
            t = float(np.percentile(k.times_us, 50))
            row["time_us_p50"] = round(t, 3)
            row["algbw_gbps"], row["busbw_gbps"] = bandwidths(coll, group, size, t)
        out.append(row)
    return out


def csv_text(per_policy: Dict[str, Sequence[dict]]) -> str:
    """``operations.csv``: every policy's rows under one header (``COLUMNS``)."""
    f = io.StringIO()
    w = csv.DictWriter(f, COLUMNS, lineterminator="\n")
    w.writeheader()
    for policy, policy_rows in per_policy.items():
        for row in policy_rows:
            w.writerow({"policy": policy, **{k: "" if v is None else v
                                             for k, v in row.items()}})
    return f.getvalue()


FILE = "operations.csv"


def write(run_dir: str, operations: Dict[str, Sequence[dict]]) -> str:
    """``operations.csv`` of every policy (name -> its ``operations`` figure)."""
    path = os.path.join(run_dir, FILE)
    write_atomic(path, csv_text(operations).encode("utf-8"))
    return path

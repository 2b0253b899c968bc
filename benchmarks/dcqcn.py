#!/usr/bin/env python3
"""Benchmark: DCQCN on against PFC alone, on an incast-heavy lossless collective.

The published behaviour (Zhu et al., SIGCOMM 2015) is fewer PFC pauses and shorter queues at
about the same throughput, for flows that outlast DCQCN's recovery. This runs an all-to-all
of 4 MiB per GPU over 2:1 oversubscribed uplinks (8 GPUs, 4 leaves, 2 spines) under the
lossless policy, DCQCN on and off, interleaved for ``--rounds`` rounds, and prints each run
and the medians: modelled CCT p50, PFC pauses and paused time, the largest switch queue, the
p99 of the queue timeline at the busiest port and the busiest port's mean backlog while the
fabric holds any, latency p99, the lowest DCQCN rate, the share of QPs that start an
iteration below half the line (throttling carried over: the iterations follow each other
without a compute phase), the fidelity verdict and each iteration's CCT.

4 MiB: each pair of GPUs exchanges 512 KiB, about 40 us at the modelled 100 Gbit/s - several
of DCQCN's control loops, but over in well under the milliseconds its additive increase takes
to recover from a deep cut (docs/time-scale.md, "DCQCN": pauses and queues as published, the
CCT 1.1-1.4x PFC alone's). ``--set workload.size_bytes=1048576`` runs the 1 MiB collective
(128 KiB a pair, about one loop).

    sudo .venv/bin/python benchmarks/dcqcn.py [--rounds 3] [--rate 10] [--set KEY=VALUE ...]

``--set transport.dcqcn_timer_us=55`` (repeatable) changes the scenario for both arms. The
runs go to a temporary directory; ``--out DIR`` keeps them.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import sys
import tempfile
from typing import Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from testbed.run import runner  # noqa: E402
from testbed.scenario.config import Scenario  # noqa: E402
from testbed.results.report import sig, table  # noqa: E402

SCENARIO = {
    "name": "dcqcn-incast",
    "policies": ["lossless"],
    "topology": {"spines": 2, "leaves": 4, "gpus_per_leaf": 2, "oversubscription": 2},
    "workload": {"collective": "all_to_all", "size_bytes": 4 << 20, "iterations": 5},
    # each flow keeps the uplink adaptive routing chose at its start, as on the published
    # testbed's static routes: a QP a pause held idle would start a new flowlet and move,
    # spreading the incast the comparison is about (busiest queue's mean 79 against 100+ KB)
    "policy_params": {"lossless": {"flowlet_gap_us": 0}},
}


def scenario(cc: str, rate: float, sets) -> Scenario:
    data = json.loads(json.dumps(SCENARIO))
    data["topology"]["host_rate_mbit"] = rate
    data["transport"] = {"congestion_control": cc}
    for key, value in sets:
        section, _, name = key.rpartition(".")
        d = data
        for part in section.split("."):
            d = d.setdefault(part, {})
        d[name] = json.loads(value) if value[:1].isdigit() or value in ("true", "false") \
            else value
    return Scenario.from_dict(data)


def queue_over_time(run_dir: str) -> Tuple[float, float]:
    """From the queue timeline (sampled at a fixed period): the p99 over time of the busiest
    port's backlog (bytes) - what the queue stays at, where the largest backlog is one
    instant - and the largest time-average backlog of a port while the fabric holds any."""
    rows = _rows(os.path.join(run_dir, "switchq-lossless.timeline.csv"))
    ports = [k for k in rows[0] if k not in ("time_ns", "paused")] if rows else []
    values = {port: [float(r[port] or 0) for r in rows] for port in ports}
    busy = [i for i in range(len(rows)) if any(v[i] for v in values.values())]
    p99 = mean = 0.0
    for v in values.values():
        p99 = max(p99, sorted(v)[int(0.99 * (len(v) - 1))])
        if busy:
            mean = max(mean, sum(v[i] for i in busy) / len(busy))
    return p99, mean


def slow_starts(run_dir: str, line_bps: float) -> Optional[float]:
    """The share of (QP, iteration after the first) whose DCQCN rate, as the iteration
    starts, is below half the line: throttling carried over from the iteration before (the
    iterations here have no compute phase between them). None without DCQCN records."""
    records = os.path.join(run_dir, "records", "lossless")
    starts: Dict[int, int] = {}
    histories: Dict[tuple, List[tuple]] = {}
    for name in sorted(os.listdir(records)):
        path = os.path.join(records, name)
        if name.endswith(".iterations.csv"):
            for r in _rows(path):
                i, t = int(r["iteration"]), int(r["start_ns"])
                starts[i] = min(starts.get(i, t), t)
        elif name.endswith(".qps.csv"):
            for r in _rows(path):
                if not r["bytes_sent"]:  # a rate change, not a sample
                    histories.setdefault((name, r["qpn"]), []).append(
                        (int(r["t_ns"]), float(r["rate_bps"])))
    later = [t for i, t in starts.items() if i > 0]
    if not histories or not later:
        return None
    low = 0
    for history in histories.values():
        for t in later:
            before = [rate for at, rate in history if at <= t]
            low += bool(before) and before[-1] < line_bps / 2
    return low / (len(histories) * len(later))


def _rows(path: str) -> List[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def figures(run) -> dict:
    """The figures compared, of a run (``testbed.results.model.RunResult``; modelled time)."""
    p = run.policy("lossless")
    line_bps = run.scenario.topology.host_rate_mbit * 1e6
    peaks = [v for port in (p.switch_queues.max_backlog if p.switch_queues else {}).values()
             for v in port.values()]
    p99, mean = queue_over_time(run.run_dir)
    return {"cct_us": p.cct_us.p50,
            "cct_iterations_us": [round(c) for c in p.cct_us.per_iteration],
            "pauses": p.pfc_pause_events, "timeouts": p.rto_timeouts,
            "paused_ms": p.pfc_paused_ms, "peak_kb": max(peaks, default=0) / 1000,
            "queue_p99_kb": p99 / 1000, "queue_mean_kb": mean / 1000,
            "latency_p99_us": p.latency_us.p99,
            "min_rate_share": (p.dcqcn_min_rate_mbit * 1e6 / line_bps
                               if p.dcqcn_min_rate_mbit else None),
            "slow_starts": slow_starts(run.run_dir, line_bps),
            "fidelity": p.fidelity.verdict,
            "idle_path": p.fidelity.checks.idle_path_latency.to_json(),
            "problems": list(p.fidelity.problems)}


COLUMNS = [("CCT p50 (us)", "cct_us"), ("pauses", "pauses"), ("paused (ms)", "paused_ms"),
           ("RTO timeouts", "timeouts"),
           ("peak queue (KB)", "peak_kb"), ("queue p99 (KB)", "queue_p99_kb"),
           ("busy queue mean (KB)", "queue_mean_kb"),
           ("latency p99 (us)", "latency_p99_us"), ("lowest rate / line", "min_rate_share"),
           ("QPs starting below half", "slow_starts")]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rate", type=float, default=10.0, help="GPU NIC rate, Mbit/s")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", help="keep the runs here")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    sets = [s.split("=", 1) for s in args.set]
    out = args.out or tempfile.mkdtemp(prefix="testbed-dcqcn-")
    runs = {"none": [], "dcqcn": []}
    scenarios = {cc: scenario(cc, args.rate, sets) for cc in runs}
    try:
        for r in range(args.rounds):
            for cc in runs:
                print(f"[round {r + 1}/{args.rounds}] congestion control {cc}", file=sys.stderr)
                run = runner.run(scenarios[cc], out_root=os.path.join(out, f"{cc}-{r}"),
                                 progress=lambda s: None)
                runs[cc].append(figures(run))
    finally:
        if not args.out:
            shutil.rmtree(out, ignore_errors=True)
    medians = {cc: {k: statistics.median(f[k] for f in fs if f[k] is not None)
                    if any(f[k] is not None for f in fs) else None
                    for _, k in COLUMNS} for cc, fs in runs.items()}
    if args.json:
        print(json.dumps({"runs": runs, "medians": medians}, indent=2))
        return 0
    rows = []
    for cc, fs in runs.items():
        for i, f in enumerate(fs):
            rows.append([f"{cc} {i + 1}"] + [sig(f[k]) if f[k] is not None else "-"
                                             for _, k in COLUMNS] + [f["fidelity"]]
                        + [" ".join(f"{c:,}" for c in f["cct_iterations_us"])])
    for cc in runs:
        rows.append([f"{cc} median"] + [sig(medians[cc][k]) if medians[cc][k] is not None
                                        else "-" for _, k in COLUMNS] + ["", ""])
    base, on = medians["none"], medians["dcqcn"]
    size = scenarios["none"].workload.size_bytes
    print(f"lossless all-to-all, {size / 2 ** 20:g} MiB per GPU, 8 GPUs over 2:1 uplinks at "
          f"{args.rate:g} Mbit/s; modelled time")
    print(table(["run"] + [c for c, _ in COLUMNS] + ["fidelity", "CCT per iteration (us)"],
                rows))
    print(f"DCQCN / PFC alone (medians): CCT {on['cct_us'] / base['cct_us']:.2f}x, pauses "
          f"{on['pauses'] / base['pauses']:.2f}x, peak queue "
          f"{on['peak_kb'] / base['peak_kb']:.2f}x, queue p99 "
          f"{on['queue_p99_kb'] / max(base['queue_p99_kb'], 1e-9):.2f}x, busy queue mean "
          f"{on['queue_mean_kb'] / max(base['queue_mean_kb'], 1e-9):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

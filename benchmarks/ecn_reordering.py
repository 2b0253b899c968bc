#!/usr/bin/env python3
"""Benchmark: does ECN marking reorder a flow? OpenFlow marking groups vs the tc BPF program.

    sudo .venv/bin/python benchmarks/ecn_reordering.py [--runs 4] [--no-load] [--json]

Runs the lossless policy on an oversubscribed fabric (the default topology at 40/20 Mbit/s,
adaptive routing off, one iteration: the scenario of
tests/integration/test_transport.py's lossless half) ``--runs`` times with sampled ECN marking
applied by each method, alternating, while two busy loops load the CPUs (``--no-load``: without
them). Lossless, adaptive routing off: a packet can only arrive before an earlier one of its
flow if the emulator reorders it, and every reordering costs a NAK and a go-back-N
retransmission. Per method: runs with any reordering, data packets that arrived after a later
packet of their flow (from the receivers' records), NAKs, retransmissions, drops, CE marks.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import glob
import json
import multiprocessing
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

METHODS = ("openflow", "bpf")


def scenario():
    from testbed.scenario.config import DEFAULT
    return DEFAULT.override({
        "policies": ["lossless"], "workload": {"iterations": 1},
        "topology": {"host_rate_mbit": 40, "fabric_rate_mbit": 20},
        "policy_params": {"lossless": {"adaptive_routing": False}},
        "transport": {"rto_us": 400}})


def reordered(run_dir: str) -> int:
    """First transmissions that arrived after a higher PSN of the same sender (records are
    in arrival order per receiver)."""
    late = 0
    for path in glob.glob(os.path.join(run_dir, "records", "*", "*.packets.csv")):
        highest = {}
        with open(path) as f:
            for r in csv.DictReader(f):
                if r["retx"] == "1":
                    continue
                src, psn = r["src"], int(r["psn"])
                if psn < highest.get(src, -1):
                    late += 1
                highest[src] = max(psn, highest.get(src, -1))
    return late


def busy(stop_at: float) -> None:
    while time.monotonic() < stop_at:
        pass


def one_run(method: str, out_root: str, load: bool) -> dict:
    from testbed.run import runner
    from testbed.fabric.capabilities import detect

    caps = detect()
    if method == "bpf" and not caps.bpf_marking:
        raise SystemExit("this kernel cannot run the marking program (testbed check)")
    caps = dataclasses.replace(caps, bpf_marking=method == "bpf")
    loaders = []
    if load:
        stop_at = time.monotonic() + 600
        loaders = [multiprocessing.Process(target=busy, args=(stop_at,), daemon=True)
                   for _ in range(os.cpu_count() or 2)]
        for p in loaders:
            p.start()
    try:
        run = runner.run(scenario(), out_root=out_root, caps=caps)
    finally:
        for p in loaders:
            p.terminate()
            p.join()
    r = run.policy("lossless").emulated
    assert r.ecn_marking_via == method, r.ecn_marking_via
    return {"reordered": reordered(run.run_dir), "naks": r.naks,
            "retransmitted": r.retransmitted_packets, "drops": r.drops,
            "ce_marked": r.ecn_marked_packets, "cct_p50_ms": r.cct_us.p50 / 1e3}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=4, help="runs per method (default 4)")
    ap.add_argument("--no-load", action="store_true", help="no busy loops beside the runs")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("ecn_reordering.py: needs root (it builds fabrics)", file=sys.stderr)
        return 2
    runs = {m: [] for m in METHODS}
    with tempfile.TemporaryDirectory(prefix="ecn-reordering-") as out:
        for i in range(args.runs):
            for m in METHODS:
                fig = one_run(m, out, not args.no_load)
                runs[m].append(fig)
                print(f"run {i + 1}/{args.runs} {m:8} {fig}", file=sys.stderr, flush=True)
    summary = {m: {"runs": len(v), "runs_reordered": sum(1 for f in v if f["reordered"]),
                   **{k: sum(f[k] for f in v) for k in ("reordered", "naks", "retransmitted",
                                                        "drops", "ce_marked")}}
               for m, v in runs.items()}
    if args.json:
        print(json.dumps({"summary": summary, "runs": runs}, indent=1))
        return 0
    print(f"{'marking':9} {'runs':>4} {'reordered runs':>14} {'late packets':>12} {'NAKs':>5} "
          f"{'retransmitted':>13} {'drops':>5} {'CE marked':>9}")
    for m, s in summary.items():
        print(f"{m:9} {s['runs']:>4} {s['runs_reordered']:>14} {s['reordered']:>12} "
              f"{s['naks']:>5} {s['retransmitted']:>13} {s['drops']:>5} {s['ce_marked']:>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Benchmark: does a job's full-size iteration hold across byte scales?

A job runs at a byte scale - every message and compute span divided by it - and reports its
iteration at full size (the scaled one times the scale). Two studies, every policy each:

* ``decade``: the default job at byte scale 100 and 10 (the issue's decade);
* ``full``: a one-layer job (a 2,048-wide transformer layer, tensor parallel 2, data parallel
  4, as the default's servers) at byte scale 1 - the full-size messages themselves - and at
  10 and 100.

Each point runs ``--repeat`` times on fresh fabrics; the table gives the median full-size
iteration [min-max] per policy and byte scale, its ratio to the study's reference (byte scale
10 for the decade, 1 for the full-size study), whether the policies keep their order, and how
a QP's median message stood against the smallest RoCE buffer of the run's switches
(``buffer_regime``: auto keeps it at ``testbed.job.bytescale.BUFFER_REGIME`` or more), and what
go-back-N did: frames resent per recovery (a NAK or a timeout) and timeouts per thousand new
frames, medians of the runs (a lossy fabric's regime: a short message caps what one
recovery resends).

    sudo .venv/bin/python benchmarks/byte_scale.py                    # both, once each
    sudo .venv/bin/python benchmarks/byte_scale.py --study full --repeat 3
    sudo .venv/bin/python benchmarks/byte_scale.py --json

The runs go to a temporary directory; ``--out DIR`` keeps them.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from testbed.base.contract import dump  # noqa: E402
from testbed.results.model import RunResult  # noqa: E402
from testbed.results.report import sig, table  # noqa: E402
from testbed.run import runner  # noqa: E402
from testbed.scenario.catalog import find  # noqa: E402

ONE_LAYER = {"model": "custom", "layers": 1, "hidden": 2048, "heads": 16, "seq_len": 2048,
             "vocab": 0, "tp": 2, "micro_batches": 1}
STUDIES = {  # name -> (the job's scenario at a byte scale, byte scales, reference scale)
    "decade": (lambda bs: find("default").override(
        {"workload": {"job": {"byte_scale": bs}}}), (100, 10), 10),
    "full": (lambda bs: find("default").override(
        {"name": "one-layer", "workload": {"iterations": 2, "job": dict(ONE_LAYER,
                                                                       byte_scale=bs)}}),
             (100, 10, 1), 1),
}


def go_back_n(runs) -> dict:
    """Medians over the runs: frames resent per recovery, timeouts per 1,000 new frames."""
    per_recovery, timeouts = [], []
    for r in runs:
        resent, recoveries = r.retransmitted_packets or 0, (r.naks or 0) + (r.rto_timeouts or 0)
        new = (r.packets_sent or 0) - resent
        if recoveries and new > 0:
            per_recovery.append(resent / recoveries)
            timeouts.append(1000 * (r.rto_timeouts or 0) / new)
    return {"resent_per_recovery": statistics.median(per_recovery) if per_recovery else None,
            "timeouts_per_1k_new": statistics.median(timeouts) if timeouts else None}


def full_size(result: RunResult) -> dict:
    """Per policy: every run's full-size iteration (modelled ms), the job's regime, what
    go-back-N did."""
    out = {}
    for name in result.policies:
        runs = result.runs(name)
        values = [r.job.full_size_iteration_ms_modelled if r.job else None for r in runs]
        out[name] = {"full_ms": [v for v in values if v is not None], **go_back_n(runs),
                     "failed": sum(1 for r in runs if r.job_failed),
                     "unfaithful": sum(1 for r in runs if r.fidelity and not r.fidelity.ok),
                     "regime": dump(runs[0].job.buffer_regime) if runs[0].job else None}
    return out


def run_study(name: str, repeat: int, out: str) -> dict:
    make, scales, _ref = STUDIES[name]
    points = {}
    for bs in scales:
        t0 = time.monotonic()
        scenario = make(bs).override({"repeat": repeat})
        run = runner.run(scenario, out_root=os.path.join(out, f"{name}-{bs}"),
                         progress=lambda s: print(s, file=sys.stderr)
                         if "done:" in s or "failed" in s else None)
        points[bs] = {"policies": full_size(run),
                      "wall_s": round(time.monotonic() - t0, 1)}
        print(f"{name}: byte scale {bs:g} took {points[bs]['wall_s']:.0f} s", file=sys.stderr)
    return points


def summary(name: str, points: dict) -> dict:
    """Per policy and scale: median [min, max] and the ratio of medians to the reference;
    whether every scale orders the policies as the reference does."""
    ref = STUDIES[name][2]
    medians = {bs: {p: statistics.median(v["full_ms"]) if v["full_ms"] else None
                    for p, v in point["policies"].items()} for bs, point in points.items()}
    ratios = {bs: {p: (m / medians[ref][p] if m and medians[ref].get(p) else None)
                   for p, m in by.items()} for bs, by in medians.items()}

    def order(by):
        return sorted((p for p in by if by[p]), key=lambda p: by[p])
    return {"medians_ms": medians, "ratio_to_reference": ratios,
            "same_order": {bs: order(by) == order(medians[ref]) for bs, by in medians.items()}}


def rows_of(name: str, points: dict, s: dict):
    out = []
    for bs, point in points.items():
        for policy, v in point["policies"].items():
            full = v["full_ms"]
            spread = (f"{sig(statistics.median(full))} [{sig(min(full))}-{sig(max(full))}]"
                      if full else "-")
            ratio = s["ratio_to_reference"][bs][policy]
            regime = v["regime"] or {}
            resent, timeouts = v["resent_per_recovery"], v["timeouts_per_1k_new"]
            out.append([name, f"{bs:g}", policy, spread, f"{ratio:.2f}" if ratio else "-",
                        "yes" if s["same_order"][bs] else "no",
                        f"{regime.get('ratio', 0):.3g}x" if regime.get("ratio") else "-",
                        f"{resent:.0f} / {timeouts:.1f}" if resent is not None else "-",
                        f"{v['failed']} failed, {v['unfaithful']} unfaithful"
                        if v["failed"] or v["unfaithful"] else "ok",
                        f"{point['wall_s']:.0f}"])
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--study", action="append", choices=sorted(STUDIES),
                   help="decade or full (repeatable; default: both)")
    p.add_argument("--repeat", type=int, default=1, help="runs per point (default 1)")
    p.add_argument("--out", help="keep the runs here")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="testbed-byte-scale-")
    report, rows = {}, []
    try:
        for name in args.study or ["decade", "full"]:
            points = run_study(name, args.repeat, out)
            s = summary(name, points)
            report[name] = {"points": points, **s}
            rows += rows_of(name, points, s)
    finally:
        if not args.out:
            shutil.rmtree(out, ignore_errors=True)
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print(table(["study", "byte scale", "policy", "full-size iteration (ms) median [min-max]",
                     "/ reference", "same order", "message / buffer",
                     "resent per recovery / timeouts per 1k new", "runs", "wall (s)"],
                    rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

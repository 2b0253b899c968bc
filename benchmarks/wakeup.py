#!/usr/bin/env python3
"""Benchmark: how late a timer wakes this process, with and without the run's PM QoS request.

    sudo .venv/bin/python benchmarks/wakeup.py [--rounds 6] [--sleeps 500] [--json]

A run holds ``/dev/cpu_dma_latency`` at 0 us while it lasts (``testbed.run.wakeup``) so idle
CPUs wake for timers and packets at once. This puts the two side by side in one run,
interleaved round by round: sleeps of 200 us with 1 us of timer slack (as the agents set
theirs), and how far past 200 us each one returned. Prints the overshoot's p50, p95 and p99
for both and their ratio (held / not held). Run it on an otherwise idle machine: that is where
the request matters (a busy CPU is not idle).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from testbed.base.procutil import precise_timers  # noqa: E402
from testbed.run.wakeup import cpus_kept_awake  # noqa: E402

SLEEP_S = 200e-6


def overshoots_us(n: int) -> list:
    out = []
    for _ in range(n):
        t = time.perf_counter_ns()
        time.sleep(SLEEP_S)
        out.append((time.perf_counter_ns() - t) / 1000.0 - SLEEP_S * 1e6)
    return out


def percentile(values: list, q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(len(v) * q))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--sleeps", type=int, default=500, help="sleeps per round and arm")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    precise_timers(1)
    seen = {"not held": [], "held": []}
    state = None
    for _ in range(args.rounds):
        seen["not held"] += overshoots_us(args.sleeps)
        with cpus_kept_awake() as state:
            time.sleep(0.05)  # let the governor see the request
            seen["held"] += overshoots_us(args.sleeps)
    figures = {arm: {f"p{int(q * 100)}_us": round(percentile(v, q), 1)
                     for q in (0.5, 0.95, 0.99)} for arm, v in seen.items()}
    figures["ratio held / not held"] = {
        k: round(figures["held"][k] / max(figures["not held"][k], 1e-9), 2)
        for k in figures["held"]}
    figures["request"] = state.to_json()
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    if not state.held:
        print(f"note: the request could not be held: {state.note}")
    print(f"timer overshoot of {SLEEP_S * 1e6:.0f} us sleeps, {args.rounds} x {args.sleeps} "
          f"per arm (cpuidle: {state.cpuidle_driver})")
    print(f"{'':24}{'p50 (us)':>10}{'p95 (us)':>10}{'p99 (us)':>10}")
    for arm in ("not held", "held", "ratio held / not held"):
        row = figures[arm]
        print(f"{arm:24}" + "".join(f"{row[k]:>10}" for k in ("p50_us", "p95_us", "p99_us")))
    return 0


if __name__ == "__main__":
    sys.exit(main())

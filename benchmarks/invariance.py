#!/usr/bin/env python3
"""Benchmark: is a scenario's answer independent of the time scale it ran at?

Runs each scenario at three GPU NIC rates - the rate ``auto`` chooses on this machine (or the
scenario's own), half of it and a quarter of it - and prints the modelled CCT p50 of every
policy at each, with the largest spread from the first rate and whether the order of the
policies held. Every time constant of a scenario is the modelled fabric's, so a faithful
emulation gives the same modelled figures at every factor.

    sudo .venv/bin/python benchmarks/invariance.py                      # every built-in
    sudo .venv/bin/python benchmarks/invariance.py --scenario oversubscribed --factors 1,2
    sudo .venv/bin/python benchmarks/invariance.py --json

The runs go to a temporary directory; ``--out DIR`` keeps them.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from testbed.scenario import catalog  # noqa: E402
from testbed.run import runner
from testbed.results.report import sig, table  # noqa: E402


def modelled_cct_ms(run) -> dict:
    """Per policy of a ``RunResult``: its modelled CCT p50 (ms) and fidelity verdict."""
    out = {}
    for name, p in run.policies.items():
        cct = p.cct_us.p50 if p.cct_us else None
        out[name] = {"cct_ms": cct / 1000 if cct else None,
                     "fidelity": p.fidelity.verdict if p.fidelity else None}
    return out


def spread(by_factor: dict) -> dict:
    """Per policy: the largest |CCT - CCT at the first factor| / CCT at the first factor;
    and whether every factor ranks the policies as the first does."""
    first = next(iter(by_factor.values()))
    worst = {}
    for name, f in first.items():
        base = f["cct_ms"]
        others = [r[name]["cct_ms"] for r in by_factor.values() if r[name]["cct_ms"]]
        worst[name] = max(abs(c - base) / base for c in others) if base else None

    def order(r):
        return sorted((n for n in r if r[n]["cct_ms"]), key=lambda n: r[n]["cct_ms"])
    return {"spread": worst, "same_order": all(order(r) == order(first)
                                               for r in by_factor.values())}


def run_at(scenario, rate: float, out: str) -> dict:
    run = runner.run(scenario.with_host_rate(rate), out_root=out,
                     progress=lambda s: print(s, file=sys.stderr) if "done:" in s else None)
    return modelled_cct_ms(run)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", action="append",
                   help="built-in name or YAML file (repeatable; default: every built-in)")
    p.add_argument("--factors", default="1,2,4",
                   help="rates as fractions of the first: 1,2,4 runs at r, r/2, r/4")
    p.add_argument("--rate", type=float, help="the first rate (default: what auto chooses)")
    p.add_argument("--out", help="keep the runs here")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    factors = [float(f) for f in args.factors.split(",")]
    names = args.scenario or list(catalog.builtins())
    out = args.out or tempfile.mkdtemp(prefix="testbed-invariance-")
    rows, report = [], {}
    try:
        for name in names:
            scenario = catalog.find(name)
            if args.rate:
                base = args.rate
            else:
                chosen, _ = runner.choose_time_scale(scenario, lambda s: None)
                base = chosen.topology.host_rate_mbit
            by_factor = {}
            for f in factors:
                rate = round(base / f, 3)
                print(f"[{name}] at {rate:g} Mbit/s", file=sys.stderr)
                where = os.path.join(out, scenario.name, f"{rate:g}")
                by_factor[f"{rate:g}"] = run_at(scenario, rate, where)
            s = spread(by_factor)
            report[name] = {"by_rate_mbit": by_factor, **s}
            for pol in next(iter(by_factor.values())):
                rows.append([name, pol] + [
                    f"{sig(r[pol]['cct_ms'])}{'' if r[pol]['fidelity'] == 'ok' else ' *'}"
                    for r in by_factor.values()]
                    + [f"{100 * s['spread'][pol]:.1f}%" if s["spread"][pol] is not None
                       else "-", "yes" if s["same_order"] else "no"])
    finally:
        if not args.out:
            shutil.rmtree(out, ignore_errors=True)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    header = ["scenario", "policy"] + [f"rate / {f:g}" for f in factors] + [
        "max spread", "order kept"]
    print("modelled CCT p50 (ms) at each GPU NIC rate (* fidelity outside tolerance)")
    print(table(header, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

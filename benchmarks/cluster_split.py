"""What splitting a fabric over two servers costs: the same scenario on one server and split
over two, side by side in one run - latency p50/p99 and CCT p50 per policy, and the ratios.

    sudo .venv/bin/python benchmarks/cluster_split.py --servers localhost,10.0.0.2
    sudo .venv/bin/python benchmarks/cluster_split.py --emulate      # a second server emulated
                                                                     # on this machine (tests)
Options: --scenario NAME|FILE (default: default), --iterations N (default 3), --link vxlan|ssh.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from testbed.run import runner  # noqa: E402
from testbed.scenario.catalog import find  # noqa: E402


def figures(run) -> dict:
    """Per policy: latency p50, p99, CCT p50 (emulated us) and drops of a ``RunResult``."""
    out = {}
    for name, p in run.policies.items():
        lat, cct = p.emulated.latency_us, p.emulated.cct_us
        out[name] = (lat and lat.p50, lat and lat.p99, cct and cct.p50, p.drops)
    return out


def ratio(a, b) -> str:
    return f"{b / a:.2f}x" if a and b is not None else "-"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--servers", help="this machine first, e.g. localhost,10.0.0.2")
    p.add_argument("--emulate", action="store_true", help="emulate the second server here")
    p.add_argument("--scenario", default="ring")
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--link", default="auto", choices=("auto", "vxlan", "ssh"))
    args = p.parse_args(argv)
    if os.geteuid() != 0 or not (args.servers or args.emulate):
        print("cluster_split: run as root with --servers or --emulate", file=sys.stderr)
        return 2
    base = find(args.scenario).override({"workload": {"iterations": args.iterations}})
    with contextlib.ExitStack() as stack:
        if args.emulate:
            from tests.cluster.server import EmulatedServer
            os.environ.setdefault("HOME", tempfile.mkdtemp(prefix="cluster-split-"))
            servers = ["localhost", stack.enter_context(EmulatedServer()).address]
        else:
            servers = [s.strip() for s in args.servers.split(",")]
        out = tempfile.mkdtemp(prefix="cluster-split-", dir="/var/tmp")
        print(f"one server, then split over {', '.join(servers)} ({args.link} links); "
              f"runs in {out}", flush=True)
        one = runner.run(base, out_root=out)
        split_scenario = base.override({"cluster": {"servers": servers, "link": args.link}})
        two = runner.run(split_scenario, out_root=out)
    a, b = figures(one), figures(two)
    split = two.get("cluster") or {}
    print(f"\nsplit: {split.get('link')}, {len(split.get('cross_links', []))} cross-server "
          f"links, clocks {split.get('clock_offsets')}")
    print(f"{'policy':12} {'lat p50 us':>22} {'lat p99 us':>24} {'CCT p50 ms':>22} "
          f"{'drops':>12}")
    for name in a:
        (l50a, l99a, ca, da), (l50b, l99b, cb, db) = a[name], b.get(name, (None,) * 4)
        print(f"{name:12} {l50a:>8.1f} -> {l50b:>7.1f} {ratio(l50a, l50b):>5} "
              f"{l99a:>9.1f} -> {l99b:>8.1f} {ratio(l99a, l99b):>5} "
              f"{ca / 1000:>7.1f} -> {cb / 1000:>6.1f} {ratio(ca, cb):>5} "
              f"{da:>5} -> {db}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Soak: a scenario run again and again for a bounded time, watching for leaks.

After every run it records the runner's resident memory, open file descriptors and threads,
ovs-vswitchd's resident memory, and what is on the machine: network namespaces, interfaces,
OVS bridges, processes of the testbed. A leak shows as growth from run to run; the verdict
compares the first run with the last (the first run warms caches and imports, so memory is
compared from the second run on).

    sudo .venv/bin/python benchmarks/soak.py --minutes 15
    sudo .venv/bin/python benchmarks/soak.py --minutes 5 --scenario incast --iterations 3

Results of every run go to ``--out`` (default ``results/soak-<time>``), the soak's own table
to ``soak.json`` there.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from testbed.run import runner  # noqa: E402
from testbed.scenario.catalog import find  # noqa: E402
from testbed.base.ledger import tagged_bridges  # noqa: E402
from testbed.base.atomic import write_json_atomic  # noqa: E402

MARKERS = ("traffic.agent", "traffic.flows", "testbed.switchq.emulator", "controllers.launcher",
           "mininet:")


def rss_kb(pid="self") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def ovs_pid():
    try:
        with open("/var/run/openvswitch/ovs-vswitchd.pid") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def machine() -> dict:
    netns, procs = set(), 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            netns.add(os.readlink(f"/proc/{pid}/ns/net"))
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().decode(errors="replace")
        except OSError:
            continue
        procs += any(m in cmd for m in MARKERS)
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    ports = subprocess.run(["ovs-vsctl", "--timeout=5", "show"], capture_output=True,
                           text=True).stdout.count("Port ")
    ovs = ovs_pid()
    return {"net_namespaces": len(netns), "interfaces": len(links.splitlines()),
            "testbed_bridges": len(tagged_bridges()), "ovs_ports": ports,
            "testbed_processes": procs, "ovs_vswitchd_rss_kb": rss_kb(ovs) if ovs else None}


def sample(run: int, seconds: float, status: str) -> dict:
    return {"run": run, "status": status, "seconds": round(seconds, 1),
            "runner_rss_kb": rss_kb(), "runner_fds": len(os.listdir("/proc/self/fd")),
            "runner_threads": len(os.listdir("/proc/self/task")), **machine()}


COLUMNS = ("run", "status", "seconds", "runner_rss_kb", "runner_fds", "runner_threads",
           "ovs_vswitchd_rss_kb", "net_namespaces", "interfaces", "testbed_bridges",
           "ovs_ports", "testbed_processes")


def verdict(rows: list) -> list:
    """Problems seen between the runs (empty: no growth)."""
    if len(rows) < 3:
        return ["too few runs to judge (need 3; give more --minutes)"]
    base, second, last = rows[0], rows[1], rows[-1]  # the first run warms up
    problems = []
    for key in ("runner_fds", "runner_threads", "net_namespaces", "interfaces",
                "testbed_bridges", "ovs_ports", "testbed_processes"):
        if last[key] > base[key]:
            problems.append(f"{key} grew from {base[key]} to {last[key]}")
    for key, who in (("runner_rss_kb", "runner"), ("ovs_vswitchd_rss_kb", "ovs-vswitchd")):
        growth = memory_growth([r[key] for r in rows[1:]])  # the first run warms up
        if growth is not None and growth > 0.02 * second[key]:
            problems.append(f"{who} memory grew {growth:,.0f} kB per run")
    return problems


def memory_growth(values: list):
    """kB per run between the medians of the first and the last third (resident memory
    moves up and down with the allocator; a leak moves the whole series)."""
    if any(v is None for v in values) or len(values) < 2:
        return None
    third = max(1, len(values) // 3)
    first, last = sorted(values[:third]), sorted(values[-third:])
    return (last[len(last) // 2] - first[len(first) // 2]) / (len(values) - third)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=15.0, help="how long to keep running")
    p.add_argument("--max-runs", type=int, default=100, help="stop after this many runs")
    p.add_argument("--scenario", default="ring", help="built-in name or YAML file")
    p.add_argument("--iterations", type=int, help="override the scenario's iterations")
    p.add_argument("--out", help="where the runs go (default results/soak-<time>)")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        print("soak: run as root (sudo)", file=sys.stderr)
        return 2
    scenario = find(args.scenario)
    if args.iterations:
        scenario = scenario.override({"workload": {"iterations": args.iterations}})
    out = args.out or os.path.join("results", time.strftime("soak-%Y%m%d-%H%M%S"))
    os.makedirs(out, exist_ok=True)
    rows = [dict(sample(0, 0.0, "before"))]
    print("  ".join(f"{c:>12}" for c in COLUMNS), flush=True)
    deadline = time.monotonic() + 60 * args.minutes
    run = 0
    try:
        while time.monotonic() < deadline and run < args.max_runs:
            run += 1
            t0 = time.monotonic()
            result = runner.run(scenario, out_root=out)
            rows.append(sample(run, time.monotonic() - t0, result.status))
            print("  ".join(f"{str(rows[-1][c]):>12}" for c in COLUMNS), flush=True)
    except KeyboardInterrupt:  # the run tore itself down; judge what was measured
        print("interrupted: judging the runs so far", flush=True)
    runs = rows[1:]
    problems = verdict(runs)
    report = {"scenario": scenario.name, "minutes": args.minutes, "rows": rows,
              "problems": problems, "verdict": "no growth" if not problems else "growth"}
    write_json_atomic(os.path.join(out, "soak.json"), report)
    print(f"\n{len(runs)} runs in {args.minutes:g} min: "
          + ("no growth in memory, file descriptors or kernel objects" if not problems
             else "; ".join(problems)))
    print(f"soak report: {os.path.join(out, 'soak.json')}")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())

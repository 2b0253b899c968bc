#!/usr/bin/env python3
"""Benchmark: where a run's CPU goes, per component and per 1,000 delivered frames, against
the floor - the same frames pushed through the same fabric by the cheapest sender there is.

    sudo .venv/bin/python benchmarks/cost.py [--scenario NAME|FILE] [--policy P ...] [--json]

Side by side in one invocation, per policy:

* run: the scenario as ``python -m testbed run`` runs it; its ``emulation_cost`` (CPU seconds
  of the GPU agents, Open vSwitch, the switch-queue emulator, the controller, the runner, the
  kernel and the rest of the machine, from the start of the agents to the end of the traffic);
* floor: a fresh fabric under the same policy (controller, shaping, no queue emulator), and
  ``benchmarks.floor`` pushing the frames the run's GPUs received - each data frame from its
  sender to its receiver at the sender's mean frame size, and each GPU's ACK/NAK/CNP frames
  (as ACK-sized frames) to the peers it received data from - from prebuilt frames as fast as
  the NICs take them.

Prints CPU microseconds per delivered data frame for each component (x 1,000: CPU
milliseconds per 1,000 frames; both sides count data frames only, the control frames ride
along) and the ratio run / floor.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from testbed.scenario import catalog  # noqa: E402
from testbed.run import cost, runner
from testbed.fabric.capabilities import detect  # noqa: E402
from testbed.base.ledger import Ledger  # noqa: E402
from testbed.plan.checks import check_scenario  # noqa: E402
from testbed.plan.policyrun import decide  # noqa: E402

ROW_NAMES = {"agents": "GPU agents (floor: raw sender)", "open_vswitch": "Open vSwitch",
             "switch_queue_emulator": "switch-queue emulator", "controller": "controller",
             "runner": "runner", "kernel": "kernel (softirq, system)", "other": "other"}


def floor_frames(records_dir: str, plan) -> dict:
    """host -> [{ip, mac, count, bytes}] of what the run's GPUs received, by sender."""
    by_rank = {h.rank: h for h in plan.gpus}
    data = defaultdict(lambda: defaultdict(int))  # src rank -> dst rank -> frames
    for h in plan.gpus:
        path = os.path.join(records_dir, f"{h.name}.packets.csv")
        with open(path, newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                data[int(row["src"])][int(row["dst"])] += 1
    out = {}
    for h in plan.gpus:
        sizes = {"d": [], "c": []}
        with open(os.path.join(records_dir, f"{h.name}.tx.csv"), newline="",
                  encoding="utf-8") as f:
            for row in csv.DictReader(f):
                sizes[row.get("kind", "d")].append(int(row["bytes"]))
        mean = {k: (sum(v) // len(v) if v else 0) for k, v in sizes.items()}
        frames = [{"ip": by_rank[d].ip, "mac": by_rank[d].mac, "count": n, "bytes": mean["d"]}
                  for d, n in sorted(data[h.rank].items())]
        # control frames go back to the peers this GPU received data from, in proportion
        senders = {s: row[h.rank] for s, row in data.items() if row.get(h.rank)}
        total = sum(senders.values())
        for s, n in sorted(senders.items()):
            count = round(len(sizes["c"]) * n / total)
            if count:
                frames.append({"ip": by_rank[s].ip, "mac": by_rank[s].mac, "count": count,
                               "bytes": mean["c"], "control": True})
        out[h.name] = frames
    return out


def run_floor(scenario, name: str, records_dir: str, work: str) -> dict:
    """The floor of one policy: its fabric, the frames of its run, the cost."""
    caps = detect()
    plan = check_scenario(scenario)
    run = decide(name, plan, scenario, caps)
    frames = floor_frames(records_dir, plan)
    expect = defaultdict(int)
    for host, dsts in frames.items():
        for d in dsts:
            expect[d["ip"]] += d["count"]
    os.makedirs(work, exist_ok=True)
    ledger = Ledger(runner.new_run_id())
    ledger.acquire(work)
    try:
        with runner.fabric_up(run, caps, work, ledger) as session:
            gpus = [{"host": h.name, "intf": h.intf, "ip": h.ip, "mac": h.mac,
                     "netns_pid": session.fabric.netns_pid(h.name), "frames": frames[h.name],
                     "expect": expect[h.ip]} for h in plan.gpus]
            path = os.path.join(ledger.private_dir, f"floor-{name}.json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump({"gpus": gpus}, f)
            proc = subprocess.Popen([sys.executable, "-m", "benchmarks.floor", path],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    cwd=os.path.dirname(HERE), start_new_session=True)
            ledger.add_pid(proc.pid)
            try:
                _line(proc, "ready", 60)

                def snapshot():
                    return cost.Snapshot.take({
                        "agents": [proc.pid], "open_vswitch": cost.ovs_pids(),
                        "controller": session.controller.pids(), "runner": [os.getpid()]})
                before = snapshot()
                proc.stdin.write(b"go\n")
                proc.stdin.flush()
                done = _line(proc, "done", 600)
                after = snapshot()
            finally:
                proc.kill()
                proc.wait()
    finally:
        ledger.teardown()
        ledger.close()
    _word, sent, received, data = done.split()
    report = cost.cost_report(before, after, int(data), os.cpu_count() or 1)
    report.update(frames_sent=int(sent), frames_received=int(received))
    return report


def _line(proc, word: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 1.0)
        if ready:
            line = proc.stdout.readline().decode().strip()
            if not line:
                raise RuntimeError(f"benchmarks.floor exited (code {proc.wait()})")
            if line.startswith(word):
                return line
    raise RuntimeError(f"benchmarks.floor: no '{word}' after {timeout:.0f} s")


def table(rows: dict) -> str:
    """rows: policy -> {"run": cost, "floor": cost}."""
    names = list(rows)
    head = f"{'CPU us per delivered frame':<32}" + "".join(
        f"{n + ' run':>16}{'floor':>9}" for n in names)
    lines = [head, "-" * len(head)]
    for comp in cost.COMPONENTS:
        line = f"{ROW_NAMES[comp]:<32}"
        for n in names:
            r, f = rows[n]["run"]["us_per_frame"][comp], rows[n]["floor"]["us_per_frame"][comp]
            line += f"{r:>16,.1f}{f:>9,.1f}"
        lines.append(line)
    for label, key in (("total", "total_us_per_frame"),):
        line = f"{label:<32}"
        for n in names:
            line += f"{rows[n]['run'][key]:>16,.1f}{rows[n]['floor'][key]:>9,.1f}"
        lines.append(line)
    line = f"{'ratio run / floor':<32}"
    for n in names:
        ratio = rows[n]["run"]["total_us_per_frame"] / rows[n]["floor"]["total_us_per_frame"]
        line += f"{ratio:>15.2f}x{'':>9}"
    lines.append(line)
    line = f"{'frames delivered':<32}"
    for n in names:
        line += (f"{rows[n]['run']['frames_delivered']:>16,}"
                 f"{rows[n]['floor']['frames_delivered']:>9,}")
    lines.append(line)
    line = f"{'window (s), CPUs busy':<32}"
    for n in names:
        r, f = rows[n]["run"], rows[n]["floor"]
        line += (f"{r['window_s']:>9.1f} s {r['busy_share']:>4.0%}"
                 f"{f['window_s']:>4.1f}/{f['busy_share']:.0%}")
    lines.append(line)
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", default="ring", help="built-in name or YAML file")
    p.add_argument("--policy", action="append", help="only these policies")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    scenario = catalog.find(args.scenario)
    if args.policy:
        scenario = scenario.with_policies(args.policy)
    # the rate chosen once: the floor pushes the same frames at the run's rate
    scenario, _ = runner.choose_time_scale(scenario, lambda s: print(s, file=sys.stderr))
    with tempfile.TemporaryDirectory(prefix="testbed-cost-") as work:
        run = runner.run(scenario, out_root=work, progress=lambda s: print(s, file=sys.stderr))
        rows = {}
        for name, fig in run.policies.items():
            print(f"[{name}] floor: the same frames through a fresh fabric", file=sys.stderr)
            floor = run_floor(scenario, name, os.path.join(run.run_dir, "records", name),
                              os.path.join(work, f"floor-{name}"))
            rows[name] = {"run": fig.emulation_cost.to_json(), "floor": floor,
                          "fidelity": fig.fidelity.verdict,
                          "cct_p50_ms": round(fig.emulated.cct_us.p50 / 1000, 1)}
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"scenario {scenario.name}: {os.cpu_count()} CPUs")
    print(table(rows))
    for name, r in rows.items():
        print(f"{name}: fidelity {r['fidelity']}, CCT p50 {r['cct_p50_ms']:,} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())

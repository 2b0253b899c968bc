#!/usr/bin/env python3
"""Benchmark: one sample of every switch egress queue, raw netlink vs a plain pyroute2 dump.

    sudo .venv/bin/python benchmarks/sampler.py [--policy lossless] [--samples N] [--json]

Builds the default fabric's switch ports (2 spines, 4 leaves, 2 GPUs per leaf: 24 switch
egress ports) with the chosen policy's traffic classes - the same ``tc`` commands a run uses -
in a private network namespace (``unshare --net``: it vanishes with the process, nothing is
left), then times, side by side in one run:

* ``pyroute2``: ``IPRoute().get_qdiscs()`` - a plain dump, every qdisc parsed;
* ``testbed``: ``testbed.base.netlink.QdiscSampler.sample()`` - the switch-queue emulator's sampler,
  returning the backlog of every class buffer of every switch port;
* its ``sample_subset()`` - what the emulator reads between those full samples: the buffers
  of the classes whose backlog it acts on (ECN, PFC), one request per queue in one batch;
* ``emulator``: one whole sample of the switch-queue emulator as a run configures it for the policy
  (``testbed.switchq.emulator.Emulator.step``: its kernel counters where the kernel runs them,
  marking, PFC, load, the timeline) on the idle fabric, and its CPU per second at the default 1 ms
  interval.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from privatens import reexec_in_private_netns  # noqa: E402


def build(policy_name: str):
    from controllers.policy import make_policy
    from testbed.scenario.config import DEFAULT
    DEFAULT = DEFAULT.for_checks()  # at the reference rate the benchmark's figures are for
    from testbed.fabric.network import egress_shapes
    from testbed.base.frames import link_mtu
    from testbed.fabric.shaping import tc_commands
    from testbed.base.topology import FabricPlan

    scenario = DEFAULT
    t = scenario.topology
    plan = FabricPlan.for_topology(t)
    policy = make_policy(policy_name, plan, scenario)
    classes = policy.traffic_classes()
    shapes = egress_shapes(plan, t, classes)
    mtu = link_mtu(scenario.workload.mtu)
    switch_ports = [name for name, _kind in plan.switch_interfaces()]
    cmds = ["ip link set lo up"]
    for link in plan.links:
        cmds.append(f"ip link add {link.intf1} type veth peer name {link.intf2}")
        cmds += [f"ip link set {link.intf1} up", f"ip link set {link.intf2} up"]
    for name in switch_ports:
        cmds.append(f"ip link set dev {name} mtu {mtu}")
        cmds += tc_commands(name, shapes[name], netem=False, mtu=mtu)
    subprocess.run(" && ".join(cmds), shell=True, check=True)
    wanted = [(name, c.minor << 16) for name in switch_ports for c in classes]
    return plan, classes, wanted


def emulator_step(policy_name: str, samples: int) -> dict:
    """The emulator's whole sample, configured as a run configures it, on the idle fabric."""
    import resource

    from controllers.policy import make_policy
    from testbed.scenario.config import DEFAULT
    DEFAULT = DEFAULT.for_checks()  # at the reference rate the benchmark's figures are for
    from testbed.base.frames import link_mtu
    from testbed.switchq.emulator import Emulator
    from testbed.switchq.contract import EmulatorConfig
    from testbed.base.topology import FabricPlan

    t = DEFAULT.topology
    plan = FabricPlan.for_topology(t)
    policy = make_policy(policy_name, plan, DEFAULT)
    watch = policy.watched_ports() if policy.wants_queue_load else None
    cfg = EmulatorConfig(plan=plan, classes=tuple(policy.traffic_classes()),
                         host_pids={h.name: os.getpid() for h in plan.hosts},
                         interval_us=DEFAULT.sample_interval_us, out="/nonexistent",
                         host_rate_mbit=t.host_rate_mbit, fabric_rate_mbit=t.fabric_rate_mbit,
                         nic_queue_bytes=t.nic_queue_bytes, ecn_marking="sampled",
                         marking_via="bpf", queue_counting="bpf",
                         mtu=link_mtu(DEFAULT.workload.mtu),
                         switch_rate_headroom=DEFAULT.emulation.switch_rate_headroom,
                         watch={d: tuple(p) for d, p in watch.items()} if watch else None)
    emu = Emulator(cfg)
    emu.open()
    try:
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        out = time_it(lambda: (emu.step(time.time_ns()), emu.counters.__setitem__(
            "samples", emu.counters["samples"] + 1)), samples)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        cpu = (r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime) / (samples + 1)
        out.update(acting_backlog_from=emu.counting, cpu_share_at_1ms=cpu / 1e-3)
        return out
    finally:
        emu.close()


def time_it(fn, samples: int):
    fn()  # warm up
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return {"mean_ms": statistics.fmean(times), "p50_ms": times[len(times) // 2],
            "p99_ms": times[int(len(times) * 0.99) - 1], "samples": samples}


def inner(args) -> int:
    from pyroute2 import IPRoute

    from testbed.base.netlink import QdiscSampler

    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    _plan, classes, wanted = build(args.policy)
    ipr = IPRoute()
    n_qdiscs = len(list(ipr.get_qdiscs()))
    acting = [c for c in classes if c.ecn or c.pfc] or classes[:1]
    subset = [(name, h) for name, h in wanted if h in {c.minor << 16 for c in acting}]
    sampler = QdiscSampler(wanted, subset=subset)
    got = sampler.sample()
    assert len(got) == len(wanted), f"sampler returned {len(got)} of {len(wanted)} queues"
    assert len(sampler.sample_subset()) == len(subset)
    plain = time_it(lambda: list(ipr.get_qdiscs()), args.samples)
    ours = time_it(sampler.sample, args.samples)
    some = time_it(sampler.sample_subset, args.samples)
    emu = emulator_step(args.policy, args.samples)
    report = {"policy": args.policy, "classes": [c.name for c in classes],
              "qdiscs_in_namespace": n_qdiscs, "queues_sampled": len(wanted),
              "pyroute2_dump": plain, "testbed_sampler": ours,
              "testbed_subset": dict(some, queues=len(subset),
                                     classes=[c.name for c in acting]),
              "emulator": emu, "speedup": plain["mean_ms"] / ours["mean_ms"]}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"default fabric, {args.policy} policy: {len(wanted)} class buffers on 24 switch "
          f"ports, {n_qdiscs} qdiscs in the namespace; {args.samples} samples on one core")
    print(f"{'':28}{'mean':>9}{'p50':>9}{'p99':>9}")
    for label, r in (("pyroute2 get_qdiscs()", plain), ("testbed QdiscSampler", ours),
                     (f"  {len(subset)} queues of {', '.join(c.name for c in acting)}", some)):
        print(f"{label:28}{r['mean_ms']:>7.3f}ms{r['p50_ms']:>7.3f}ms{r['p99_ms']:>7.3f}ms")
    print(f"{'emulator step (' + emu['acting_backlog_from'] + ')':28}{emu['mean_ms']:>7.3f}ms"
          f"{emu['p50_ms']:>7.3f}ms{emu['p99_ms']:>7.3f}ms  CPU at 1 ms: "
          f"{emu['cpu_share_at_1ms']:.1%} of a core")
    print(f"speed-up {report['speedup']:.1f}x; target (one sample <= 1 ms): "
          f"{'met' if ours['p99_ms'] <= 1.0 else 'NOT met'} at p99")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    from controllers.policy import policy_names
    p.add_argument("--policy", default="lossless", choices=policy_names())
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--json", action="store_true")
    p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.inner:
        return inner(args)
    return reexec_in_private_netns(__file__)


if __name__ == "__main__":
    sys.exit(main())

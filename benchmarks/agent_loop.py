#!/usr/bin/env python3
"""Benchmark: CPU per frame the GPU agent handles, against its bare send path, side by side.

    sudo .venv/bin/python benchmarks/agent_loop.py [--size BYTES] [--iterations N] [--json]

In a private network namespace (``unshare --net``: it vanishes with the process), GPU hosts
each with a NIC (one end of a veth pair, shaped like a run's NIC; every GPU's address is on
the other ends, so each frame is delivered to its GPU whichever NIC it left by), pinned to one
CPU core:

* loop: one ``traffic.agent.Loop`` serving every GPU, which all-reduce (ring) over real
  RoCEv2 RC - every frame sent, received, acknowledged and timestamped by the kernel, the
  records written in memory - as fast as the veth takes them; CPU (user + system, of this
  process) per frame handled (each frame counts once where it is sent and once where it is
  received: data, ACKs, NAKs, CNPs);
* send: the agent's send path alone (``benchmarks/send_rate.py``'s loop: requester, template,
  socket, transmit timestamps), CPU per frame sent.

The ratio loop / send says what the rest of the agent - receiving, the transport, the event
loop, timers - costs on top of putting a frame on the wire.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from privatens import reexec_in_private_netns  # noqa: E402


def hosts(n: int):
    return [{"rank": i, "host": f"gpu{i + 1}", "intf": f"nic{i}", "ip": f"10.0.{i + 1}.1",
             "mac": f"02:00:0a:00:{i + 1:02x}:01", "far": f"far{i}",
             "far_mac": f"02:00:0a:ff:{i + 1:02x}:01"} for i in range(n)]


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def user_s() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_utime


def setup(gpus, rate_mbit: float) -> None:
    # every GPU's address is local to this namespace: frames from a local address must be
    # accepted on the far ends
    cmds = ["ip link set lo up", "sysctl -qw net.ipv4.conf.all.accept_local=1",
            "sysctl -qw net.ipv4.conf.all.rp_filter=0",
            "sysctl -qw net.ipv4.conf.default.rp_filter=0",
            "sysctl -qw net.ipv4.conf.default.accept_local=1"]
    for h in gpus:
        nic, far = h["intf"], h["far"]
        cmds += [f"ip link add {nic} address {h['mac']} type veth peer name {far} "
                 f"address {h['far_mac']}", f"ip link set {nic} mtu 9000",
                 f"ip link set {far} mtu 9000", f"ip link set {nic} up",
                 f"ip link set {far} up", f"ip addr add {h['ip']}/32 dev {far}"]
        if rate_mbit:  # a shaped NIC, as in a run: frames leave on the shaper's clock
            cmds += [f"tc qdisc add dev {nic} root handle 1: htb default 1",
                     f"tc class add dev {nic} parent 1: classid 1:1 htb rate "
                     f"{int(rate_mbit * 1000)}kbit burst 4200 cburst 4200"]
    for cmd in cmds:
        subprocess.run(cmd.split(), check=True, stderr=subprocess.DEVNULL)


def loop_run(gpus, size: int, iterations: int, rate_bps: float) -> dict:
    from traffic.agent import Loop

    class Sink:
        def write(self, _s):
            pass

        def flush(self):
            pass

    r, w = os.pipe()
    os.write(w, b"stop\n")
    from testbed.run.agent_processes import reference_transport
    from traffic.contract import Compute, GpuConfig, Peer, WorkloadSpec

    def peers(h):  # whoever a frame is for, it leaves by this GPU's NIC to its far end
        return tuple(Peer(p["rank"], p["host"], p["ip"], h["far_mac"])
                     for p in gpus if p is not h)

    # no congestion control: the loop's own cost, as measured before hyperscale ran DCQCN
    transport = dataclasses.replace(reference_transport(), congestion_control="none",
                                    qp_limiter=None)
    configs = [GpuConfig(rank=h["rank"], host=h["host"], intf=h["intf"], ip=h["ip"],
                         mac=h["mac"], ranks=len(gpus), mtu=4096, transport=transport,
                         link_rate_bps=rate_bps, seed=1,
                         workloads=(WorkloadSpec("ring", size, iterations, 4, 1),),
                         compute=Compute(), straggler=None, out_dir="/nonexistent",
                         netns_pid=os.getpid(), peers=peers(h))
               for h in gpus]
    loop = Loop(configs, out=Sink(), commands=r)
    try:
        loop.open()
        c0, u0, t0 = cpu_s(), user_s(), time.perf_counter()
        loop.run(time.time_ns())
        c1, u1, t1 = cpu_s(), user_s(), time.perf_counter()
        nics = [g.nic for g in loop.gpus]
        for nic in nics:
            nic.collect_stamps()
        sent = sum(nic.tx_key for nic in nics)
        received = sum(len(nic.packets) + sum(q.req.counters["acks"] + q.req.counters["naks"]
                                              for q in nic.qps.values()) for nic in nics)
        return {"frames_sent": sent, "frames_received": received,
                "stamps": sum(len(nic.tx_log) for nic in nics),
                "cpu_s": c1 - c0, "user_s": u1 - u0, "wall_s": t1 - t0, "wakes": loop.wakes,
                "us_per_frame_handled": (c1 - c0) * 1e6 / (sent + received)}
    finally:
        loop.close()
        os.close(r)
        os.close(w)


def send_run(packets: int) -> dict:
    """``send_rate.py``'s agent loop, in this (private) namespace, its veth pair set up."""
    import send_rate

    send_rate.setup()
    agent = send_rate.make_agent(4096)
    try:
        send_rate.pump_sends(agent, 64 * 4096, (0, 0))
        c0 = cpu_s()
        sent = send_rate.pump_sends(agent, packets * 4096, (0, 1))
        c1 = cpu_s()
        return {"frames_sent": sent, "cpu_s": c1 - c0,
                "us_per_frame_sent": (c1 - c0) * 1e6 / sent}
    finally:
        agent.close()


def inner(args) -> int:
    gpus = hosts(args.gpus)
    setup(gpus, args.rate_mbit)
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    loop = loop_run(gpus, args.size, args.iterations, (args.rate_mbit or 10_000) * 1e6)
    out = subprocess.run(["unshare", "--net", sys.executable, os.path.abspath(__file__),
                          "--send-only", "--packets", str(args.packets)],
                         capture_output=True, text=True, check=True)
    send = json.loads(out.stdout)
    report = {"cpu": cpu, "loop": loop, "send": send,
              "ratio": loop["us_per_frame_handled"] / send["us_per_frame_sent"]}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"GPU agent on one core (cpu {cpu}), {args.gpus} GPUs on veth NICs at "
          f"{args.rate_mbit:g} Mbit/s in a private namespace")
    print(f"loop: {loop['frames_sent']:,} frames sent, {loop['frames_received']:,} received "
          f"({loop['stamps']:,} transmit timestamps) in {loop['cpu_s']:.2f} CPU-s, "
          f"({loop['user_s']:.2f} in user space), {loop['wakes']:,} wakes: "
          f"{loop['us_per_frame_handled']:.2f} us per frame handled")
    print(f"send: {send['frames_sent']:,} frames in {send['cpu_s']:.2f} CPU-s: "
          f"{send['us_per_frame_sent']:.2f} us per frame sent")
    print(f"ratio loop / send: {report['ratio']:.2f}x (target <= 3x)")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=1 << 20, help="bytes per GPU per all-reduce")
    p.add_argument("--iterations", type=int, default=5)
    p.add_argument("--rate-mbit", type=float, default=40.0,
                   help="shape every NIC (0: unshaped)")
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--packets", type=int, default=100_000, help="frames of the send path")
    p.add_argument("--json", action="store_true")
    p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--send-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.send_only:  # in a second private namespace, pinned like the loop
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        print(json.dumps(send_run(args.packets)))
        return 0
    if args.inner:
        return inner(args)
    return reexec_in_private_netns(__file__)


if __name__ == "__main__":
    sys.exit(main())

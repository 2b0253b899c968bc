"""The kernel queue counters (testbed.fabric.bpfqueue) against the qdisc's own backlog, on a real
veth inside a throw-away network namespace.

A switch port as a run builds it: HTB with the counted class (DSCP 26, 1 Mbit/s) and a default
class. Frames of the class and of another DSCP are queued; while the class drains, the count
read from the mapped counters must equal what the kernel reports for the class's queue.
"""
import json
import os
import socket
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.integration

DSCP = 26
CLASS_QDISC = 0x100000  # handle 10: under class 1:10


def inside() -> dict:
    from testbed.fabric import bpf, bpfmark, bpfqueue
    from testbed.base.netlink import QdiscSampler
    for cmd in ["sysctl -qw net.ipv6.conf.all.disable_ipv6=1",
                "sysctl -qw net.ipv6.conf.default.disable_ipv6=1",
                "ip link add qa type veth peer name qb", "ip link set qa up",
                "ip link set qb up", "tc qdisc add dev qa root handle 1: htb default 20",
                "tc class add dev qa parent 1: classid 1:10 htb rate 1mbit burst 2000",
                "tc class add dev qa parent 1: classid 1:20 htb rate 1mbit burst 2000",
                "tc qdisc add dev qa parent 1:10 handle 10: bfifo limit 1000000",
                "tc qdisc add dev qa parent 1:20 handle 20: bfifo limit 1000000",
                f"tc filter add dev qa parent 1: protocol ip prio 1 u32 match ip dsfield "
                f"{DSCP << 2} 0xfc flowid 1:10"]:
        subprocess.run(cmd.split(), check=True)
    nl = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
    nl.bind((0, 0))
    clsact = bpf.Clsact(nl)
    counters = bpfqueue.QueueCounters(["qa"], [DSCP], {"qa": (None, "qb")}, clsact)
    counters.open()
    sampler = QdiscSampler([("qa", CLASS_QDISC)])
    tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    tx.bind(("qa", 0))
    ours = bpfmark._probe_frame(DSCP << 2 | 2) + bytes(1000)
    other = bpfmark._probe_frame(10 << 2) + bytes(500)
    for i in range(20):
        tx.send(ours)
        if i % 4 == 0:
            tx.send(other)
    pairs = []
    for _ in range(8):  # while the class drains (a frame every 8.5 ms)
        true = sampler.sample()[("qa", CLASS_QDISC)].backlog
        pairs.append((true, counters.backlogs()[0]))
        time.sleep(0.02)
    deadline = time.time() + 5
    while sampler.sample()[("qa", CLASS_QDISC)].backlog and time.time() < deadline:
        time.sleep(0.05)
    drained = (sampler.sample()[("qa", CLASS_QDISC)].backlog, counters.backlogs()[0])
    counters.close()
    clsact.close()
    return {"pairs": pairs, "drained": drained, "frame": len(ours)}


@pytest.fixture(scope="module")
def seen():
    from .runs import in_private_netns  # not at the top: this file also runs as a script
    return in_private_netns(__file__)


def test_the_counted_backlog_is_the_class_queues_own(seen):
    pairs = seen["pairs"]
    assert pairs[0][0] >= 10 * seen["frame"]  # a real backlog, draining
    assert pairs[-1][0] < pairs[0][0]
    # the same bytes, or one frame apart (one may be between the queue and the peer)
    for true, counted in pairs:
        assert abs(counted - true) in (0, seen["frame"]), pairs


def test_the_count_returns_to_zero_once_drained(seen):
    assert seen["drained"] == [0, 0]


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    print(json.dumps(inside()))

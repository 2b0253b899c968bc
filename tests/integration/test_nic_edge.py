"""The GPU NIC's send side (traffic.nicio) on a real shaped veth, inside a throw-away network
namespace: frames patched and sent, their kernel transmit timestamps joined to them, by the C
extension and by the pure-Python implementation alike.

The NIC is shaped like a run's (HTB at 40 Mbit/s), so the timestamps must show the frames
leaving one serialization time apart, in the order they were sent.
"""
import json
import os
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.integration

RATE_MBIT = 40
# 50 ms of backlog: enough gaps that one late host timer (1-2 in a second on the reference
# VM) is one gap in many
FRAMES = 60


def inside() -> dict:
    from traffic import nicio, roce
    from traffic.rxsocket import open_tx
    for cmd in ["ip link add nic0 type veth peer name far0", "ip link set nic0 mtu 9000",
                "ip link set far0 mtu 9000", "ip link set nic0 up", "ip link set far0 up",
                "tc qdisc add dev nic0 root handle 1: htb default 1",
                f"tc class add dev nic0 parent 1: classid 1:1 htb rate {RATE_MBIT}mbit "
                "burst 4200 cburst 4200"]:
        subprocess.run(cmd.split(), check=True)
    conn = roce.Connection(roce.Endpoint("02:00:00:00:00:01", "10.0.0.1"),
                           roce.Endpoint("02:00:00:00:00:02", "10.0.0.2"), 0xC001, 0x101)
    out = {}
    for impl, use_c in (("c", True), ("python", False)):
        tx = open_tx("nic0")
        sender, stamps = nicio.Sender(tx, use_c=use_c), nicio.Stamps(tx, use_c=use_c)
        tpl = conn.template(roce.RC_RDMA_WRITE_MIDDLE, 4096)
        pending, log, key = {}, [], 0
        for i in range(FRAMES):
            while True:  # the socket takes what the kernel queue has room for
                now = time.time_ns()
                size = sender.send(tpl, i, False, now, 0, i)
                if size:
                    break
                time.sleep(0.001)
            pending[key] = (now, size, "d")
            key += 1
        deadline, joined = time.time() + 3, 0
        last = (-1, 0)
        while joined < FRAMES and time.time() < deadline:
            n, ts, size = stamps.join(pending, log)
            joined += n
            if ts >= 0:
                last = (ts, size)
            time.sleep(0.01)
        out[impl] = {"log": log, "left_pending": len(pending), "last": last, "size": size}
        tx.close()
    return out


@pytest.fixture(scope="module")
def seen():
    from .runs import in_private_netns  # not at the top: this file also runs as a script
    return in_private_netns(__file__)


@pytest.mark.parametrize("impl", ["c", "python"])
def test_every_frame_is_joined_to_its_transmit_time(seen, impl):
    got = seen[impl]
    assert got["left_pending"] == 0 and len(got["log"]) == FRAMES
    for sent_ns, tx_ns, size, kind in got["log"]:
        assert kind == "d" and size == got["size"] and tx_ns >= sent_ns
    assert got["last"][0] == got["log"][-1][1]  # the last joined frame's time, returned


@pytest.mark.parametrize("impl", ["c", "python"])
def test_transmit_times_follow_the_shaper(seen, impl):
    """Queued frames leave one serialization time apart (the shaper's clock), in order."""
    log = seen[impl]["log"]
    times = [tx for _s, tx, _b, _k in log]
    assert times == sorted(times)
    frame_ns = log[0][2] * 8e9 / (RATE_MBIT * 1e6)
    gaps = [b - a for a, b in zip(times[2:], times[3:])]  # once the queue is full
    assert sum(abs(g - frame_ns) < 0.1 * frame_ns for g in gaps) >= 0.8 * len(gaps), gaps


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    print(json.dumps(inside()))

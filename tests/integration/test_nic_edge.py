"""The GPU NIC's send side (traffic.nicio) on a real shaped veth, inside a throw-away network
namespace: frames patched and sent, their kernel transmit timestamps joined to them, by the C
extension and by the pure-Python implementation alike.

The NIC is shaped as a run shapes it (``testbed.shaping`` at 40 Mbit/s), so the timestamps
must show the frames leaving one serialization time apart, in the order they were sent.
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
    from controllers.classes import TrafficClass
    from testbed.shaping import Shape, tc_commands
    from traffic import nicio, roce
    from traffic.rxsocket import open_tx
    shape = Shape(RATE_MBIT, (TrafficClass("all", 0, 0, (), 64000),),
                  nic_queue_bytes=(FRAMES + 1) * 4200)
    for cmd in ["ip link add nic0 type veth peer name far0", "ip link set nic0 mtu 9000",
                "ip link set far0 mtu 9000", "ip link set nic0 up", "ip link set far0 up",
                *tc_commands("nic0", shape, netem=False, mtu=4096)]:
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
    """What the NIC did, with idle CPUs kept ready to wake as every run keeps them
    (``testbed.wakeup``): the shaper's clock is the kernel's timer, and a frame the timer
    sends late is made up at 5% above the rate at most (``testbed.shaping.ceiling``). On the
    reference VM, not held, a fresh clone's test saw every gap 2% long (median 847 us against
    831)."""
    from testbed.wakeup import cpus_kept_awake
    from .runs import in_private_netns  # not at the top: this file also runs as a script
    with cpus_kept_awake():
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
    """Queued frames leave one serialization time apart (the shaper's clock), in order, never
    closer than its ceiling allows, and span as many frame times, though sent all at once.

    The NIC's bucket starts with a frame of credit and spends it at most 5% above the rate
    (``testbed.shaping.ceiling``), as it spends what a late timer lost: while it lasts, gaps
    are between 1/1.05 and 1 frame time, so the typical gap may be up to 5% short - measured
    811-812 us against 831 in 2 of 3 sets on the reference VM, where the timer was late by
    about 20 us per frame and the credit lasted 40 of the 57 gaps. Not every gap is on time:
    HTB's watchdog wakes as late as the host lets it. How precisely a run's NICs pace is the
    fidelity monitor's pacing check, measured in every run."""
    from testbed.shaping import CEIL_HEADROOM
    log = seen[impl]["log"]
    times = [tx for _s, tx, _b, _k in log]
    sent = [s for s, _tx, _b, _k in log]
    assert times == sorted(times)
    frame_ns = log[0][2] * 8e9 / (RATE_MBIT * 1e6)
    ceiling_ns = frame_ns / (1 + CEIL_HEADROOM)
    gaps = [b - a for a, b in zip(times, times[1:])]
    # never faster than the ceiling, give or take when the stamps are taken (measured: up to
    # 19 us short of it); without the ceiling the second frame left 17 us after the first
    assert min(gaps) > ceiling_ns - 0.05 * frame_ns, gaps
    typical = sorted(gaps)[len(gaps) // 2]
    assert ceiling_ns - 0.02 * frame_ns < typical < 1.02 * frame_ns, gaps
    span = (times[-1] - times[0]) / (len(gaps) * frame_ns)
    # the credit is one frame: the span is short by at most one frame time; stalls add
    assert 1 - 1.5 / len(gaps) <= span <= 1.25, (span, gaps)
    assert sent[-1] - sent[0] < 0.5 * (times[-1] - times[0])  # not the send times


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    print(json.dumps(inside()))

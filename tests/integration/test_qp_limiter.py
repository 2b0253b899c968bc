"""DCQCN's per-QP rate limiters (traffic.ratelimit) in a real GPU NIC qdisc, inside a
throw-away network namespace: the NIC shaped as a run shapes it under DCQCN (the RoCE class's
PFC gate above an HTB of QP classes), two QPs' classes and filters added over netlink, one QP
limited to a quarter of the line rate.

The kernel must pace the limited QP's frames at its rate and leave the other QP's at the line
rate, keep ACKs (no ECT) out of the QP's limiter, follow a rate change, and report a change
of a class that does not exist.
"""
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from testbed.base.frames import full_frame_bytes

pytestmark = pytest.mark.integration

RATE_MBIT = 40
FRAMES = 12
ME, PEER = "10.0.0.1", "10.0.0.2"


def inside() -> dict:
    from controllers.classes import PfcRule, TrafficClass
    from testbed.fabric.shaping import Shape, tc_commands
    from traffic.ratelimit import limiter_qdisc
    from traffic import nicio, ratelimit, roce
    from traffic.rxsocket import open_tx
    for cmd in ["ip link add nic0 type veth peer name far0", "ip link set nic0 mtu 9000",
                "ip link set far0 mtu 9000", "ip link set nic0 up", "ip link set far0 up"]:
        subprocess.run(cmd.split(), check=True)
    roce_class = TrafficClass("roce", 1, 1, (26,), 100000, pfc=PfcRule(48000, 24000))
    classes = (TrafficClass("cnp", 0, 0, (48,), 8000), roce_class,
               TrafficClass("other", 2, 2, (), 8000))
    shape = Shape(RATE_MBIT, classes, nic_queue_bytes=256000, qp_limiters=roce_class.minor)
    for cmd in tc_commands("nic0", shape, netem=False, mtu=4196):
        subprocess.run(cmd.split(), check=True)
    q = limiter_qdisc(RATE_MBIT, 4196)
    nl = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
    nl.bind((0, 0))
    limiters = ratelimit.Limiters(nl, socket.if_nametoindex("nic0"), roce_class.minor,
                                  q["open_bytes"], q["burst"], q["quantum"])
    tos = (26 << 2) | 0b10
    limiters.create([(0, PEER, 0x101), (1, PEER, 0x102)], tos)
    limiters.set_rate(0, RATE_MBIT * 1e6 / 4)
    me, peer = roce.Endpoint("02:00:00:00:00:01", ME), roce.Endpoint("02:00:00:00:00:02", PEER)

    def burst(qpn: int, tos: int, n: int = FRAMES) -> list:
        """``n`` frames handed over at once; their kernel transmit times."""
        tx = open_tx("nic0")
        sender, stamps = nicio.Sender(tx), nicio.Stamps(tx)
        tpl = roce.Connection(me, peer, 0xC001, qpn, tos=tos).template(
            roce.RC_RDMA_WRITE_MIDDLE, 4096)
        pending, log = {}, []
        for i in range(n):
            now = time.time_ns()
            assert sender.send(tpl, i, False, now, 0, i)
            pending[i] = (now, 4096, "d")
        deadline = time.time() + 5
        while pending and time.time() < deadline:
            stamps.join(pending, log)
            time.sleep(0.01)
        tx.close()
        return sorted(t for _s, t, _b, _k in log)

    out = {"limited": burst(0x101, tos), "open": burst(0x102, tos),
           "no_ect": burst(0x101, 26 << 2)}
    limiters.set_rate(0, RATE_MBIT * 1e6 / 2)
    out["halved"] = burst(0x101, tos)
    limiters.set_rate(0, 0)
    out["reopened"] = burst(0x101, tos)
    limiters.set_rate(7, RATE_MBIT * 1e6)  # no such class: the kernel answers with an error
    time.sleep(0.1)
    try:
        limiters.check()
        out["error"] = None
    except OSError as e:
        out["error"] = e.errno
    return out


@pytest.fixture(scope="module")
def seen():
    from .runs import in_private_netns  # not at the top: this file also runs as a script
    return in_private_netns(__file__)


def median_gap_ms(times) -> float:
    gaps = sorted(b - a for a, b in zip(times, times[1:]))
    return gaps[len(gaps) // 2] / 1e6


FRAME_MS = full_frame_bytes(4096) * 8 / (RATE_MBIT * 1e3)  # one full frame at the line rate


def test_a_limited_qp_leaves_at_its_rate(seen):
    assert len(seen["limited"]) == FRAMES
    assert median_gap_ms(seen["limited"]) == pytest.approx(4 * FRAME_MS, rel=0.03)


def test_other_qps_and_acks_leave_at_the_line_rate(seen):
    assert median_gap_ms(seen["open"]) == pytest.approx(FRAME_MS, rel=0.03)
    assert median_gap_ms(seen["no_ect"]) == pytest.approx(FRAME_MS, rel=0.03)


def test_the_limiter_follows_rate_changes(seen):
    assert median_gap_ms(seen["halved"]) == pytest.approx(2 * FRAME_MS, rel=0.03)
    assert median_gap_ms(seen["reopened"]) == pytest.approx(FRAME_MS, rel=0.03)


def test_a_failed_change_is_reported(seen):
    assert seen["error"] == 2  # ENOENT


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    print(json.dumps(inside()))

"""Strict priority on a GPU NIC without overlapping frames, in a throw-away network namespace:
the NIC shaped as a lossless run shapes it (CNP class above the RoCE class), a backlog of RoCE
data frames handed over at once, and CNPs handed over while it drains.

A real NIC sends a CNP next, but only once the frame on the wire has left: the CNP must not
wait behind the backlog, and must not leave while the previous frame would still be on the
wire (HTB lets a class guaranteed its own rate send without asking its parent: when the CNP
class was guaranteed the link, CNPs left up to a frame time early).
"""
import json
import os
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.integration

RATE_MBIT = 40
DATA, CNPS = 14, 5
ME, PEER = "10.0.0.1", "10.0.0.2"
MTU_FRAME = 4154  # bytes of a RoCE WRITE-middle frame of 4096 B: 58 B of headers and ICRC


def serialization_ns(size: int) -> float:
    return size * 8e3 / RATE_MBIT


def inside() -> dict:
    from controllers.classes import PfcRule, TrafficClass
    from testbed.fabric.shaping import Shape, tc_commands
    from traffic import nicio, roce
    from traffic.rxsocket import open_tx
    for cmd in ["ip link add nic0 type veth peer name far0", "ip link set nic0 mtu 9000",
                "ip link set far0 mtu 9000", "ip link set nic0 up", "ip link set far0 up"]:
        subprocess.run(cmd.split(), check=True)
    classes = (TrafficClass("cnp", 0, 0, (48,), 8000),
               TrafficClass("roce", 1, 1, (26,), 100000, pfc=PfcRule(48000, 24000)),
               TrafficClass("other", 2, 2, (), 8000))
    for cmd in tc_commands("nic0", Shape(RATE_MBIT, classes, nic_queue_bytes=256000),
                           netem=False, mtu=4196):
        subprocess.run(cmd.split(), check=True)
    me, peer = roce.Endpoint("02:00:00:00:00:01", ME), roce.Endpoint("02:00:00:00:00:02", PEER)
    tx = open_tx("nic0")
    sender, stamps = nicio.Sender(tx), nicio.Stamps(tx)
    data = roce.Connection(me, peer, 0xC001, 0x101, tos=(26 << 2) | 0b10).template(
        roce.RC_RDMA_WRITE_MIDDLE, 4096)
    cnp = roce.cnp_frame(me, peer, 0xC001, 0x101, 48 << 2)
    tx.send(cnp)  # a new class's first frame goes on the tokens HTB gives it: stamp key 0
    time.sleep(2 * serialization_ns(MTU_FRAME) / 1e9)
    pending, log, key = {}, [], 1
    for i in range(DATA):
        now = time.time_ns()
        assert sender.send(data, i, False, now, 0, i) == MTU_FRAME
        pending[key], key = (now, MTU_FRAME, "d"), key + 1
    for _ in range(CNPS):  # while the backlog drains, about 1.7 frames apart
        time.sleep(1.7 * serialization_ns(MTU_FRAME) / 1e9)
        now = time.time_ns()
        tx.send(cnp)
        pending[key], key = (now, len(cnp), "c"), key + 1
    deadline = time.time() + 5
    while pending and time.time() < deadline:
        stamps.join(pending, log)
        time.sleep(0.01)
    tx.close()
    return {"frames": sorted(log, key=lambda row: row[1])}


@pytest.fixture(scope="module")
def frames():
    from .runs import in_private_netns  # not at the top: this file also runs as a script
    return in_private_netns(__file__)["frames"]


def test_every_frame_left(frames):
    assert sorted(kind for *_, kind in frames) == ["c"] * CNPS + ["d"] * DATA


def test_a_cnp_leaves_next_but_not_before_the_frame_on_the_wire_has(frames):
    unit = serialization_ns(MTU_FRAME)
    for (_s0, tx0, size0, _k0), (sent, tx, _size, kind) in zip(frames, frames[1:]):
        if kind != "c":
            continue
        assert tx - tx0 >= serialization_ns(size0) - 0.1 * unit, frames  # not early
        overtaken = [row for row in frames if row[3] == "d" and sent < row[1] < tx]
        assert len(overtaken) <= 1, frames  # only the frame already on its way


def test_the_backlog_resumes_one_cnp_time_after_it(frames):
    unit = serialization_ns(MTU_FRAME)
    for (_s0, tx0, size0, kind0), (_s, tx, _size, kind) in zip(frames, frames[1:]):
        if kind0 == "c" and kind == "d":
            assert tx - tx0 >= serialization_ns(size0) - 0.1 * unit, frames


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    print(json.dumps(inside()))

"""The tc BPF marking program on a real veth (inside a throw-away network namespace).

The test re-runs this file under ``unshare --net``: the veth pair, the clsact qdisc and the
program vanish with that process. Frames are written raw on one end and read on the other.
"""
import json
import os
import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

ROCE_DSCP = 26


def frame(tos: int) -> bytes:
    from scapy.all import IP, UDP, Ether
    return bytes(Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
                 / IP(src="10.0.1.1", dst="10.0.2.1", tos=tos) / UDP(sport=49152, dport=4791)
                 / bytes(64))


def inside() -> dict:
    """Runs in the private namespace: send frames through the marking port, report what
    arrived (TOS, whether the IPv4 checksum is right)."""
    from scapy.all import IP, Ether
    from testbed.fabric.bpfmark import Marker
    subprocess.run("ip link add tbm0 type veth peer name tbm1 && ip link set tbm0 up && "
                   "ip link set tbm1 up", shell=True, check=True)
    rx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0800))
    rx.bind(("tbm1", 0))
    rx.settimeout(2)
    tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    tx.bind(("tbm0", 0))
    marker = Marker(["tbm0"], [ROCE_DSCP])
    marker.open()
    out = {}

    def send(label, tos):
        tx.send(frame(tos))
        while True:
            data = rx.recv(2048)
            pkt = Ether(data)
            if IP in pkt and pkt[IP].dst == "10.0.2.1":
                break
        got = pkt[IP]
        check = got.chksum
        del got.chksum
        out[label] = {"tos": got.tos, "checksum_ok": IP(bytes(got)).chksum == check}

    ect0, ect1 = ROCE_DSCP << 2 | 2, ROCE_DSCP << 2 | 1
    send("off_ect0", ect0)
    marker.set("tbm0", True)
    send("on_ect0", ect0)
    send("on_ect1", ect1)
    send("on_not_ect", ROCE_DSCP << 2)
    send("on_ce", ROCE_DSCP << 2 | 3)
    send("on_other_dscp", 10 << 2 | 2)
    marker.set("tbm0", False)
    send("off_again", ect0)
    marker.set("tbm0", True)
    marker.close()
    out["qdiscs_after_close"] = subprocess.run(["tc", "qdisc", "show", "dev", "tbm0"],
                                               capture_output=True, text=True).stdout
    send("after_close", ect0)
    return out


@pytest.fixture(scope="module")
def seen():
    from .runs import in_private_netns  # not at the top: this file also runs as a script
    return in_private_netns(__file__)


def test_marks_ect_packets_of_the_marking_classes_only(seen):
    ce = ROCE_DSCP << 2 | 3
    assert seen["off_ect0"]["tos"] == ROCE_DSCP << 2 | 2
    assert seen["on_ect0"]["tos"] == ce and seen["on_ect1"]["tos"] == ce
    assert seen["on_ce"]["tos"] == ce
    assert seen["on_not_ect"]["tos"] == ROCE_DSCP << 2  # never marks Not-ECT
    assert seen["on_other_dscp"]["tos"] == 10 << 2 | 2  # another class: not marking
    assert seen["off_again"]["tos"] == ROCE_DSCP << 2 | 2
    assert all(v["checksum_ok"] for k, v in seen.items() if isinstance(v, dict))


def test_close_removes_the_program(seen):
    assert "clsact" not in seen["qdiscs_after_close"]
    assert seen["after_close"]["tos"] == ROCE_DSCP << 2 | 2


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    print(json.dumps(inside()))

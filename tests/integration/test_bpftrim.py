"""The tc BPF trimming program on a real veth (inside a throw-away network namespace).

The test re-runs this file under ``unshare --net``. A counters map stands in for the queue
counters of ``testbed.fabric.bpfqueue`` (bytes in and out of the class's queue); UET frames
built by the project's Scapy layer are written raw on one end and read on the other.
"""
import json
import os
import socket
import struct
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

DATA_DSCP, HEADER_DSCP, LIMIT = 26, 46, 10_000


def frame(payload: int, dscp: int = DATA_DSCP, psn: int = 7, dport_uet: bool = True) -> bytes:
    from scapy.all import UDP
    from traffic import uet
    pkt = uet.rud_write("02:00:00:00:00:01", "02:00:00:00:00:02", "10.0.1.1", "10.0.2.1",
                        entropy=0xC005, psn=psn, spdcid=3, dpdcid=4, message_id=9,
                        offset=4096, length=3 * 4096, payload=bytes(range(256)) * (payload // 256)
                        + bytes(payload % 256), tos=dscp << 2 | 2)
    if not dport_uet:
        pkt[UDP].dport = 4791
    return bytes(pkt)


def inside() -> dict:
    """Runs in the private namespace: frames through the trimming port at a given backlog;
    report each as it arrived (hex) and the trim counter."""
    from testbed.fabric import bpf
    from testbed.fabric.bpftrim import Trimmer
    subprocess.run("ip link add tbt0 mtu 9000 type veth peer name tbt1 mtu 9000 && "
                   "ip link set tbt0 up && ip link set tbt1 up", shell=True, check=True)
    rx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0800))
    rx.bind(("tbt1", 0))
    rx.settimeout(2)
    tx = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    tx.bind(("tbt0", 0))
    counters = bpf.create_map(bpf.BPF_MAP_TYPE_ARRAY, 4, 8, 2)
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
    sock.bind((0, 0))
    clsact = bpf.Clsact(sock)
    trimmer = Trimmer(["tbt0"], {"tbt0": LIMIT}, {"tbt0": (0, 1)}, counters, [DATA_DSCP],
                      HEADER_DSCP, clsact)
    trimmer.open()
    out = {"sent": {}, "got": {}}

    def send(label, backlog, data):
        bpf.update(counters, struct.pack("=I", 0), struct.pack("=Q", 50_000 + backlog))
        bpf.update(counters, struct.pack("=I", 1), struct.pack("=Q", 50_000))
        tx.send(data)
        while True:
            got = rx.recv(9000)
            if got[30:34] == bytes([10, 0, 2, 1]):
                break
        out["sent"][label], out["got"][label] = data.hex(), got.hex()

    send("fits", 5_000, frame(2000))  # 5,000 + 2,098 <= 10,000
    send("overflows", 9_000, frame(2000))
    send("overflows_again", 9_000, frame(3000, psn=8))
    send("other_class", 9_000, frame(2000, dscp=10))
    send("roce_port", 9_000, frame(2000, dport_uet=False))
    send("tiny", 9_950, frame(0))  # nothing to cut from a header-only packet
    out["trims"] = trimmer.trims()["tbt0"]
    trimmer.close()
    clsact.close()
    out["qdiscs_after_close"] = subprocess.run(["tc", "qdisc", "show", "dev", "tbt0"],
                                               capture_output=True, text=True).stdout
    send("after_close", 9_000, frame(2000))
    return out


@pytest.fixture(scope="module")
def seen():
    from .runs import in_private_netns  # not at the top: this file also runs as a script
    return in_private_netns(__file__)


def _ip_ok(pkt) -> bool:
    from scapy.all import IP
    check = pkt[IP].chksum
    copy = IP(bytes(pkt[IP]))
    del copy.chksum
    return IP(bytes(copy)).chksum == check


def test_a_packet_that_would_overflow_its_queue_is_cut_to_its_headers(seen):
    from scapy.all import IP, UDP, Ether, Raw
    from traffic import uet
    sent, got = (Ether(bytes.fromhex(seen[k]["overflows"])) for k in ("sent", "got"))
    assert len(bytes(got)) == 98 == len(bytes(sent)) - 2000
    assert got[IP].len == 84 and got[UDP].len == 64 and _ip_ok(got)
    assert got[IP].tos == HEADER_DSCP << 2 | 2  # the header class, ECN bits kept
    assert got[UDP].chksum == 0 and Raw not in got[uet.PDS]
    # the PDS and SES headers, which say what was lost, are the sent ones
    for layer in (uet.PDS, uet.PDSRequest, uet.SESRequest):
        assert bytes(got[layer])[:len(layer())] == bytes(sent[layer])[:len(layer())]
    # the project's model of a trimmed packet has the same bytes, bar the DSCP
    model = Ether(uet.trimmed(bytes(sent)))
    model[IP].tos = got[IP].tos
    del model[IP].chksum
    assert bytes(Ether(bytes(model))) == bytes(got)
    assert Ether(bytes.fromhex(seen["got"]["overflows_again"]))[uet.PDSRequest].psn == 8
    assert seen["trims"] == 2


def test_what_fits_another_class_roce_and_bare_headers_pass_unchanged(seen):
    for label in ("fits", "other_class", "roce_port", "tiny", "after_close"):
        assert seen["got"][label] == seen["sent"][label], label
    assert "clsact" not in seen["qdiscs_after_close"]


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    print(json.dumps(inside()))

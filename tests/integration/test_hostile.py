"""Malformed and hostile frames injected into a running fabric (Scapy, from a GPU host's
namespace) while the collective runs: the agents count and drop them, the controller handles
the packet-ins they cause, nothing crashes or stalls, and every byte of the collective
arrives."""
import glob
import json
import os
import subprocess
import sys

import pytest

from testbed.plan.checks import check_scenario
from testbed.run import runner
from testbed.run.agent_processes import AgentGroup, finish_timeout_s
from traffic.rnic import qp_number

from .live import DEFAULT, fabric_session
from .test_transport import delivered_bytes, expected_bytes

pytestmark = pytest.mark.integration

SCENARIO = DEFAULT.override({"workload": {"iterations": 4, "size_bytes": 512 * 1024}})
ROUNDS = 5
CNP_FLOOD = 200

INJECT = r"""
import json, os, random, sys, time
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw
from scapy.sendrecv import sendp
from traffic import roce

c = json.loads(sys.argv[1])
me, victim, peer = (roce.Endpoint(c[k]["mac"], c[k]["ip"]) for k in ("me", "victim", "peer"))
spoofed = roce.Endpoint(me.mac, peer.ip)  # the victim's real peer's IP, our own MAC
qpn, rng = c["qpn"], random.Random(1)

def write(src, psn, tx_ns, opcode=roce.RC_RDMA_WRITE_ONLY, dqpn=qpn):
    payload = bytearray(256)
    roce.PROBE.pack_into(payload, 0, tx_ns, 0, 0)
    return roce.scapy_packet(src, victim, 0xC0DE, opcode, dqpn, psn, bytes(payload), True)

def bad_icrc(pkt):
    raw = bytearray(bytes(pkt))
    raw[-1] ^= 0xFF
    return Ether(bytes(raw))

udp = Ether(src=me.mac, dst=victim.mac) / IP(src=me.ip, dst=victim.ip) / UDP(
    sport=0xC0DE, dport=roce.ROCE_UDP_PORT)
kinds = {
    "truncated_bth": [udp / Raw(b"\x0a\x00\x00")],
    "garbage": [udp / Raw(bytes(rng.getrandbits(8) for _ in range(200)))],
    "bad_icrc": [bad_icrc(write(spoofed, 0x100000, time.time_ns()))],
    "unknown_opcode": [write(spoofed, 5, time.time_ns(), opcode=0x1C)],
    "wrong_qp": [write(me, 5, time.time_ns(), dqpn=0xABCDE)],
    "forged_probe": [write(spoofed, 6, 0)],
    "psn_out_of_window": [write(spoofed, 0x700000, time.time_ns()),
                          write(spoofed, 0xC00000, time.time_ns())],
    "cnp_flood": [roce.cnp_packet(me, victim, 0xC0DE, qpn, 0x6A)] * c["flood"],
    "spoofed_cnps": [roce.cnp_packet(spoofed, victim, 0xC0DE, qpn, 0x6A)] * 10,
    "packet_ins": [
        Ether(src=me.mac, dst="ff:ff:ff:ff:ff:ff", type=0x88B6) / Raw(b"x" * 60),
        Ether(src=me.mac, dst="01:80:c2:00:00:0e", type=0x88CC) / Raw(b"\x02\x07" * 20),
        Ether(src=me.mac, dst="ff:ff:ff:ff:ff:ff") / ARP(psrc=me.ip, pdst="10.0.99.99"),
        Ether(src=me.mac, dst="33:33:00:00:00:01") / IPv6(dst="ff02::1") / UDP(dport=9),
        Ether(src=me.mac, dst=victim.mac) / IP(src=me.ip, dst="10.9.9.9") / UDP(dport=9),
        Ether(src=me.mac, dst="02:de:ad:be:ef:01") / IP(src=me.ip, dst=victim.ip) / UDP(),
        Ether(src=me.mac, dst=victim.mac, type=0x0800) / Raw(b"\x45\x00\x00"),
    ],
}
for _ in range(c["rounds"]):
    for frames in kinds.values():
        sendp(frames, iface=c["intf"], verbose=False)
    time.sleep(0.1)
print(json.dumps({k: len(v) * c["rounds"] for k, v in kinds.items()}))
"""


def _summary(records, host):
    with open(os.path.join(records, f"{host}.summary.json")) as f:
        return json.load(f)["counters"]


def packets_to_controller(plan):
    """Packets the switches sent to the controller (flows whose actions output to it)."""
    total = 0
    for sw in plan.switches:
        out = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "dump-flows", sw.name],
                             capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if "CONTROLLER" in line and "n_packets=" in line:
                total += int(line.split("n_packets=")[1].split(",")[0])
    return total


def _tracebacks(run_dir):
    bad = []
    for log in glob.glob(os.path.join(run_dir, "*.log")):
        with open(log, errors="replace") as f:
            if "Traceback" in f.read():
                bad.append(os.path.basename(log))
    return bad


@pytest.mark.parametrize("name", ["enterprise", "hyperscale", "lossless"])
def test_hostile_frames_are_counted_and_dropped_and_nothing_stalls(tmp_path, name):
    scenario = SCENARIO.with_policies([name])
    plan = check_scenario(scenario)
    records = str(tmp_path / "records")
    attacker, victim, peer = plan.host("gpu5"), plan.host("gpu2"), plan.host("gpu1")
    config = {"me": {"mac": attacker.mac, "ip": attacker.ip},
              "victim": {"mac": victim.mac, "ip": victim.ip},
              "peer": {"mac": peer.mac, "ip": peer.ip},
              "qpn": qp_number(victim.rank, peer.rank), "intf": attacker.intf,
              "rounds": ROUNDS, "flood": CNP_FLOOD}
    with fabric_session(scenario, name, tmp_path) as (run, s, ledger), \
            runner.queue_emulation(run, s, str(tmp_path), ledger):
        agents = AgentGroup(s.fabric, run, records, str(tmp_path), ledger, name)
        try:
            agents.start()
            agents.go()
            inject = s.fabric.host("gpu5").popen(
                [sys.executable, "-c", INJECT, json.dumps(config)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            ledger.add_pid(inject.pid)
            out, err = inject.communicate(timeout=120)
            assert inject.returncode == 0, err.decode()[-2000:]
            sent = json.loads(out)
            agents.wait(timeout=finish_timeout_s(run), alive=s.controller.check_alive)
        finally:
            agents.stop()
        s.controller.check_alive()  # handled every packet-in and is still there
        to_controller = packets_to_controller(plan)

    got = _summary(records, "gpu2")
    invalid = (sent["truncated_bth"] + sent["unknown_opcode"] + sent["forged_probe"]
               + sent["cnp_flood"])
    # counted, and dropped: a lossy fabric may lose some of the flood on the way
    assert got.get("rx_bad_icrc", 0) >= 1, got
    assert got.get("rx_foreign_qp", 0) >= 1, got
    assert got.get("rx_invalid", 0) >= invalid // 2, (got, sent)
    # every byte of every transfer still arrived, in order, at every GPU
    assert delivered_bytes(str(tmp_path), "") == expected_bytes(scenario)
    assert _tracebacks(str(tmp_path)) == []
    if run.policy.wants_packet_in:  # the learning switch: the stray frames reached it
        assert to_controller > 0

"""Capture the agents' real traffic on a GPU's NIC (``measurement.pcap``) and check it with
tshark and the ICRC."""
import os
import shutil
import subprocess

import pytest
from scapy.layers.inet import IP, UDP
from scapy.utils import rdpcap

from testbed.api import run_scenario
from tests.unit.test_tshark import tshark_fields
from traffic import roce
from traffic.rnic import qp_number
from traffic.collectives import build
from .live import DEFAULT

pytestmark = pytest.mark.integration

SCENARIO = DEFAULT.override({"topology": {"spines": 2, "leaves": 2, "gpus_per_leaf": 1},
                             "workload": {"iterations": 1, "size_bytes": 64 * 1024}})


NEEDS_TOOLS = pytest.mark.skipif(not shutil.which("tcpdump") or not shutil.which("tshark"),
                                 reason="needs tcpdump and tshark (scripts/install.sh)")


def capture_a_run(tmp_path, scenario, host, policy="hyperscale"):
    """Run the scenario with ``measurement.pcap`` on the NIC of ``host``; returns the pcap
    path the run reports (and the policy's result)."""
    result = run_scenario(scenario, [policy], out_root=str(tmp_path),
                          measurement={"pcap": True, "pcap_hosts": [host],
                                       "pcap_snaplen": 65535})
    assert result.status == "complete"
    pcaps = result.policy(policy).pcap
    assert set(pcaps) == {host} and pcaps[host]["bytes"] > 0
    return os.path.join(result.run_dir, pcaps[host]["file"]), result.policy(policy)


@NEEDS_TOOLS
def test_captured_agent_traffic_is_valid_rocev2(tmp_path):
    pcap, _ = capture_a_run(tmp_path, SCENARIO, "gpu2")
    received = [p for p in rdpcap(pcap) if p[IP].dst == "10.0.2.1"]
    assert received and all(p[UDP].dport == 4791 for p in received)
    frames = [bytes(p) for p in received]
    assert all(roce.icrc_ok(f) for f in frames)  # data and the ACKs for gpu2's own sends
    data = [f for f in frames if f[roce.BTH_OFFSET] != roce.RC_ACKNOWLEDGE]
    n_packets = 2 * len(roce.packet_payloads(SCENARIO.workload.size_bytes // 2,
                                             SCENARIO.workload.mtu))
    assert len(data) == n_packets
    rows = [r for r in tshark_fields(pcap, "ip.dst==10.0.2.1")
            if r["infiniband.bth.opcode"] != "17"]
    # BTH carries the destination QP: gpu2's (rank 1) QP for its connection from rank 0
    assert {int(r["infiniband.bth.destqp"], 16) for r in rows} == {qp_number(1, 0)}
    psns = [int(r["infiniband.bth.psn"]) for r in rows]
    assert psns == list(range(psns[0], psns[0] + len(psns)))
    opcodes = [int(r["infiniband.bth.opcode"]) for r in rows]
    # one RDMA WRITE (FIRST..LAST) per transfer of the schedule from rank 0 to rank 1, its
    # length in the RETH
    w = SCENARIO.workload
    mine = [t for t in build(w.collective, 2, w.size_bytes, w.chunks).transfers if t.dst == 1]
    assert opcodes.count(6) == opcodes.count(8) == len(mine) == 2 * w.chunks
    firsts = [r for r in rows if r["infiniband.bth.opcode"] == "6"]
    assert sorted(int(r["infiniband.reth.dmalen"]) for r in firsts) == sorted(
        t.nbytes for t in mine)
    assert os.path.getsize(pcap) > 0


LOSSY = DEFAULT.override({
    "topology": {"host_rate_mbit": 40, "fabric_rate_mbit": 20},
    "workload": {"iterations": 1},
    "transport": {"congestion_control": "dcqcn"},
    "policy_params": {"hyperscale": {"ecn": "step", "buffer_bytes": 48000}}})


@NEEDS_TOOLS
def test_tshark_dissects_the_acks_naks_and_cnps_of_a_lossy_run(tmp_path):
    pcap, _ = capture_a_run(tmp_path, LOSSY, "gpu3")
    frames = [bytes(p) for p in rdpcap(pcap)]
    assert frames and all(roce.icrc_ok(f) for f in frames)
    out = subprocess.run(["tshark", "-r", str(pcap), "-T", "fields", "-E", "separator=|",
                          "-e", "infiniband.bth.opcode", "-e", "infiniband.aeth.syndrome",
                          "-e", "infiniband.bth.psn"],
                         capture_output=True, text=True, check=True).stdout
    rows = [line.split("|") for line in out.strip().splitlines()]
    opcodes = {int(r[0]) for r in rows}
    syndromes = {int(r[1], 0) for r in rows if r[0] == "17" and r[1]}  # tshark: decimal
    assert 17 in opcodes, "no ACKNOWLEDGE dissected"
    assert 0x1F in syndromes, "no ACK (syndrome 0x1f)"
    assert 0x60 in syndromes, "no NAK (PSN sequence error, syndrome 0x60)"
    assert 129 in opcodes, "no CNP (opcode 0x81)"
    assert {6, 7, 8} <= opcodes  # and the data: WRITE FIRST, MIDDLE, LAST


@NEEDS_TOOLS
def test_lossless_senders_start_a_flowlet_with_a_new_source_port_after_idling(tmp_path):
    """Between iterations each QP idles far longer than the flowlet gap (16 us modelled):
    its next frame starts a new flowlet on a new UDP source port (valid ICRC: the port is in
    its invariant part), the QP's PSNs run on, and the results count the flowlets."""
    idle = SCENARIO.override({"workload": {"iterations": 3, "compute_us": 100}})
    pcap, p = capture_a_run(tmp_path, idle, "gpu2", policy="lossless")
    data = [q for q in rdpcap(pcap) if q[IP].dst == "10.0.2.1"
            and bytes(q)[roce.BTH_OFFSET] != roce.RC_ACKNOWLEDGE]
    assert data and all(roce.icrc_ok(bytes(q)) for q in data)
    ports = [q[UDP].sport for q in data]
    assert len(set(ports)) >= 3, ports  # a flowlet per iteration at least
    assert all(0xC000 <= port <= 0xFFFF for port in ports)
    rows = [r for r in tshark_fields(pcap, "ip.dst==10.0.2.1")
            if r["infiniband.bth.opcode"] != "17"]
    psns = sorted(int(r["infiniband.bth.psn"]) for r in rows)
    assert psns == list(range(psns[0], psns[0] + len(psns)))  # each PSN once, none resent
    assert p.new_flowlets >= len(set(ports)) - 1 and p.naks == 0

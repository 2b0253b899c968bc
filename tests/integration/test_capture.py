"""Capture the agents' real traffic on a GPU's NIC and check it with tshark and the ICRC."""
import os
import shutil
import signal
import subprocess
import time

import pytest
from scapy.utils import rdpcap

from controllers.policy import make_policy
from testbed import runner
from testbed.agents import AgentGroup
from testbed.capabilities import detect
from testbed.config import DEFAULT
from testbed.ledger import Ledger
from tests.unit.test_tshark import tshark_fields
from traffic import roce
from traffic.agent import qp_number

pytestmark = pytest.mark.integration

SCENARIO = DEFAULT.override({"topology": {"spines": 2, "leaves": 2, "gpus_per_leaf": 1},
                             "workload": {"iterations": 1, "size_bytes": 64 * 1024}})


@pytest.mark.skipif(not shutil.which("tcpdump") or not shutil.which("tshark"),
                    reason="needs tcpdump and tshark (scripts/install.sh)")
def test_captured_agent_traffic_is_valid_rocev2(tmp_path):
    plan = runner.validate(SCENARIO)
    policy = make_policy("hyperscale", plan, SCENARIO)
    ledger = Ledger(runner.new_run_id())
    ledger.acquire(str(tmp_path))
    pcap = tmp_path / "gpu2.pcap"
    try:
        with runner.fabric_up(policy, SCENARIO, detect(), str(tmp_path), ledger) as s:
            gpu2 = s.fabric.host("gpu2")
            dump = gpu2.popen(["tcpdump", "-i", "gpu2-eth0", "-U", "--immediate-mode", "-n",
                               "-w", str(pcap),
                               "udp", "dst", "port", "4791", "and", "dst", "host",
                               plan.host("gpu2").ip],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            ledger.add_pid(dump.pid)
            try:
                deadline = time.monotonic() + 10
                while not (pcap.exists() and pcap.stat().st_size > 0):
                    assert time.monotonic() < deadline, "tcpdump did not start"
                    time.sleep(0.05)
                agents = AgentGroup(s.fabric, plan, SCENARIO, str(tmp_path / "rec"),
                                    str(tmp_path), ledger, "capture")
                try:
                    agents.start()
                    agents.go()
                    agents.wait(timeout=60)
                finally:
                    agents.stop()
            finally:
                dump.send_signal(signal.SIGINT)
                dump.communicate(timeout=10)
    finally:
        ledger.teardown()
        ledger.close()

    frames = [bytes(p) for p in rdpcap(str(pcap))]
    n_packets = 2 * len(roce.packet_payloads(SCENARIO.workload.size_bytes // 2,
                                             SCENARIO.workload.mtu))
    assert len(frames) == n_packets
    assert all(roce.icrc_ok(f) for f in frames)
    rows = tshark_fields(pcap)
    # BTH carries the destination QP: gpu2's (rank 1) QP for its connection from rank 0
    assert {int(r["infiniband.bth.destqp"], 16) for r in rows} == {qp_number(1, 0)}
    psns = [int(r["infiniband.bth.psn"]) for r in rows]
    assert psns == list(range(psns[0], psns[0] + len(psns)))
    opcodes = [int(r["infiniband.bth.opcode"]) for r in rows]
    assert opcodes.count(6) == opcodes.count(8) == 2  # one message per step: FIRST..LAST
    firsts = [r for r in rows if r["infiniband.bth.opcode"] == "6"]
    assert all(int(r["infiniband.reth.dmalen"]) == SCENARIO.workload.size_bytes // 2
               for r in firsts)
    assert os.path.getsize(pcap) > 0

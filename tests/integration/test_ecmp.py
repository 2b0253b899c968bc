"""The hyperscale policy on a live fabric: select groups installed, flows hashed over spines."""
import subprocess
import sys
import time

import pytest

from testbed.fabric.queues import egress_stats, spine_load

from .live import DEFAULT, fabric_session

pytestmark = pytest.mark.integration

SCENARIO = DEFAULT.override({"topology": {"spines": 2, "leaves": 2, "gpus_per_leaf": 1}})

# Sends `count` UDP datagrams to dst:4791 from each of `flows` source ports (one 5-tuple each).
SENDER = """
import socket, sys
dst, flows, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for i in range(flows):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("", 0xC000 + 17 * i))
    for _ in range(count):
        s.sendto(b"x" * 200, (dst, 4791))
    s.close()
"""


@pytest.fixture
def session(tmp_path):
    with fabric_session(SCENARIO, "hyperscale", tmp_path) as (run, s, _ledger):
        yield run.plan, s


def test_ovs_holds_the_5_tuple_hash_and_the_slots(session):
    """What OVS made of the hyperscale program: a multipath over the UDP-aware symmetric
    hash, one slot per spine, and no marking groups (no ECN class in the default policy)."""
    _plan, s = session
    flows = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "dump-flows", "lf1"],
                           capture_output=True, text=True, check=True).stdout
    assert "nw_dst=10.0.2.0/24" in flows
    assert "multipath(symmetric_l3l4+udp,0,modulo_n,2,0,NXM_NX_REG1[0..15])" in flows
    assert "table=3" in flows and "reg1=0x1" in flows
    groups = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "dump-groups", "lf1"],
                            capture_output=True, text=True, check=True).stdout
    assert "type=indirect" not in groups and "nw_ecn" not in flows


def test_a_udp_flood_is_spread_by_source_port(session):
    plan, s = session
    before = spine_load(plan, egress_stats(s.fabric))
    src = s.fabric.host("gpu1")
    sender = src.popen([sys.executable, "-c", SENDER, plan.host("gpu2").ip, "16", "20"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _out, err = sender.communicate(timeout=60)
    assert sender.returncode == 0, err
    # the sender returns while its NIC queue still drains (320 frames, ~15 ms at 40 Mbit/s;
    # longer on a busy machine): read until the spines have carried them, at most 5 s
    deadline = time.monotonic() + 5
    while True:
        after = spine_load(plan, egress_stats(s.fabric))
        carried = {spine: after[spine] - before[spine] for spine in after}
        if sum(carried.values()) >= 16 * 20 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert all(n >= 16 * 20 // 8 for n in carried.values()), carried
    assert sum(carried.values()) >= 16 * 20 * 0.95


def test_open_vswitch_reports_each_switch_connected(session):
    """What a run quotes when a switch was never programmed: here every switch is."""
    plan, s = session
    deadline = time.monotonic() + 15  # OVS writes the state to its database every few s
    while True:
        said = s.fabric.controller_links([sw.name for sw in plan.switches])
        if said.count("connected=true") == len(plan.switches) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert said.count("connected=true") == len(plan.switches), said
    assert "state=ACTIVE" in said
    assert s.fabric.controller_links([]) == ""

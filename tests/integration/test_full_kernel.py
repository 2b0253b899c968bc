"""What the full kernel adds, on real fabrics: RED marks ECN in the switch queues themselves.

Runs where the kernel has RED (the Vagrant VM; the VM test in tests/vm boots such a kernel in
CI and fails when a test here skips). Skipped elsewhere, with the reason.
"""
import pytest

from testbed.api import run_scenario
from testbed.capabilities import detect

pytestmark = [pytest.mark.integration, pytest.mark.full_kernel]

CAPS = detect()

# A congested lossless fabric: 2 GPUs per leaf at 10 Mbit/s share one 5 Mbit/s uplink (4:1)
# in an all-to-all, so the uplink queues cross the ECN thresholds every iteration.
CONGESTED = {
    "name": "ecn-compare",
    "policies": ["lossless"],
    "topology": {"spines": 1, "leaves": 2, "gpus_per_leaf": 2, "host_rate_mbit": 10,
                 "fabric_rate_mbit": 5},
    "workload": {"collective": "all_to_all", "size_bytes": 262144, "iterations": 2},
}


def marking_ports(p):
    """Switch ports that marked: RED's CE counts, or the emulator's marking time."""
    if p.ecn_marking == "red":
        return {port: n for port, n in (p.raw["red_marked_by_port"] or {}).items() if n}
    return {port: v["marking_ms"] for port, v in p.raw["switch_queues"]["ecn"].items()
            if v["marking_ms"] > 0}


@pytest.mark.skipif(not CAPS.red, reason="the kernel has no RED qdisc with nodrop (sch_red)")
def test_red_and_sampled_marking_agree_in_direction(tmp_path):
    runs = {mode: run_scenario(dict(CONGESTED, emulation={"ecn_marking": mode}),
                               out_root=str(tmp_path)).policy("lossless")
            for mode in ("red", "sampled")}
    for mode, p in runs.items():
        print(mode, p.ecn_marked_packets, p.cnps_sent, p.pfc_pause_events,
              marking_ports(p), p.cct_us.p50)
    red, sampled = runs["red"], runs["sampled"]
    assert red.ecn_marking == "red" and sampled.ecn_marking == "sampled"
    for p in (red, sampled):
        assert p.packets_received == p.packets_sent > 0 and p.switch_queue_drops == 0
        assert p.ecn_marked_packets > 0 and p.cnps_sent > 0  # marked, and the senders heard
    # the same queues marked most: the hottest port of each marked under the other too
    red_ports, sampled_ports = marking_ports(red), marking_ports(sampled)
    assert max(red_ports, key=red_ports.get) in sampled_ports
    assert max(sampled_ports, key=sampled_ports.get) in red_ports

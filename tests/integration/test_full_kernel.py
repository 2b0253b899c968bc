"""What the full kernel adds, on real fabrics: RED marks ECN in the switch queues themselves;
rdma_rxe's changes to the root namespace are undone whatever stops the run.

Runs where the kernel has RED (the Vagrant VM; the VM test in tests/vm boots such a kernel in
CI and fails when a test here skips). Skipped elsewhere, with the reason.
"""
import signal
import subprocess
import sys
import time

import pytest

from testbed.api import run_scenario
from testbed.fabric.capabilities import detect

from .leftovers import root_routing, wait_clean
from .runs import wait_for_line

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
        return {port: n for port, n in (p.red_marked_by_port or {}).items() if n}
    return {port: v["marking_ms"] for port, v in p.switch_queues.ecn.items()
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
    assert red.ecn_marking_via is None
    assert sampled.ecn_marking_via == ("bpf" if CAPS.bpf_marking else "openflow")
    for p in (red, sampled):
        # every byte of the all-to-all delivered (drops here would be the emulator's: a
        # sampler late on a saturated CPU; go-back-N repairs them)
        sent = p.collective().bytes_sent_per_rank
        assert sent.measured == sent.expected
        assert p.ecn_marked_packets > 0 and p.cnps_sent > 0  # marked, and the senders heard
    # the same queues marked most: the hottest port of each marked under the other too
    red_ports, sampled_ports = marking_ports(red), marking_ports(sampled)
    assert max(red_ports, key=red_ports.get) in sampled_ports
    assert max(sampled_ports, key=sampled_ports.get) in red_ports


@pytest.mark.skipif(not CAPS.rxe, reason="needs the rdma_rxe module and perftest "
                                         "(scripts/install.sh; the Vagrant VM has both)")
@pytest.mark.parametrize("how", ["ctrl-c", "kill-9"])
def test_rxe_changes_are_undone_after_ctrl_c_and_after_kill_9(tmp_path, how):
    """The root namespace's routing is back as it was: by the run on Ctrl-C, by `testbed
    clean` after kill -9."""
    scenario = tmp_path / "rxe.yaml"
    scenario.write_text(
        "policies: [lossless]\n"
        "topology: {spines: 1, leaves: 2, gpus_per_leaf: 1, host_rate_mbit: 10, "
        "fabric_rate_mbit: 10}\n"
        "workload: {size_bytes: 16384, iterations: 1}\n"
        "rxe: {lat_iterations: 1000000, timeout_s: 600}\n")  # still running when stopped
    proc = subprocess.Popen([sys.executable, "-m", "testbed", "run", "--scenario",
                             str(scenario), "--traffic", "rxe", "--out", str(tmp_path / "out")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_line(proc, "rxe: ib_write_lat", timeout=300)
    time.sleep(2)
    in_place = root_routing()
    assert any("lookup 4791" in x for x in in_place) and any("rxe-" in x for x in in_place)
    if how == "ctrl-c":
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=120)
        assert proc.returncode == 130 and "Traceback" not in err, err[-2000:]
    else:
        proc.kill()
        proc.communicate(timeout=30)
        clean = subprocess.run([sys.executable, "-m", "testbed", "clean"], capture_output=True,
                               text=True, timeout=120)
        assert clean.returncode == 0, clean.stderr
        assert "undone: ip rule show pref 0" in clean.stdout, clean.stdout
    assert wait_clean(timeout=30) == []

"""The leaf-spine fabric split over two servers (one emulated) under the os-ken controller:
each remote server reaches the controller through an ssh reverse tunnel to its loopback, the
switches are programmed, every GPU reaches its neighbour across the split."""
import glob
import os

import pytest

from testbed.plan.checks import check_scenario
from testbed.run import runner
from testbed.plan.placement import cross_links
from testbed.plan.policyrun import cluster_placement

from ..integration.live import DEFAULT, fabric_session
from ..integration.leftovers import wait_clean
from .conftest import NEEDS_SSHD

pytestmark = [pytest.mark.integration, NEEDS_SSHD]



@pytest.mark.parametrize("policy_name", ["hyperscale"])
def test_the_fabric_splits_over_two_servers_and_forwards(tmp_path, server, policy_name):
    scenario = DEFAULT.override({"policies": [policy_name],
                                 "cluster": {"servers": ["localhost", server.address]}})
    plan = check_scenario(scenario)
    where = cluster_placement(scenario, plan)
    assert where["lf1"] == "localhost" and where["lf4"] == server.address
    assert len(cross_links(plan, where)) == 4
    messages = []
    with fabric_session(scenario, policy_name, tmp_path, messages.append) as (_p, s, _l):
        remote = [sw for sw in s.fabric.net.switches
                  if getattr(sw, "server", "localhost") != "localhost"]
        assert sorted(sw.name for sw in remote) == ["lf3", "lf4"]
        # the remote switches' controller is their own loopback (the reverse tunnel)
        r = server.ssh("ovs-vsctl get-controller lf3")
        assert r.stdout.strip() == f"tcp:127.0.0.1:{s.controller.port}", r
        # a GPU on this server reaches one on the other
        out = s.fabric.host("gpu1").cmd("ping -n -c 3 -W 2 10.0.4.1")
        assert " 0% packet loss" in out, out
    assert any("switches programmed" in m for m in messages)
    assert wait_clean() == []
    assert server.ssh("ovs-vsctl list-br").stdout.strip() == ""  # the other server is clean


def test_agents_on_both_servers_complete_a_ring_across_the_split(tmp_path, server):
    from testbed.run.agent_processes import AgentGroup, finish_timeout_s

    from ..integration.test_transport import delivered_bytes, expected_bytes

    scenario = DEFAULT.override({"policies": ["hyperscale"],
                                 "workload": {"iterations": 2, "size_bytes": 256 * 1024},
                                 "cluster": {"servers": ["localhost", server.address]}})
    with fabric_session(scenario, "hyperscale", tmp_path) as (run, s, ledger):
        agents = AgentGroup(s.fabric, run, str(tmp_path / "records"), str(tmp_path), ledger,
                            "cluster")
        try:
            agents.start()
            agents.go()
            agents.wait(timeout=finish_timeout_s(run))
        finally:
            agents.stop()
    assert delivered_bytes(str(tmp_path), "") == expected_bytes(scenario)
    # the remote agents' records came back; their workspace on the server is gone
    records = sorted(os.listdir(tmp_path / "records"))
    assert all(f"gpu{i}.packets.csv" in records for i in range(1, 9))
    assert glob.glob("/var/tmp/ai-fabric-testbed-*") == []
    assert wait_clean() == []


@pytest.mark.parametrize("link", ["vxlan", "ssh"])
def test_a_run_across_two_servers_reports_the_split_and_both_emulators(tmp_path, server, link):
    """A whole run (hyperscale and enterprise) on a small fabric split over two servers: every
    GPU reports, the queue emulators of both servers report, the split is in the results."""
    scenario = DEFAULT.override({
        "policies": ["enterprise", "hyperscale"],
        "topology": {"leaves": 2, "gpus_per_leaf": 2, "host_rate_mbit": 20,
                     "fabric_rate_mbit": 20},
        "workload": {"iterations": 2, "size_bytes": 256 * 1024},
        "cluster": {"servers": ["localhost", server.address], "link": link}})
    result = runner.run(scenario, out_root=str(tmp_path))
    assert result.status == "complete"
    split = result.cluster
    assert split["servers"] == ["localhost", server.address]
    assert split["link"].lower().startswith(link)
    assert split["placement"][server.address] == ["lf2", "gpu3", "gpu4"]
    assert sorted(split["cross_links"]) == ["lf2-eth3-sp1-eth2", "lf2-eth4-sp2-eth2"]
    clock = split["clock_offsets"][server.address]
    assert abs(clock["offset_us"]) <= clock["uncertainty_us"] + 50  # one machine: one clock
    for name in ("enterprise", "hyperscale"):
        p = result.policy(name).emulated
        assert p.agents_reporting == 4
        assert p.packets_received + p.drops == p.packets_sent
        assert p.unexplained_drops == 0
        assert p.switch_queues.servers == 2  # both emulators reported
        paths = p.latency_us_by_path  # same-server and cross-server latency apart
        assert paths["same_server"].count + paths["cross_server"].count == p.latency_us.count
        assert paths["cross_server"].count > 0 and paths["same_server"].count > 0
        assert os.path.exists(os.path.join(result.run_dir,
                                           f"switchq-{name}@{server.address}.json"))
    assert wait_clean() == []
    assert glob.glob("/var/tmp/ai-fabric-testbed-*") == []


def test_lossless_pauses_across_servers_and_loses_nothing(tmp_path, server):
    """PFC across the split: a leaf on the other server pauses the spine queues here that
    feed it and the reverse, relayed between the two queue emulators."""
    scenario = DEFAULT.override({
        "policies": ["lossless"],
        "topology": {"leaves": 2, "gpus_per_leaf": 2, "host_rate_mbit": 20,
                     "fabric_rate_mbit": 10},
        # a tree all-reduce: a parent takes both children's halves at once, one of them
        # through a spine, so a leaf downlink on one server pauses spine queues on the other
        # (an all-to-all's senders share their NICs among all peers: no downlink gets more
        # than its line, and only the uplinks - fed from their own server - pause)
        "workload": {"collective": "double_binary_tree", "iterations": 2,
                     "size_bytes": 1 << 20},
        "transport": {"congestion_control": "none"},  # PFC alone holds the senders back
        # half the default thresholds (what the byte defaults were at 20 Mbit/s when they still
        # scaled with the emulated rate): queues cross XOFF on both servers within 2 iterations
        "policy_params": {"lossless": {"adaptive_routing": False, "pfc_xoff_bytes": 64_000,
                                       "pfc_xon_bytes": 48_000, "ecn_kmin_bytes": 16_000,
                                       "ecn_kmax_bytes": 48_000, "other_buffer_bytes": 48_000}},
        # one spine per server: every downlink's feeders include a queue on the other server
        "cluster": {"servers": ["localhost", server.address], "placement": "spread"}})
    result = runner.run(scenario, out_root=str(tmp_path))
    assert result.status == "complete"
    ll = result.policy("lossless")
    q = ll.switch_queues
    assert q.servers == 2
    assert ll.pfc_pause_events > 0, q
    assert q.counters["relayed_out"] > 0 and q.counters["relayed_in"] > 0, q.counters
    assert ll.switch_queue_drops == 0 and ll.drops == 0, ll.drops_by_port
    assert wait_clean() == []


def test_the_default_scenario_runs_every_policy_across_two_servers(tmp_path, server):
    """The issue's proof: the default 8-GPU scenario split over two servers, the ring
    all-reduce under each policy, every byte at every GPU, the cross-server links in the
    results, both servers left clean."""
    from ..integration.test_transport import delivered_bytes, expected_bytes

    scenario = DEFAULT.override({"workload": {"iterations": 2},
                                 "cluster": {"servers": ["localhost", server.address]}})
    result = runner.run(scenario, out_root=str(tmp_path))
    assert result.status == "complete"
    split = result.cluster
    assert len(split["cross_links"]) == 4 and split["link"].startswith("VXLAN")
    for name in ("enterprise", "hyperscale", "lossless"):
        p = result.policy(name)
        assert p.agents_reporting == 8, name
        assert delivered_bytes(result.run_dir, name) == expected_bytes(scenario), name
        assert p.unexplained_drops == 0, name
    assert result.policy("lossless").switch_queue_drops == 0
    assert wait_clean() == []
    assert server.ssh("ovs-vsctl list-br; ls /var/tmp | grep ai-fabric || true").stdout == ""


def test_check_servers_says_what_is_ready_and_what_is_not(server):
    import subprocess
    import sys

    ok = subprocess.run([sys.executable, "-m", "testbed", "check", "--servers",
                         f"localhost,{server.address}"], capture_output=True, text=True,
                        timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    for what in ("ssh as root", "Mininet", "Open vSwitch running", "same testbed version",
                 "clock offset"):
        assert what in ok.stdout
    assert "every server is ready" in ok.stdout
    # an address in the emulated server's subnet that nothing answers on
    absent = server.address.rsplit(".", 1)[0] + ".3"
    bad = subprocess.run([sys.executable, "-m", "testbed", "check", "--servers", absent],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "ssh-copy-id root@" + absent in bad.stdout


def test_clean_servers_after_kill_9_removes_the_split_run_on_both(tmp_path, server):
    import signal
    import subprocess
    import sys

    from ..integration.runs import wait_for_line

    proc = subprocess.Popen([sys.executable, "-m", "testbed", "run", "--scenario", "ring",
                             "--policy", "hyperscale",
                             "--iterations", "200", "--servers",
                             f"localhost,{server.address}", "--out", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_line(proc, "iteration 2/", timeout=120)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    left_there = server.ssh("ovs-vsctl list-br; ls /var/tmp | grep ai-fabric").stdout
    assert "lf3" in left_there and "ai-fabric-testbed-" in left_there  # the kill left them
    clean = subprocess.run([sys.executable, "-m", "testbed", "clean", "--servers",
                            f"localhost,{server.address}"], capture_output=True, text=True,
                           timeout=180)
    assert clean.returncode == 0, clean.stderr
    assert f"{server.address}: removed bridge lf3" in clean.stdout
    assert wait_clean() == []
    assert server.ssh("ovs-vsctl list-br; ls /var/tmp | grep ai-fabric; "
                      "ip -o link | grep -c 'lf[34]-eth' || true").stdout.strip() == "0"


def test_ctrl_c_stops_a_split_job_and_leaves_both_servers_clean(tmp_path, server):
    import signal
    import subprocess
    import sys
    import time

    from ..integration.runs import results_of, wait_for_line

    proc = subprocess.Popen([sys.executable, "-m", "testbed", "run", "--scenario", "default",
                             "--policy", "hyperscale", "--iterations", "20", "--servers",
                             f"localhost,{server.address}", "--out", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    wait_for_line(proc, "iteration 1/20", timeout=180)
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends
    _out, err = proc.communicate(timeout=60)
    stopped_in = time.monotonic() - t0
    assert proc.returncode == 130 and "interrupted" in err, err[-2000:]
    assert stopped_in < 10, f"took {stopped_in:.1f} s to stop"
    assert results_of(tmp_path)["status"] == "incomplete"
    assert wait_clean() == []
    assert server.ssh("ovs-vsctl list-br; ls /var/tmp | grep ai-fabric; "
                      "ip -o link | grep -c 'lf[34]-eth' || true").stdout.strip() == "0"

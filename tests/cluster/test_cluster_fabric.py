"""The leaf-spine fabric split over two servers (one emulated) under the os-ken controller:
each remote server reaches the controller through an ssh reverse tunnel to its loopback, the
switches are programmed, every GPU reaches its neighbour across the split."""
import glob
import os
import shutil

import pytest

from controllers.policy import make_policy
from testbed import runner
from testbed.capabilities import detect
from testbed.config import DEFAULT
from testbed.ledger import Ledger
from testbed.placement import cross_links

from ..integration.leftovers import wait_clean
from .server import EmulatedServer

pytestmark = [pytest.mark.integration, pytest.mark.skipif(
    not shutil.which("sshd") and not os.path.exists("/usr/sbin/sshd"),
    reason="needs openssh-server (make test installs it: scripts/install.sh --test-tools)")]


@pytest.fixture
def server():
    with EmulatedServer() as s:
        yield s


@pytest.mark.parametrize("policy_name", ["hyperscale"])
def test_the_fabric_splits_over_two_servers_and_forwards(tmp_path, server, policy_name):
    scenario = DEFAULT.override({"policies": [policy_name],
                                 "cluster": {"servers": ["localhost", server.address]}})
    plan = runner.validate(scenario)
    policy = make_policy(policy_name, plan, scenario)
    where = runner.cluster_placement(scenario, plan)
    assert where["lf1"] == "localhost" and where["lf4"] == server.address
    assert len(cross_links(plan, where)) == 4
    ledger = Ledger(runner.new_run_id())
    ledger.acquire(str(tmp_path))
    messages = []
    try:
        with runner.fabric_up(policy, scenario, detect(), str(tmp_path), ledger,
                              messages.append) as s:
            remote = [sw for sw in s.fabric.net.switches
                      if getattr(sw, "server", "localhost") != "localhost"]
            assert sorted(sw.name for sw in remote) == ["lf3", "lf4"]
            # the remote switches' controller is their own loopback (the reverse tunnel)
            r = server.ssh("ovs-vsctl get-controller lf3")
            assert r.stdout.strip() == f"tcp:127.0.0.1:{s.controller.port}", r
            # a GPU on this server reaches one on the other
            out = s.fabric.host("gpu1").cmd("ping -n -c 3 -W 2 10.0.4.1")
            assert " 0% packet loss" in out, out
    finally:
        ledger.teardown()
        ledger.close()
    assert any("switches programmed" in m for m in messages)
    assert wait_clean() == []
    assert server.ssh("ovs-vsctl list-br").stdout.strip() == ""  # the other server is clean


def test_agents_on_both_servers_complete_a_ring_across_the_split(tmp_path, server):
    from testbed.agents import AgentGroup, finish_timeout_s

    from ..integration.test_transport import delivered_bytes, expected_bytes

    scenario = DEFAULT.override({"policies": ["hyperscale"],
                                 "workload": {"iterations": 2, "size_bytes": 256 * 1024},
                                 "cluster": {"servers": ["localhost", server.address]}})
    plan = runner.validate(scenario)
    policy = make_policy("hyperscale", plan, scenario)
    ledger = Ledger(runner.new_run_id())
    ledger.acquire(str(tmp_path))
    try:
        with runner.fabric_up(policy, scenario, detect(), str(tmp_path), ledger) as s:
            agents = AgentGroup(s.fabric, policy, scenario, str(tmp_path / "records"),
                                str(tmp_path), ledger, "cluster")
            try:
                agents.start()
                agents.go()
                agents.wait(timeout=finish_timeout_s(scenario))
            finally:
                agents.stop()
    finally:
        ledger.teardown()
        ledger.close()
    assert delivered_bytes(str(tmp_path), "") == expected_bytes(scenario)
    # the remote agents' records came back; their workspace on the server is gone
    records = sorted(os.listdir(tmp_path / "records"))
    assert all(f"gpu{i}.packets.csv" in records for i in range(1, 9))
    assert glob.glob("/var/tmp/ai-fabric-testbed-*") == []
    assert wait_clean() == []

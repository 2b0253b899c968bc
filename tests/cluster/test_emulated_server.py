"""The emulated second server works as Mininet Cluster needs it: ssh as root, its own Open
vSwitch, and a linear fabric split over both servers forwards (pingAll 0% loss)."""
import subprocess

import pytest

from .conftest import NEEDS_SSHD

pytestmark = [pytest.mark.integration, NEEDS_SSHD]


@pytest.fixture(autouse=True)
def private_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # Mininet Cluster keeps ssh sockets in ~/.ssh/mn


def test_the_server_has_its_own_ovs_and_answers_ssh(server):
    r = server.ssh("ovs-vsctl show && ip -o -4 addr show && sudo true && echo ok")
    assert r.returncode == 0, r.stderr
    assert server.address in r.stdout and r.stdout.strip().endswith("ok")
    here = subprocess.run(["ovs-vsctl", "get", "Open_vSwitch", ".", "_uuid"],
                          capture_output=True, text=True).stdout
    there = server.ssh("ovs-vsctl get Open_vSwitch . _uuid").stdout
    assert here.strip() and there.strip() and here != there  # two Open vSwitch instances


def test_mininet_cluster_splits_a_linear_fabric_over_both_servers(server):
    from mininet.examples.cluster import (MininetCluster, RemoteOVSSwitch, RemoteSSHLink,
                                          SwitchBinPlacer)
    from mininet.topo import LinearTopo
    from functools import partial

    switch = partial(RemoteOVSSwitch, datapath="user", failMode="standalone")
    net = MininetCluster(topo=LinearTopo(2, 1), servers=["localhost", server.address],
                         user="root", switch=switch, link=RemoteSSHLink, controller=None,
                         placement=SwitchBinPlacer)
    try:
        net.start()
        where = {n.name: getattr(n, "server", "localhost") for n in net.hosts + net.switches}
        assert set(where.values()) == {"localhost", server.address}, where
        assert net.pingAll(timeout=2) == 0
    finally:
        net.stop()

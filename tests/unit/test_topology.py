import pytest

from testbed.base.errors import ConfigError
from testbed.fabric.network import LeafSpineTopo
from testbed.base.topology import FabricPlan


def test_default_plan_names_addresses_and_ports():
    plan = FabricPlan(spines=2, leaves=4, gpus_per_leaf=2)
    assert [s.name for s in plan.spines] == ["sp1", "sp2"]
    assert [s.name for s in plan.leaves] == ["lf1", "lf2", "lf3", "lf4"]
    assert [h.name for h in plan.hosts] == [f"gpu{i}" for i in range(1, 9)]
    g3 = plan.host("gpu3")
    assert (g3.rank, g3.leaf, g3.index, g3.ip, g3.mac) == (2, 2, 1, "10.0.2.1",
                                                          "02:00:0a:00:02:01")
    assert g3.intf == "gpu3-eth0"
    assert plan.leaves[0].dpid == 0x10001 and plan.spines[1].dpid == 0x20002
    assert plan.leaves[0].dpid_hex == "0000000000010001"
    assert plan.uplinks() == {1: 3, 2: 4}
    assert plan.spine_port(3) == 3


def test_links_cable_every_leaf_to_every_spine_and_each_gpu_to_its_leaf():
    plan = FabricPlan(3, 2, 4)
    fabric = [lk for lk in plan.links if lk.kind == "fabric"]
    hosts = [lk for lk in plan.links if lk.kind == "host"]
    assert len(fabric) == 3 * 2 and len(hosts) == 8
    assert {(lk.node1, lk.node2) for lk in fabric} == {
        (f"lf{lf}", f"sp{s}") for lf in (1, 2) for s in (1, 2, 3)}
    cables = {(lk.node1, lk.port1, lk.node2, lk.port2) for lk in fabric}
    assert ("lf2", 5, "sp1", 2) in cables
    names = plan.interface_names()
    assert len(names) == len(set(names)) == 2 * len(plan.links)
    assert all(len(n) <= 15 for n in names)  # IFNAMSIZ


def test_switch_interfaces_are_the_switch_egress_ports():
    plan = FabricPlan(2, 4, 2)
    ports = dict(plan.switch_interfaces())
    assert len(ports) == 8 + 16
    assert ports["lf1-eth1"] == "host" and ports["sp2-eth4"] == "fabric"
    assert "gpu1-eth0" not in ports


@pytest.mark.parametrize("args", [(0, 4, 2), (2, 0, 2), (2, 4, 0), (2, 256, 1), (2, 4, 255),
                                  (2.5, 4, 2), (True, 4, 2)])
def test_impossible_plans_are_rejected(args):
    with pytest.raises(ConfigError):
        FabricPlan(*args)


def test_plan_round_trips_through_its_dict():
    plan = FabricPlan(2, 3, 4)
    again = FabricPlan.from_dict(plan.to_dict())
    assert [h.ip for h in again.hosts] == [h.ip for h in plan.hosts]


def test_mininet_topo_follows_the_plan():
    topo = LeafSpineTopo(FabricPlan(2, 4, 2))
    assert sorted(topo.switches()) == sorted(["sp1", "sp2", "lf1", "lf2", "lf3", "lf4"])
    assert len(topo.hosts()) == 8
    assert topo.nodeInfo("lf2")["dpid"] == "0000000000010002"
    assert topo.nodeInfo("gpu4")["ip"] == "10.0.2.2/16"
    # explicit port numbers: leaf 1 reaches spine 2 on port 4, spine 2 reaches leaf 1 on port 1
    assert topo.port("lf1", "sp2") == (4, 1)
    assert topo.port("gpu1", "lf1") == (0, 1)
    assert len(topo.links()) == 8 + 8


def test_neighbour_hosts_sit_after_the_gpus_and_have_no_rank():
    plan = FabricPlan(2, 3, 2, neighbours_per_leaf=1)
    assert [h.name for h in plan.gpus] == [f"gpu{i}" for i in range(1, 7)]
    assert [h.name for h in plan.neighbours] == ["nb1", "nb2", "nb3"]
    nb2 = plan.host("nb2")
    assert (nb2.leaf, nb2.index, nb2.ip, nb2.rank, nb2.is_gpu) == (2, 3, "10.0.2.3", -1, False)
    assert plan.uplink_port(1) == 4 and plan.hosts_per_leaf == 3
    assert [h.name for h in plan.hosts_on_leaf(2)] == ["gpu3", "gpu4", "nb2"]
    assert FabricPlan.from_dict(plan.to_dict()).to_dict() == plan.to_dict()
    assert len(plan.links) == 9 + 6


def test_servers_are_consecutive_ranks_under_one_leaf_by_default():
    plan = FabricPlan(2, 2, 4, gpus_per_server=2)
    assert [(h.rank, h.leaf, h.index, h.server) for h in plan.gpus[:4]] == [
        (0, 1, 1, 0), (1, 1, 2, 0), (2, 1, 3, 1), (3, 1, 4, 1)]
    assert plan.server_ranks(3) == (2, 3)


def test_rail_optimized_puts_gpu_j_of_every_server_on_leaf_j_of_its_rail_group():
    plan = FabricPlan(2, 4, 2, gpus_per_server=2, layout="rail-optimized")
    where = {h.rank: (h.leaf, h.index) for h in plan.gpus}
    # servers 0 and 1 in rail group 1 (leaves 1, 2); servers 2 and 3 in group 2 (leaves 3, 4)
    assert where == {0: (1, 1), 1: (2, 1), 2: (1, 2), 3: (2, 2),
                     4: (3, 1), 5: (4, 1), 6: (3, 2), 7: (4, 2)}
    assert len({h.ip for h in plan.gpus}) == 8
    assert [h.name for h in plan.gpus] == [f"gpu{r + 1}" for r in range(8)]
    again = FabricPlan.from_dict(plan.to_dict())
    assert [(h.leaf, h.index) for h in again.gpus] == [(h.leaf, h.index) for h in plan.gpus]


@pytest.mark.parametrize("kw,match", [
    ({"gpus_per_server": 3}, "do not divide the 2 GPUs per leaf"),
    ({"gpus_per_server": 3, "layout": "rail-optimized"}, "not whole rail groups"),
    ({"layout": "fat-tree"}, "must be one of")])
def test_servers_that_do_not_fit_the_leaves_are_refused(kw, match):
    with pytest.raises(ConfigError, match=match):
        FabricPlan(2, 4, 2, **kw)


def test_a_cluster_placement_that_splits_a_server_is_refused():
    from testbed.plan.placement import place
    plan = FabricPlan(2, 4, 2, gpus_per_server=4, layout="rail-optimized")
    with pytest.raises(ConfigError, match="scale-up domain"):
        place(plan, ["localhost", "b"])
    assert set(place(FabricPlan(2, 4, 2, gpus_per_server=2), ["localhost", "b"]).values()) \
        == {"localhost", "b"}

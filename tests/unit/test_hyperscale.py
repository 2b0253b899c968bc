import collections

import pytest

from controllers.flows import ClearFlows, FlowMod, GroupMod, Output
from controllers.hyperscale import ECMP_GROUP, HyperscalePolicy
from controllers.policy import policy_class, policy_names
from testbed.topology import FabricPlan
from tests.fakeoftable import FakeFabric, udp_packet


@pytest.fixture
def plan():
    return FabricPlan(2, 4, 2)


def test_registered_by_name():
    assert "hyperscale" in policy_names()
    assert policy_class("hyperscale") is HyperscalePolicy
    with pytest.raises(KeyError):
        policy_class("nonesuch")


def test_every_gpu_reaches_every_other_gpu(plan):
    fabric = FakeFabric(plan, HyperscalePolicy(plan))
    for src in plan.hosts:
        for dst in plan.hosts:
            if src is dst:
                continue
            (got, pkt), path = fabric.send(src.name, udp_packet(src, dst))
            assert got == dst.name and pkt["eth_dst"] == dst.mac
            if src.leaf == dst.leaf:
                assert path == [f"lf{src.leaf}"]
            else:
                assert len(path) == 3 and path[1].startswith("sp") and path[2] == f"lf{dst.leaf}"


def test_ecmp_spreads_distinct_5_tuples_over_all_spines():
    plan = FabricPlan(4, 2, 2)
    fabric = FakeFabric(plan, HyperscalePolicy(plan))
    src, dst = plan.host("gpu1"), plan.host("gpu3")
    spines = collections.Counter()
    for sport in range(0xC000, 0xC000 + 64):
        (_got, _pkt), path = fabric.send(src.name, udp_packet(src, dst, sport=sport))
        spines[path[1]] += 1
    assert set(spines) == {"sp1", "sp2", "sp3", "sp4"}
    # one 5-tuple always takes the same spine (no reordering within a flow)
    paths = {tuple(fabric.send(src.name, udp_packet(src, dst, sport=0xC001))[1])
             for _ in range(5)}
    assert len(paths) == 1


def test_leaf_program_is_one_select_group_of_all_uplinks(plan):
    msgs = HyperscalePolicy(plan).switch_connected(plan.leaves[0].dpid)
    assert isinstance(msgs[0], ClearFlows)
    groups = [m for m in msgs if isinstance(m, GroupMod)]
    assert len(groups) == 1 and groups[0].group_id == ECMP_GROUP
    assert groups[0].group_type == "select"
    assert sorted(b.actions[0].port for b in groups[0].buckets) == [3, 4]
    flows = [m for m in msgs if isinstance(m, FlowMod)]
    assert any(f.priority == 0 and f.match == () and f.actions == () for f in flows)  # miss: drop
    assert all(f.cookie == HyperscalePolicy.cookie for f in flows)


def test_spine_routes_each_leaf_subnet_down(plan):
    msgs = HyperscalePolicy(plan).switch_connected(plan.spines[1].dpid)
    routes = {dict(m.match)["ipv4_dst"]: m.actions for m in msgs
              if isinstance(m, FlowMod) and m.match}
    assert routes[("10.0.3.0", "255.255.255.0")] == (Output(3),)
    assert len(routes) == 4


def test_unknown_destination_is_dropped_not_flooded(plan):
    fabric = FakeFabric(plan, HyperscalePolicy(plan))
    src = plan.host("gpu1")
    pkt = dict(udp_packet(src, src), ipv4_dst="10.9.9.9")
    got, path = fabric.send("gpu1", pkt)
    assert got is None and path == ["lf1"]


def test_unknown_switch_raises_key_error(plan):
    with pytest.raises(KeyError):
        HyperscalePolicy(plan).switch_connected(0x999)

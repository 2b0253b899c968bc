import collections

import pytest

from controllers import l3
from controllers.messages import ClearFlows, FlowMod, GroupMod, Multipath
from controllers.hyperscale import HyperscalePolicy
from controllers.params import resolve
from controllers.policy import FabricContext, policy_class, policy_names
from testbed.base.topology import FabricPlan
from tests.fakeoftable import FakeFabric, udp_packet


@pytest.fixture
def plan():
    return FabricPlan(2, 4, 2)


def test_registered_by_name():
    assert policy_names() == ["enterprise", "hyperscale", "lossless"]
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
            assert got == dst.name and pkt["eth_dst"] == dst.mac and pkt["ip_ecn"] == 2
            if src.leaf == dst.leaf:
                assert path == [f"lf{src.leaf}"]
            else:
                assert len(path) == 3 and path[1].startswith("sp") and path[2] == f"lf{dst.leaf}"


def test_ecmp_hashes_the_5_tuple_so_the_udp_source_port_picks_the_spine():
    plan = FabricPlan(4, 2, 2)
    fabric = FakeFabric(plan, HyperscalePolicy(plan))
    src, dst = plan.host("gpu1"), plan.host("gpu3")
    spines = collections.Counter(
        fabric.send(src.name, udp_packet(src, dst, sport=sport))[1][1]
        for sport in range(0xC000, 0xC000 + 64))
    assert set(spines) == {"sp1", "sp2", "sp3", "sp4"}
    # one 5-tuple always takes the same spine (no reordering within a flow)
    paths = {tuple(fabric.send(src.name, udp_packet(src, dst, sport=0xC001))[1])
             for _ in range(5)}
    assert len(paths) == 1


def test_leaf_hashes_into_one_slot_per_uplink(plan):
    msgs = HyperscalePolicy(plan).switch_connected(plan.leaves[0].dpid)
    assert isinstance(msgs[0], ClearFlows)
    hashing = [a for m in msgs if isinstance(m, FlowMod) for a in m.actions
               if isinstance(a, Multipath)]
    assert hashing and all(a.links == 2 and a.fields == "symmetric_l3l4+udp" for a in hashing)
    slots = {dict(m.match)["reg1"]: m.actions[0].value for m in msgs
             if isinstance(m, FlowMod) and m.table_id == l3.ECMP}
    assert slots == {0: 3, 1: 4}
    flows = [m for m in msgs if isinstance(m, FlowMod)]
    assert any(f.priority == 0 and f.match == () and f.actions == () for f in flows)  # drop
    assert all(f.cookie == HyperscalePolicy.cookie for f in flows)


def test_unknown_destination_is_dropped_not_flooded(plan):
    fabric = FakeFabric(plan, HyperscalePolicy(plan))
    src = plan.host("gpu1")
    got, path = fabric.send("gpu1", dict(udp_packet(src, src), ipv4_dst="10.9.9.9"))
    assert got is None


def test_one_shallow_class_with_step_ecn_unless_bare(plan):
    (cls,) = HyperscalePolicy(plan).traffic_classes()
    assert cls.ecn.kind == "step" and cls.ecn.kmin == 32_000
    assert cls.pfc is None and cls.buffer_bytes == 96_000
    bare = HyperscalePolicy(plan, resolve("hyperscale", {"ecn": "off"}, 100.0, 4096))
    (cls,) = bare.traffic_classes()
    assert cls.ecn is None and cls.pfc is None


def test_openflow_marking_sets_ce_on_ect_packets_through_that_port_only(plan):
    policy = HyperscalePolicy(plan, resolve("hyperscale", {"ecn": "step"}, 100.0, 4096),
                              FabricContext(openflow_marking=True))
    fabric = FakeFabric(plan, policy)
    lf1 = plan.leaves[0].dpid
    src, dst, other = plan.host("gpu1"), plan.host("gpu2"), plan.host("gpu3")
    fabric.by_dpid[lf1].apply(policy.ecn_changed(lf1, dst.index, True))
    (_, pkt), _ = fabric.send(src.name, udp_packet(src, dst, ecn=2))
    assert pkt["ip_ecn"] == 3  # ECT(0) -> CE on the congested port
    (_, pkt), _ = fabric.send(src.name, udp_packet(src, dst, ecn=0))
    assert pkt["ip_ecn"] == 0  # not ECN-capable: never marked
    (_, pkt), _ = fabric.send(src.name, udp_packet(src, other, ecn=2))
    assert pkt["ip_ecn"] == 2  # another port: not marked
    fabric.by_dpid[lf1].apply(policy.ecn_changed(lf1, dst.index, False))
    (_, pkt), _ = fabric.send(src.name, udp_packet(src, dst, ecn=2))
    assert pkt["ip_ecn"] == 2


def test_without_openflow_marking_the_pipeline_never_looks_at_ecn(plan):
    """Marking below the switch (RED, the BPF program): no flow matches ip_ecn, so a flow's
    ECT and CE packets share one datapath flow and cannot overtake each other in OVS."""
    policy = HyperscalePolicy(plan, resolve("hyperscale", {"ecn": "step"}, 100.0, 4096))
    for sw in plan.switches:
        msgs = policy.switch_connected(sw.dpid)
        assert not [m for m in msgs if isinstance(m, FlowMod) and "ip_ecn" in dict(m.match)]
        assert not [m for m in msgs if isinstance(m, GroupMod)]
    fabric = FakeFabric(plan, policy)
    src, dst = plan.host("gpu1"), plan.host("gpu8")
    for ecn in (0, 2, 3):
        (got, pkt), _ = fabric.send(src.name, udp_packet(src, dst, ecn=ecn))
        assert got == dst.name and pkt["ip_ecn"] == ecn


def test_unknown_switch_raises_key_error(plan):
    with pytest.raises(KeyError):
        HyperscalePolicy(plan).switch_connected(0x999)

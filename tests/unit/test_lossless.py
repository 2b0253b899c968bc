import collections

import pytest

from controllers import l3
from controllers.lossless import LosslessPolicy
from controllers.params import resolve
from controllers.policy import LANDING_S, FabricContext
from testbed.base.topology import FabricPlan
from tests.fakeoftable import FakeFabric, udp_packet


@pytest.fixture
def plan():
    return FabricPlan(2, 4, 2)


def uplink_of(path, plan):
    return path[1]  # the spine a leaf chose


def test_classes_cnp_first_roce_lossless_with_ecn_then_best_effort(plan):
    cnp, roce, other = LosslessPolicy(plan).traffic_classes()
    assert (cnp.name, cnp.priority, cnp.dscp) == ("cnp", 0, (48,))
    assert (roce.name, roce.priority, roce.dscp) == ("roce", 1, (26,))
    assert roce.lossless and roce.pfc.xoff == 128_000 and roce.pfc.xon == 96_000
    assert roce.ecn.kind == "red" and roce.ecn.kmin < roce.ecn.kmax <= roce.pfc.xoff
    assert roce.buffer_bytes > roce.pfc.xoff  # headroom
    assert other.dscp == () and not other.lossless


def test_headroom_covers_every_feeder_for_the_reaction_time(plan):
    policy = LosslessPolicy(plan, context=FabricContext(40, 40, 4096, 0.001))
    rate = 40e6 / 8
    feeders = 1 + 2  # the other GPU of the leaf and both spines
    expected = int(feeders * (rate * (3 * 0.001 + LANDING_S) + 2 * (4096 + 100)))
    assert policy.headroom_bytes() == expected
    fixed = LosslessPolicy(plan, resolve("lossless", {"pfc_headroom_bytes": 5000}, 100.0, 4096))
    assert fixed.headroom_bytes() == 5000
    # with the per-hop delay: what the feeders sent during it arrives after the pause too
    delayed = LosslessPolicy(plan, context=FabricContext(40, 40, 4096, 0.001, time_scale=2500,
                                                         cable_m=10, switch_latency=True))
    hop_s = (130 + 50) * 2500 / 1e9  # cut-through: pipeline + cable, scaled
    assert delayed.headroom_bytes() == int(feeders * (rate * (0.003 + LANDING_S + hop_s) + 2 * 4196))


def test_every_gpu_reaches_every_other_gpu(plan):
    fabric = FakeFabric(plan, LosslessPolicy(plan))
    for src in plan.hosts:
        for dst in plan.hosts:
            if src is not dst:
                (got, pkt), path = fabric.send(src.name, udp_packet(src, dst))
                assert got == dst.name and pkt["eth_dst"] == dst.mac


def test_adaptive_routing_learns_the_flowlet_and_keeps_it(plan):
    policy = LosslessPolicy(plan)
    fabric = FakeFabric(plan, policy)
    src, dst = plan.host("gpu1"), plan.host("gpu3")
    lf1 = fabric.switches["lf1"]
    before = len(lf1.table(l3.FLOWLET))
    (_, _), path = fabric.send(src.name, udp_packet(src, dst, sport=0xC123))
    assert len(lf1.table(l3.FLOWLET)) == before + 1  # learned
    # congestion moves the slots, but the running flowlet stays on its spine
    dpid = plan.leaves[0].dpid
    taken = 3 if path[1] == "sp1" else 4
    fabric.apply(policy.queue_load({dpid: {taken: 60_000, 7 - taken: 0}}))
    assert fabric.send(src.name, udp_packet(src, dst, sport=0xC123))[1] == path


def test_new_flows_avoid_a_congested_uplink(plan):
    policy = LosslessPolicy(plan)
    fabric = FakeFabric(plan, policy)
    src, dst = plan.host("gpu1"), plan.host("gpu3")
    dpid = plan.leaves[0].dpid
    fabric.apply(policy.queue_load({dpid: {3: 50_000, 4: 1_000}}))  # uplink to sp1 congested
    spines = {fabric.send(src.name, udp_packet(src, dst, sport=s))[1][1]
              for s in range(0xC000, 0xC000 + 40)}
    assert spines == {"sp2"}
    changed = policy.queue_load({dpid: {3: 0, 4: 0}})  # both idle again: spread over both
    assert len(changed[dpid]) == 3  # two slots re-pointed, the hash over two slots
    fabric.apply(changed)
    spines = collections.Counter(fabric.send(src.name, udp_packet(src, dst, sport=s))[1][1]
                                 for s in range(0xD000, 0xD000 + 200))
    assert set(spines) == {"sp1", "sp2"}


def test_spraying_spreads_per_packet_source_ports_over_all_uplinks():
    plan = FabricPlan(4, 2, 1)
    fabric = FakeFabric(plan, LosslessPolicy(plan))
    src, dst = plan.host("gpu1"), plan.host("gpu2")
    spines = collections.Counter(fabric.send(src.name, udp_packet(src, dst, sport=s))[1][1]
                                 for s in range(0xC000, 0xC000 + 800))
    assert set(spines) == {"sp1", "sp2", "sp3", "sp4"}
    assert max(spines.values()) < 1.3 * min(spines.values())


def test_sprayed_packets_are_spread_without_learning_a_flowlet_each():
    plan = FabricPlan(4, 2, 1)
    sprayed = FakeFabric(plan, LosslessPolicy(plan, context=FabricContext(sprayed=True)))
    learning = FakeFabric(plan, LosslessPolicy(plan))
    src, dst = plan.host("gpu1"), plan.host("gpu2")
    for fabric in (sprayed, learning):
        spines = collections.Counter(fabric.send(src.name, udp_packet(src, dst, sport=s))[1][1]
                                     for s in range(0xC000, 0xC000 + 800))
        assert set(spines) == {"sp1", "sp2", "sp3", "sp4"}
    leaf = plan.leaves[0].name
    assert sprayed.switches[leaf].table(l3.FLOWLET) == learning.switches[leaf].table(
        l3.FLOWLET)[:1]  # the miss entry alone, against one learned flowlet per packet
    assert len(learning.switches[leaf].table(l3.FLOWLET)) > 800


def test_queue_load_sends_nothing_when_nothing_changes(plan):
    policy = LosslessPolicy(plan)
    dpid = plan.leaves[0].dpid
    assert policy.queue_load({dpid: {3: 0, 4: 0}}) == {}
    assert policy.queue_load({dpid: {3: 0, 4: 100}}) == {}  # within one frame: both least
    assert set(policy.watched_ports()) == {lf.dpid for lf in plan.leaves}


def test_a_few_frames_queued_on_a_busy_uplink_move_no_flowlet(plan):
    """Two frames behind the one on the wire are serialization, not congestion: following
    them, slots flipped between uplinks at every sample (560-650 OpenFlow messages in a
    default run against 130 for programming). A queue half way to the ECN threshold moves."""
    policy = LosslessPolicy(plan)
    dpid = plan.leaves[0].dpid
    frame = 4096 + 100
    assert policy.queue_load({dpid: {3: 2 * frame, 4: 0}}) == {}
    half_kmin = policy.params.ecn_kmin_bytes // 2
    assert policy.queue_load({dpid: {3: half_kmin, 4: 0}}) == {}
    assert policy.queue_load({dpid: {3: half_kmin + 1, 4: 0}}) != {}
    assert policy.slots[dpid] == [4]


def test_without_adaptive_routing_roce_is_hashed(plan):
    policy = LosslessPolicy(plan, resolve("lossless", {"adaptive_routing": False}, 100.0, 4096))
    fabric = FakeFabric(plan, policy)
    src, dst = plan.host("gpu1"), plan.host("gpu3")
    got, path = fabric.send(src.name, udp_packet(src, dst))
    assert got is not None and got[0] == "gpu3", path  # delivered, by the hash
    assert fabric.switches["lf1"].table(l3.FLOWLET) == []
    assert policy.watched_ports() is None and not policy.wants_queue_load


def test_credits_keep_the_roce_lane_lossless_in_place_of_pfc(plan):
    ctx = FabricContext(40, 40, 4096, 0.001)
    params = resolve("lossless", {"flow_control": "credit"}, 100.0, 4096)
    policy = LosslessPolicy(plan, params, context=ctx)
    cnp, roce, other = policy.traffic_classes()
    headroom = policy.headroom_bytes()
    assert roce.pfc is None and roce.lossless and roce.flow_control is roce.credit
    # the buffer PFC would get (XOFF + headroom); the feeders stop where PFC's XOFF is
    assert roce.buffer_bytes == roce.credit.buffer == params.pfc_xoff_bytes + headroom
    assert roce.credit.limit == params.pfc_xoff_bytes
    assert roce.ecn.kmax <= roce.credit.limit
    given = resolve("lossless", {"flow_control": "credit", "credit_buffer_bytes": 300_000},
                    100.0, 4096)
    lane = LosslessPolicy(plan, given, context=ctx).traffic_classes()[1]
    assert lane.buffer_bytes == 300_000 and lane.credit.limit == 300_000 - headroom
    # CNPs: a lane with credits of its own (InfiniBand's VLs), lossy only under PFC
    assert cnp.credit and cnp.lossless and cnp.pfc is None and not cnp.ecn
    assert cnp.credit.limit == params.other_buffer_bytes
    assert cnp.buffer_bytes == cnp.credit.buffer == params.other_buffer_bytes + headroom
    assert other.flow_control is None
    pfc_cnp = LosslessPolicy(plan, resolve("lossless", {}, 100.0, 4096),
                             context=ctx).traffic_classes()[0]
    assert not pfc_cnp.lossless and pfc_cnp.buffer_bytes == params.other_buffer_bytes


def test_a_credit_buffer_smaller_than_the_headroom_is_refused(plan):
    params = resolve("lossless", {"flow_control": "credit", "credit_buffer_bytes": 10_000},
                     100.0, 4096)
    with pytest.raises(Exception, match="credit_buffer_bytes: 10,000 B leaves no room"):
        LosslessPolicy(plan, params, context=FabricContext(40, 40, 4096, 0.001)
                       ).traffic_classes()

import pytest

from controllers.enterprise import EnterprisePolicy, tenants
from controllers.params import resolve
from testbed.base.errors import ConfigError
from testbed.base.topology import FabricPlan
from tests.fakeoftable import FakeFabric, udp_packet


@pytest.fixture
def plan():
    return FabricPlan(2, 4, 2)


def two_tenants(plan):
    params = resolve("enterprise", {"tenants": [["gpu1", "gpu3", "gpu5", "gpu7"]]}, 100.0, 4096)
    return EnterprisePolicy(plan, params)


def test_all_gpus_talk_over_the_root_spine_only(plan):
    fabric = FakeFabric(plan, EnterprisePolicy(plan))
    for src in plan.hosts:
        for dst in plan.hosts:
            if src is dst:
                continue
            got = fabric.deliver(src.name, udp_packet(src, dst))
            hosts = [g[0] for g in got]
            assert dst.name in hosts  # flooded or forwarded, it arrives
            for _host, _pkt, path in got:
                assert "sp2" not in path  # blocked by the spanning tree
    # after learning, traffic is unicast: exactly one copy, on the tree
    src, dst = plan.host("gpu1"), plan.host("gpu8")
    fabric.deliver(dst.name, udp_packet(dst, src))  # dst speaks, so every switch learns it
    (got, _), path = fabric.send(src.name, udp_packet(src, dst))
    assert got == "gpu8" and path == ["lf1", "sp1", "lf4"]


def test_learning_stops_packet_ins(plan):
    fabric = FakeFabric(plan, EnterprisePolicy(plan))
    a, b = plan.host("gpu1"), plan.host("gpu4")
    fabric.deliver(a.name, udp_packet(a, b))
    fabric.deliver(b.name, udp_packet(b, a))
    seen = fabric.packet_ins
    for _ in range(3):
        fabric.deliver(a.name, udp_packet(a, b))
        fabric.deliver(b.name, udp_packet(b, a))
    assert fabric.packet_ins == seen


def test_tenants_never_reach_each_other(plan):
    fabric = FakeFabric(plan, two_tenants(plan))
    a_hosts = {"gpu1", "gpu3", "gpu5", "gpu7"}
    for src in plan.hosts:
        for dst in plan.hosts:
            if src is dst:
                continue
            reached = {g[0] for g in fabric.deliver(src.name, udp_packet(src, dst))}
            same = (src.name in a_hosts) == (dst.name in a_hosts)
            if same:
                assert dst.name in reached
            tenant = a_hosts if src.name in a_hosts else {h.name for h in plan.hosts} - a_hosts
            assert reached <= tenant, f"{src.name} reached {reached - tenant}"


def test_spoofed_or_unknown_sources_are_dropped(plan):
    fabric = FakeFabric(plan, EnterprisePolicy(plan))
    a, b = plan.host("gpu1"), plan.host("gpu2")
    spoof = dict(udp_packet(a, b), eth_src=plan.host("gpu5").mac)  # gpu5 is not on lf1
    assert fabric.deliver("gpu1", spoof) == []
    assert fabric.deliver("gpu1", dict(udp_packet(a, b), eth_src="02:aa:00:00:00:01")) == []


def test_interactive_class_is_strictly_above_best_effort(plan):
    interactive, best_effort = EnterprisePolicy(plan).traffic_classes()
    assert interactive.priority < best_effort.priority and interactive.dscp == (46,)
    assert best_effort.dscp == () and best_effort.ecn is None and best_effort.pfc is None


def test_bad_tenants_and_root_are_config_errors(plan):
    with pytest.raises(ConfigError, match="no GPU named 'gpu99'"):
        tenants(plan, (("gpu99",),))
    with pytest.raises(ConfigError, match="gpu1 is in two tenants"):
        tenants(plan, (("gpu1",), ("gpu1", "gpu2")))
    with pytest.raises(ConfigError, match="spanning_tree_root"):
        EnterprisePolicy(plan, resolve("enterprise", {"spanning_tree_root": 3}, 100.0, 4096))


def test_neighbour_hosts_form_their_own_tenant_by_default():
    plan = FabricPlan(2, 2, 2, neighbours_per_leaf=1)
    t = tenants(plan, ())
    assert t["gpu1"] == t["gpu4"] == 1
    assert t["nb1"] == t["nb2"] == 2
    t = tenants(plan, (("gpu1", "nb1"),))
    assert t["nb1"] == t["gpu1"] == 1 and t["gpu2"] == 2 and t["nb2"] == 3

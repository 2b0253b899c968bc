"""The per-hop latency model (testbed.base.hops) and how the fabric applies it."""
import pytest

from controllers.params import resolve
from testbed.scenario.config import Scenario
from testbed.fabric.network import egress_shapes
from testbed.base.errors import ConfigError
from testbed.base.hops import (HopModel, PathDelay, fixed_path_us, hop_model, mechanism,
                                 path_floor_us, switch_path_us, transmission_us)
from testbed.base.topology import FabricPlan
from controllers.classes import TrafficClass

ONE = (TrafficClass("be", 0, 0, (), 100_000),)


def test_cut_through_adds_the_pipeline_and_the_cable_scaled():
    m = HopModel("cut_through", 130.0, cable_m=10.0, time_scale=2500.0)
    assert m.link_us() == pytest.approx(125.0)  # 50 ns x 2500
    assert m.switch_us(40.0, 4110) == pytest.approx(125.0 + 325.0)


def test_store_and_forward_adds_one_frame_serialization_at_the_port_rate():
    m = HopModel("store_and_forward", 250.0, cable_m=0.0, time_scale=2500.0)
    # 4110 B at 40 Mbit/s = 822 us; the same frame at 100 Gbit/s (0.3288 us) x 2500
    assert m.switch_us(40.0, 4110) == pytest.approx(625.0 + 822.0)
    assert m.switch_us(20.0, 4110) == pytest.approx(625.0 + 1644.0)


def test_extra_delay_is_added_as_given():
    assert HopModel(extra_us=7.0).switch_us(40.0, 1514) == 7.0


def test_policy_defaults_make_lossless_the_lowest_latency_per_hop():
    s = Scenario.from_dict({}).for_checks()
    delays = {p: hop_model(s, resolve(p, {}, 100.0, 4096)).delays_us(40.0, 40.0, 4110)
              for p in ("enterprise", "hyperscale", "lossless")}
    assert delays["lossless"]["switch_to_switch"] < delays["hyperscale"]["switch_to_switch"]
    assert delays["hyperscale"] == delays["enterprise"]
    # all three share the cable of the GPU NIC
    assert len({d["gpu_nic"] for d in delays.values()}) == 1
    assert delays["lossless"]["gpu_nic"] == pytest.approx(10 * 5 * s.time_scale / 1000)


def test_switch_latency_off_leaves_only_the_extra_delay():
    s = Scenario.from_dict({"emulation": {"switch_latency": False},
                            "topology": {"link_delay_us": 3}}).for_checks()
    d = hop_model(s, resolve("lossless", {}, 100.0, 4096)).delays_us(40.0, 40.0, 4110)
    assert d == {"gpu_nic": 3.0, "switch_to_gpu": 3.0, "switch_to_switch": 3.0}


def test_policy_params_override_the_model():
    s = Scenario.from_dict({"policy_params": {"lossless": {"forwarding": "store_and_forward",
                                                           "switch_latency_ns": 0}}}).for_checks()
    m = hop_model(s, resolve("lossless", s.policy_params["lossless"], 100.0, 4096))
    assert m.forwarding == "store_and_forward" and m.pipeline_ns == 0


D = {"gpu_nic": 1.0, "switch_to_gpu": 10.0, "switch_to_switch": 100.0}


def test_paths_count_the_sender_link_and_the_switch_ports():
    assert switch_path_us(D, True) == 10.0 and switch_path_us(D, False) == 210.0
    assert fixed_path_us(D, True) == 11.0 and fixed_path_us(D, False) == 211.0
    assert transmission_us(4154, 40.0) == pytest.approx(830.8)


def test_netem_puts_the_switch_ports_in_qdiscs_and_the_rest_in_the_rnic():
    p = PathDelay("netem", D)
    assert p.netem_us() == {"gpu_nic": 0.0, "switch_to_gpu": 10.0, "switch_to_switch": 100.0}
    assert p.rnic_us(False) == 1.0 and p.neighbour_nic_us() == 1.0 and p.transmission
    # together the same path as the RNIC's delay line alone
    n = PathDelay("nic", D)
    assert n.netem_us() == dict.fromkeys(D, 0.0) and n.neighbour_nic_us() == 0.0
    assert n.rnic_us(True) == 11.0 and n.rnic_us(False) == 211.0 and n.transmission
    for same in (True, False):
        assert p.expected_us(same) == n.expected_us(same) == fixed_path_us(D, same)
        assert p.rnic_us(same) + switch_path_us(p.netem_us(), same) == n.rnic_us(same)
    off = PathDelay("off", D)
    assert off.rnic_us(False) == off.expected_us(False) == 0.0 and not off.transmission
    assert off.netem_us() == dict.fromkeys(D, 0.0)


def test_auto_takes_netem_where_the_kernel_has_it_else_the_rnic():
    assert mechanism("auto", True) == "netem" and mechanism("auto", False) == "nic"
    assert mechanism("nic", True) == "nic" and mechanism("off", False) == "off"
    with pytest.raises(ConfigError, match="no netem qdisc"):
        mechanism("netem", False)


def test_shapes_put_the_netem_delays_on_switch_ports_and_neighbour_nics():
    plan = FabricPlan(2, 2, 1, neighbours_per_leaf=1)
    p = PathDelay("netem", D)
    shapes = egress_shapes(plan, Scenario.from_dict({}).for_checks().topology, ONE,
                           delays_us=p.netem_us(), neighbour_us=p.neighbour_nic_us())
    by_delay = sorted(s.delay_us for s in shapes.values())
    # 2 GPU NICs (none), 2 neighbour NICs, 4 leaf ports toward hosts, 8 switch-to-switch ports
    assert by_delay == [0.0] * 2 + [1.0] * 2 + [10.0] * 4 + [100.0] * 8


def test_measured_floor_per_path_kind():
    plan = FabricPlan(2, 2, 2)  # ranks 0,1 on leaf 0; 2,3 on leaf 1
    floor = path_floor_us(plan, {(0, 1): 30.0, (1, 0): 20.0, (0, 2): 500.0, (3, 1): 400.0})
    assert floor == {"same_leaf": 20.0, "cross_leaf": 400.0}
    assert path_floor_us(plan, {(0, 2): 9.0})["same_leaf"] is None

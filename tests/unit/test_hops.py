"""The per-hop latency model (testbed.base.hops) and how the fabric applies it."""
import pytest

from controllers.params import resolve
from testbed.scenario.config import Scenario
from testbed.fabric.network import egress_shapes
from testbed.base.hops import HopModel, hop_model, path_delay_us, path_floor_us
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


def test_paths_and_shapes_use_the_port_kinds():
    d = {"gpu_nic": 1.0, "switch_to_gpu": 10.0, "switch_to_switch": 100.0}
    assert path_delay_us(d, True) == 10.0 and path_delay_us(d, False) == 210.0
    plan = FabricPlan(2, 2, 1)
    shapes = egress_shapes(plan, Scenario.from_dict({}).for_checks().topology, ONE, delays_us=d)
    by_delay = sorted(s.delay_us for s in shapes.values())
    # 2 GPU NICs, 2 leaf ports toward GPUs, 8 switch-to-switch ports (4 links)
    assert by_delay == [1.0] * 2 + [10.0] * 2 + [100.0] * 8


def test_measured_floor_per_path_kind():
    plan = FabricPlan(2, 2, 2)  # ranks 0,1 on leaf 0; 2,3 on leaf 1
    floor = path_floor_us(plan, {(0, 1): 30.0, (1, 0): 20.0, (0, 2): 500.0, (3, 1): 400.0})
    assert floor == {"same_leaf": 20.0, "cross_leaf": 400.0}
    assert path_floor_us(plan, {(0, 2): 9.0})["same_leaf"] is None

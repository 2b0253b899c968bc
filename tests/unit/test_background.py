"""Who sends background traffic to whom (pure planning)."""
import pytest

from testbed.plan.background import background_plan
from testbed.scenario.config import Scenario
from testbed.base.errors import ConfigError
from testbed.base.topology import FabricPlan


def _plan(scenario):
    t = scenario.topology
    return FabricPlan(t.spines, t.leaves, t.gpus_per_leaf, t.neighbours_per_leaf)


def test_noisy_neighbours_send_to_the_same_position_on_the_next_leaf():
    s = Scenario.from_dict({"topology": {"neighbours_per_leaf": 2},
                            "background": {"noisy_neighbour": {"rate_gbit": 25}}})
    bg = background_plan(_plan(s), s)
    pairs = [(f.src, f.dst) for f in bg.noisy]
    assert pairs[:2] == [("nb1", "nb3"), ("nb2", "nb4")]
    assert pairs[-2:] == [("nb7", "nb1"), ("nb8", "nb2")]  # the last leaf wraps around
    assert not bg.incast


def test_on_one_leaf_neighbours_send_to_each_other():
    s = Scenario.from_dict({"topology": {"leaves": 1, "gpus_per_leaf": 2,
                                         "neighbours_per_leaf": 2},
                            "background": {"noisy_neighbour": {"rate_gbit": 25}}})
    assert [(f.src, f.dst) for f in background_plan(_plan(s), s).noisy] == [
        ("nb1", "nb2"), ("nb2", "nb1")]


def test_incast_defaults_to_the_neighbours_or_far_gpus_towards_the_last_gpu():
    s = Scenario.from_dict({"background": {"incast": {"period_us": 200}}})
    bg = background_plan(_plan(s), s)
    assert bg.incast_target == "gpu8"
    assert [f.src for f in bg.incast] == ["gpu1", "gpu2", "gpu3", "gpu4", "gpu5", "gpu6"]
    s = Scenario.from_dict({"topology": {"neighbours_per_leaf": 1},
                            "background": {"incast": {"period_us": 200, "target": "gpu1"}}})
    assert [f.src for f in background_plan(_plan(s), s).incast] == ["nb1", "nb2", "nb3", "nb4"]


def test_incast_senders_must_differ_from_the_target():
    s = Scenario.from_dict({"background": {"incast": {"period_us": 200, "target": "gpu2",
                                                      "senders": ["gpu2"]}}})
    with pytest.raises(ConfigError, match="gpu2 is the target"):
        background_plan(_plan(s), s)


def test_no_background_by_default():
    s = Scenario.from_dict({})
    assert background_plan(_plan(s), s).empty and not s.background.enabled


def test_iperf3_figures_come_from_the_client_and_the_server():
    from testbed.plan.background import Flow
    from testbed.run.background import _iperf3_figures
    client = {"end": {"sum": {"packets": 4059, "bits_per_second": 14999237.8}}}
    server = {"end": {"sum": {"packets": 4058, "lost_packets": 8, "jitter_ms": 0.2446}}}
    row = _iperf3_figures(Flow("noisy", "nb1", "nb2"), client, server)
    assert row == {"src": "nb1", "dst": "nb2", "sent": 4059, "sent_mbit_s": 14.999,
                   "received": 4050, "jitter_ms": 0.245}


def test_flow_tool_figures_pick_the_senders_flow():
    from testbed.plan.background import Flow
    from testbed.run.background import _as, _flow_figures
    from traffic.contract import FlowsReceived, FlowsSent
    recv = {"flows": {"udp 10.0.1.3": {"packets": 3, "latency_us": [10.0, 30.0, 20.0]},
                      "udp 10.0.9.9": {"packets": 99, "latency_us": []}}}
    row = _flow_figures(Flow("noisy", "nb1", "nb2"), _as(FlowsSent, {"sent": 4}),
                        _as(FlowsReceived, recv), "10.0.1.3")
    assert (row["sent"], row["received"], row["latency_us_p50"]) == (4, 3, 20.0)
    # a receiver that heard nothing of the sender's flow counts none of it
    row = _flow_figures(Flow("noisy", "nb1", "nb2"), None, FlowsReceived(), "10.0.1.3")
    assert (row["sent"], row["received"], row["latency_us_p50"]) == (None, 0, None)

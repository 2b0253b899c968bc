from testbed.agents import agent_configs, expected_duration_s, step_timeout_s
from testbed.config import Scenario
from testbed.topology import FabricPlan
from traffic.agent import qp_number


def test_one_config_per_gpu_with_all_peers():
    s = Scenario.from_dict({})
    plan = FabricPlan(2, 4, 2)
    cfgs = agent_configs(plan, s, "/tmp/x")
    assert [c["host"] for c in cfgs] == [h.name for h in plan.hosts]
    c = cfgs[2]
    assert (c["rank"], c["ip"], c["intf"], c["ranks"]) == (2, "10.0.2.1", "gpu3-eth0", 8)
    assert len(c["peers"]) == 7 and all(p["rank"] != 2 for p in c["peers"])
    assert c["size"] == 1 << 20 and c["mtu"] == 4096 and c["out_dir"] == "/tmp/x"


def test_timeouts_scale_with_the_link_rate():
    fast = Scenario.from_dict({"topology": {"host_rate_mbit": 1000, "fabric_rate_mbit": 1000}})
    slow = Scenario.from_dict({"topology": {"host_rate_mbit": 1, "fabric_rate_mbit": 1}})
    assert step_timeout_s(fast) == 0.5
    assert step_timeout_s(slow) > 20 * (1 << 20) / 8 * 8 / 1e6
    assert step_timeout_s(Scenario.from_dict({"workload": {"step_timeout_ms": 250}})) == 0.25
    assert expected_duration_s(slow) > expected_duration_s(fast)


def test_qp_numbers_are_unique_per_direction():
    qps = {qp_number(a, b) for a in range(16) for b in range(16) if a != b}
    assert len(qps) == 16 * 15 and all(q < 1 << 24 for q in qps)

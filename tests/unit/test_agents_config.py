import dataclasses
import json

import pytest

from testbed.run.agent_processes import agent_configs as typed_agent_configs
from testbed.run.agent_processes import expected_duration_s, finish_timeout_s
from testbed.run.agent_processes import transport_config as typed_transport_config
from testbed.scenario.config import Scenario
from testbed.base.topology import FabricPlan
from traffic.rnic import qp_number

from .decided import decided

PLAN = FabricPlan(2, 4, 2)


def wire(contract):
    """A contract as the agent process receives it (JSON)."""
    return json.loads(json.dumps(dataclasses.asdict(contract)))


def agent_configs(*args):
    return [wire(c) for c in typed_agent_configs(*args)]


def transport_config(*args):
    return wire(typed_transport_config(*args))


def test_one_config_per_gpu_with_all_peers():
    s = Scenario.from_dict({}).for_checks()
    cfgs = agent_configs(decided("hyperscale", PLAN, s), "/tmp/x")
    assert [c["host"] for c in cfgs] == [h.name for h in PLAN.hosts]
    c = cfgs[2]
    assert (c["rank"], c["ip"], c["intf"], c["ranks"]) == (2, "10.0.2.1", "gpu3-eth0", 8)
    assert len(c["peers"]) == 7 and all(p["rank"] != 2 for p in c["peers"])
    assert c["workloads"] == [{"collective": "ring", "size": 1 << 20, "iterations": 10,
                               "chunks": 4, "group": 2, "pxn": False}]
    assert c["mtu"] == 4096 and c["out_dir"] == "/tmp/x"
    assert c["compute"] == {"ns": 0, "jitter_ns": 0} and c["straggler"] is None
    assert c["link_rate_bps"] == 40e6


def test_congestion_control_follows_the_policy_unless_the_scenario_says_otherwise():
    s = Scenario.from_dict({}).for_checks()
    assert transport_config(decided("lossless", PLAN, s))["congestion_control"] == "dcqcn"
    assert transport_config(decided("hyperscale", PLAN, s))["congestion_control"] == "dcqcn"
    assert transport_config(decided("enterprise", PLAN, s))["congestion_control"] == "none"
    # the bare hyperscale variant marks nothing, so its senders run nothing
    bare = Scenario.from_dict({"policy_params": {"hyperscale": {"ecn": "off"}}}).for_checks()
    assert transport_config(decided("hyperscale", PLAN, bare))["congestion_control"] == "none"
    forced = Scenario.from_dict({"transport": {"congestion_control": "none"}}).for_checks()
    assert transport_config(decided("lossless", PLAN, forced))[
        "congestion_control"] == "none"


def test_dcqcn_senders_get_rate_limiters_in_the_roce_class():
    s = Scenario.from_dict({}).for_checks()
    lossless = decided("lossless", PLAN, s)
    lim = transport_config(lossless)["qp_limiter"]
    roce = next(c for c in lossless.policy.traffic_classes() if 26 in c.dscp)
    assert lim == {"major": roce.minor, "open_bytes": 50_000_000, "burst": 210,
                   "quantum": 4210}
    assert transport_config(decided("enterprise", PLAN, s))["qp_limiter"] is None


def test_transport_settings_in_emulated_units():
    # modelled time x the time scale (2,500x at the reference 40 Mbit/s)
    s = Scenario.from_dict({"transport": {"rto_us": 40, "entropy": "per-packet",
                                          "qps_per_peer": 4}}).for_checks()
    t = transport_config(decided("lossless", PLAN, s))
    assert t["rto_ns"] == 100_000_000
    # the local ACK timeout: 4.096 us x 2^20 modelled (NCCL's default), x 2,500
    assert t["ack_timeout_ns"] == round(4.096 * 2**20 * 2500 * 1000) and t["retry_limit"] == 7
    assert t["reorder_ns"] == 50_000_000 and t["qps_per_peer"] == 4
    assert t["roce_tos"] == (26 << 2) | 2 and t["ack_tos"] == 26 << 2 and t["cnp_tos"] == 48 << 2
    assert t["dcqcn_timer_ns"] == 20_000_000 and t["cnp_interval_ns"] == 20_000_000


def test_responders_wait_for_reordered_packets_where_the_fabric_may_reorder():
    """Adaptive routing (lossless) may move a running flowlet, spraying moves every packet:
    their RNICs place packets ahead of a gap for half the timeout; a fabric that keeps a QP
    on one path NAKs a gap at once."""
    s = Scenario.from_dict({}).for_checks()
    lossless = transport_config(decided("lossless", PLAN, s))
    assert lossless["reorder_ns"] == lossless["rto_ns"] // 2 > 0
    for name in ("enterprise", "hyperscale"):
        assert transport_config(decided(name, PLAN, s))["reorder_ns"] == 0, name
    fixed = s.override({"policy_params": {"lossless": {"adaptive_routing": False}}})
    assert transport_config(decided("lossless", PLAN, fixed))["reorder_ns"] == 0
    sprayed = s.override({"transport": {"entropy": "per-packet"}})
    assert transport_config(decided("hyperscale", PLAN, sprayed))["reorder_ns"] > 0


def test_lossless_senders_mark_flowlets_after_the_gap_in_modelled_time():
    """Adaptive routing's flowlets start where a QP idled ``flowlet_gap_us`` (modelled: 16 us
    x 2,500 at the reference rate); a fabric that keeps a QP's path, spraying and a gap of 0
    leave the port alone."""
    s = Scenario.from_dict({}).for_checks()
    assert transport_config(decided("lossless", PLAN, s))["flowlet_gap_ns"] == 40_000_000
    for name in ("enterprise", "hyperscale"):
        assert transport_config(decided(name, PLAN, s))["flowlet_gap_ns"] == 0, name
    for change in ({"policy_params": {"lossless": {"adaptive_routing": False}}},
                   {"policy_params": {"lossless": {"flowlet_gap_us": 0}}},
                   {"transport": {"entropy": "per-packet"}}):
        assert transport_config(decided("lossless", PLAN, s.override(change)))[
            "flowlet_gap_ns"] == 0, change


def test_expected_duration_grows_as_links_slow_down():
    fast = Scenario.from_dict({"topology": {"host_rate_mbit": 1000}})
    slow = Scenario.from_dict({"topology": {"host_rate_mbit": 1}})
    assert expected_duration_s(slow) > 100 * expected_duration_s(fast)


def test_qp_numbers_are_unique_per_host_and_match_across_the_connection():
    q = 4
    for local in range(8):
        mine = {qp_number(local, r, i, q) for r in range(8) if r != local for i in range(q)}
        assert len(mine) == 7 * q and min(mine) >= 0x100 and max(mine) < 1 << 24


def test_a_sweep_gives_one_workload_per_size_and_stragglers_get_their_delay():
    s = Scenario.from_dict({"workload": {"sizes": [65536, 131072], "iterations": 3,
                                         "collective": "double_binary_tree",
                                         "compute_us": 0.8, "compute_jitter_us": 0.2,
                                         "stragglers": {"ranks": [3], "delay_us": 2}}}).for_checks()
    cfgs = agent_configs(decided("hyperscale", PLAN, s), "/tmp/x")
    assert [w["size"] for w in cfgs[0]["workloads"]] == [65536, 131072]
    assert {w["collective"] for w in cfgs[0]["workloads"]} == {"double_binary_tree"}
    assert cfgs[0]["compute"] == {"ns": 2_000_000, "jitter_ns": 500_000}
    assert cfgs[3]["straggler"] == {"delay_ns": 5_000_000, "distribution": "fixed",
                                    "probability": 1.0}
    assert [c["straggler"] is None for c in cfgs].count(False) == 1


def test_neighbour_hosts_get_no_agent():
    plan = FabricPlan(2, 2, 2, neighbours_per_leaf=1)
    s = Scenario.from_dict({"topology": {"leaves": 2, "neighbours_per_leaf": 1}}).for_checks()
    cfgs = agent_configs(decided("hyperscale", plan, s), "/tmp/x")
    assert [c["host"] for c in cfgs] == ["gpu1", "gpu2", "gpu3", "gpu4"]
    assert all(len(c["peers"]) == 3 for c in cfgs)


def test_the_agents_report_a_stall_before_the_runner_stops_waiting():
    from testbed.run.agent_processes import patience_s

    run = decided("hyperscale", PLAN, Scenario.from_dict({}).for_checks())
    patience = patience_s(run)
    assert patience == 30 + 10 * expected_duration_s(run.scenario)
    assert transport_config(run)["stall_ns"] == int(patience * 1e9)
    # a stall may start as the replay ends: the runner waits for both, and a margin
    assert finish_timeout_s(run) >= 2 * patience + 30


def test_the_retry_budget_is_a_real_rnics_and_a_run_says_when_it_cannot_reach_it():
    from testbed.run.agent_processes import budget_text, retry_budget

    run = decided("hyperscale", PLAN, Scenario.from_dict({}).for_checks())
    budget = retry_budget(run)
    # NCCL 2.23+: 4.096 us x 2^20 = 4.29 s per local ACK timeout, 7 of them (about 30 s)
    assert budget["ack_timeout_us"] == pytest.approx(4_294_967.296)
    assert budget["budget_us"] == pytest.approx(7 * 4_294_967.296)
    assert budget["budget_emulated_s"] == pytest.approx(7 * 4.294967296 * 2500)  # 40 Mbit/s
    assert not budget["reachable"] and budget["stall_limit_us"] < budget["budget_us"]
    text = budget_text(budget)
    assert text.startswith("retry budget: a QP errors after 30.1 s without progress (7 x the "
                           "4.29 s local ACK timeout, modelled) - 20.9 h here"), text
    assert "reported as stalled, its outcome unknown" in text
    short = decided("hyperscale", PLAN, Scenario.from_dict(
        {"transport": {"ib_timeout": 8, "retry_limit": 3}}).for_checks())
    budget = retry_budget(short)
    assert budget["reachable"] and budget["stall_limit_us"] == budget["budget_us"]
    assert budget_text(budget).endswith("modelled)")


def test_the_rto_is_the_policy_s_unless_the_scenario_gives_one():
    auto = Scenario.from_dict({}).for_checks()
    assert decided("lossless", PLAN, auto).rto_us == 1000.0  # outwaits PFC, drops nothing
    assert decided("hyperscale", PLAN, auto).rto_us == 100.0
    assert decided("enterprise", PLAN, auto).rto_us == 100.0
    given = Scenario.from_dict({"transport": {"rto_us": 250}}).for_checks()
    assert decided("lossless", PLAN, given).rto_us == 250.0
    run = decided("lossless", PLAN, auto)
    assert transport_config(run)["rto_ns"] == auto.emulated_ns(1000.0)
    # 4 MB buffers on 50 Gbit/s uplinks: 640 us to drain one, the frame's and its ACK's way
    deep = Scenario.from_dict({"topology": {"oversubscription": 2}, "policy_params": {
        "enterprise": {"buffer_bytes": 4_000_000}}}).for_checks()
    assert decided("enterprise", PLAN, deep).rto_us == 1280.0
    assert decided("hyperscale", PLAN, deep).rto_us == 100.0  # 96 KB: 15 us to drain


def test_gpus_go_to_a_few_processes_per_server_in_rank_order():
    from testbed.run.agent_processes import process_groups
    hosts = [f"gpu{i}" for i in range(1, 9)]
    assert process_groups(hosts, {}, 2) == [("localhost", hosts[:4]), ("localhost", hosts[4:])]
    assert process_groups(hosts[:3], {}, 2) == [("localhost", ["gpu1", "gpu2"]),
                                                ("localhost", ["gpu3"])]
    assert process_groups(hosts[:2], {}, 8) == [("localhost", ["gpu1"]), ("localhost", ["gpu2"])]
    split = {h: ("localhost" if i < 4 else "10.9.0.2") for i, h in enumerate(hosts)}
    groups = process_groups(hosts, split, 1)
    assert groups == [("localhost", hosts[:4]), ("10.9.0.2", hosts[4:])]


def test_each_peer_carries_what_the_rnic_holds_its_frames_for():
    """nic: the whole fixed path (sender's link and switch ports); netem: the sender's link
    (the switch ports are netem's); off: nothing and no delay line."""
    from testbed.base.hops import fixed_path_us

    from .decided import CAPS

    def peers(setting, netem=False):
        s = Scenario.from_dict({"emulation": {"path_delay": setting}}).for_checks()
        caps = dataclasses.replace(CAPS, qdiscs={"red": False, "netem": netem})
        run = decided("lossless", PLAN, s, caps)
        c = agent_configs(run, "/tmp/x")[0]  # rank 0 on leaf 1; rank 1 there too
        return c["delay_line"], {p["rank"]: p["delay_ns"] for p in c["peers"]}, run
    line, d, run = peers("nic")
    delays = run.path_delay.delays_us
    assert line and d[1] == round(fixed_path_us(delays, True) * 1000)
    assert d[2] == round(fixed_path_us(delays, False) * 1000) > d[1] > 0
    line, d, _ = peers("netem", netem=True)
    assert line and d[1] == d[2] == round(delays["gpu_nic"] * 1000)
    line, d, _ = peers("off")
    assert not line and set(d.values()) == {0}


def test_agent_processes_never_split_a_server():
    from testbed.run.agent_processes import process_groups
    hosts = [f"gpu{i}" for i in range(1, 9)]
    servers = {h: i // 4 for i, h in enumerate(hosts)}
    assert process_groups(hosts, {}, 2, servers) == [("localhost", hosts[:4]),
                                                     ("localhost", hosts[4:])]
    servers = {h: i // 3 for i, h in enumerate(hosts)}  # servers of 3: 3, 3, 2
    groups = process_groups(hosts, {}, 2, servers)
    assert [len(g) for _, g in groups] == [6, 2]
    assert process_groups(hosts, {}, 4, {h: 0 for h in hosts}) == [("localhost", hosts)]


def test_a_server_s_gpus_know_each_other_and_their_scale_up_link():
    s = Scenario.from_dict({"topology": {"gpus_per_server": 2}}).for_checks()
    plan = FabricPlan.for_topology(s.topology)
    cfgs = agent_configs(decided("hyperscale", plan, s), "/tmp/x")
    assert [c["server"] for c in cfgs[:4]] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    su = cfgs[0]["scale_up"]
    assert su["ns_per_byte"] == s.time_scale / 400  # 400 GB/s modelled
    assert su["latency_ns"] == s.emulated_ns(0.936)
    assert cfgs[0]["workloads"][0]["group"] == 2  # hierarchical: over the servers
    plain = agent_configs(decided("hyperscale", PLAN, Scenario.from_dict({}).for_checks()), "/x")
    assert plain[0]["server"] == [] and plain[0]["scale_up"] is None


def test_a_job_s_byte_scale_shrinks_the_modelled_scale_up_latency_too():
    from testbed.run.agent_processes import job_config
    s = Scenario.from_dict({"topology": {"gpus_per_server": 2}, "workload": {"job": {
        "model": "dense-7b", "layers": 2, "tp": 2, "byte_scale": 100}}}).for_checks()
    run = decided("hyperscale", FabricPlan.for_topology(s.topology), s)
    su = typed_agent_configs(run, "/x")[0].scale_up
    assert su.latency_ns == s.emulated_ns(0.936 / 100)
    job = job_config(run)
    assert job.iterations == s.workload.iterations and job.graph.ranks == 8
    compute = [op.ns for op in job.graph.programs[0] if op.kind == "compute"]
    assert compute[1] == round(run.job.graph.programs[0][1].ns * s.time_scale)  # emulated

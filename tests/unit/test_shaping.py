import pytest

from controllers.classes import EcnRule, PfcRule, TrafficClass
from controllers.enterprise import EnterprisePolicy
from testbed.scenario.config import TopologyConfig
from testbed.fabric.network import egress_shapes
from testbed.base.errors import ConfigError
from testbed.fabric.shaping import Shape, gate_params, red_qdisc, tc_commands
from testbed.plan.marking import marking_method
from testbed.base.topology import FabricPlan

ONE = (TrafficClass("all", 0, 0, (), 64000),)
TWO = (TrafficClass("interactive", 0, 0, (46,), 32000),
       TrafficClass("best-effort", 1, 1, (), 128000))


def test_single_class_htb_rate_and_bfifo_buffer():
    cmds = tc_commands("lf1-eth3", Shape(40, ONE), netem=False, mtu=4196)
    assert cmds[0] == "tc qdisc replace dev lf1-eth3 root handle 1: htb default 10"
    assert "rate 40000kbit ceil 40000kbit" in cmds[1]
    assert "classid 1:10 htb rate 8bit ceil 40000000bit" in cmds[2]
    assert "quantum 4210 prio 0" in cmds[2]
    assert cmds[3].endswith("parent 1:10 handle 10: pfifo_head_drop limit 15")  # 64000 / 4210
    assert not any("netem" in c or "filter" in c for c in cmds)


def test_priority_classes_get_dscp_filters_and_all_borrow_the_link():
    cmds = tc_commands("x", Shape(40, TWO), netem=False, mtu=1500)
    assert "htb default 11" in cmds[0]
    top = next(c for c in cmds if "classid 1:10 " in c)
    low = next(c for c in cmds if "classid 1:11 " in c)
    # no class has a rate of its own (HTB would send it without asking 1:1, the link)
    assert "rate 8bit ceil 40000000bit burst 1 " in top and "prio 0" in top
    assert "rate 8bit ceil 40000000bit burst 1 " in low and "prio 1" in low
    assert "match ip dsfield 0xb8 0xfc flowid 1:10" in cmds[-1] or any(
        "match ip dsfield 0xb8 0xfc flowid 1:10" in c for c in cmds)


def test_lossless_class_gets_a_pfc_gate_above_its_buffer():
    roce = TrafficClass("roce", 1, 1, (26,), 100000, pfc=PfcRule(48000, 24000))
    cmds = tc_commands("x", Shape(40, (TrafficClass("cnp", 0, 0, (48,), 1000), roce,
                                       TrafficClass("o", 2, 2, (), 1000))),
                       netem=False, mtu=4196)
    gate = next(c for c in cmds if "tbf" in c)
    assert "parent 1:11 handle 51: tbf rate 400000000bit burst 8420 limit 100000" in gate
    assert any("parent 51:1 handle 11: bfifo limit 100000" in c for c in cmds)
    paused = gate_params(40, 4196, 100000, paused=True)
    assert (paused.rate_bytes, paused.burst) == (1, 4210)


def test_a_dcqcn_nic_holds_qp_limiters_under_its_roce_class_gate():
    roce = TrafficClass("roce", 1, 1, (26,), 100000, pfc=PfcRule(48000, 24000))
    classes = (TrafficClass("cnp", 0, 0, (48,), 1000), roce, TrafficClass("o", 2, 2, (), 1000))
    nic = Shape(40, classes, nic_queue_bytes=256000, qp_limiters=roce.minor)
    cmds = tc_commands("x", nic, netem=False, mtu=4196)
    assert "tc qdisc replace dev x parent 51:1 handle 11: htb default 1" in cmds
    open_class = next(c for c in cmds if "classid 11:1 " in c)
    assert "rate 400000000bit ceil 400000000bit burst 210 cburst 210 quantum 4210" in open_class
    assert "tc qdisc replace dev x parent 11:1 handle 71: bfifo limit 256000" in cmds
    # the other classes, and the same class on a switch port, keep their plain buffer
    assert any(c.endswith("handle 10: bfifo limit 256000") for c in cmds)
    switch = tc_commands("x", Shape(40, classes, qp_limiters=roce.minor), netem=False,
                         mtu=4196)
    assert not any(c.endswith("htb default 1") for c in switch)


def test_netem_only_when_the_kernel_has_it():
    with_delay = Shape(40, ONE, delay_us=50)
    assert not any("netem" in c for c in tc_commands("x", with_delay, netem=False))
    cmds = tc_commands("x", with_delay, netem=True)
    assert any("handle 30: netem delay 50us" in c for c in cmds)
    assert cmds[-1].endswith("parent 30:1 handle 10: pfifo_head_drop limit 42")  # 1514-B frames
    assert any("netem delay 0.125us" in c
               for c in tc_commands("x", Shape(40, ONE, delay_us=0.125), netem=True))


def test_every_switch_port_and_nic_is_shaped():
    plan = FabricPlan(2, 4, 2)
    topo = TopologyConfig(host_rate_mbit=10, fabric_rate_mbit=20, nic_queue_bytes=9000)
    classes = EnterprisePolicy(plan).traffic_classes()
    shapes = egress_shapes(plan, topo, classes)
    assert set(shapes) == set(plan.interface_names())
    assert shapes["gpu1-eth0"].rate_mbit == 10 and shapes["gpu1-eth0"].buffer(classes[1]) == 9000
    assert shapes["lf1-eth1"].buffer(classes[1]) == 192000
    assert shapes["lf1-eth3"].rate_mbit == shapes["sp1-eth1"].rate_mbit == 20


def test_switch_lossy_classes_drop_oldest_frames_but_nics_keep_byte_fifos():
    switch = tc_commands("lf1-eth1", Shape(40, TWO), netem=False, mtu=4196)
    nic = tc_commands("gpu1-eth0", Shape(40, TWO, nic_queue_bytes=256000), netem=False,
                      mtu=4196)
    assert any("handle 11: pfifo_head_drop limit 30" in c for c in switch)  # 128000 / 4210
    assert any("handle 11: bfifo limit 256000" in c for c in nic)


def test_switch_ports_get_the_rate_headroom_and_nics_do_not():
    plan = FabricPlan(2, 4, 2)
    topo = TopologyConfig(host_rate_mbit=40, fabric_rate_mbit=20)
    classes = EnterprisePolicy(plan).traffic_classes()
    shapes = egress_shapes(plan, topo, classes, headroom=0.02)
    assert shapes["gpu1-eth0"].rate_mbit == 40
    assert shapes["lf1-eth1"].rate_mbit == pytest.approx(40.8)
    assert shapes["lf1-eth3"].rate_mbit == shapes["sp1-eth1"].rate_mbit == pytest.approx(20.4)


def test_htb_burst_is_one_frame_or_250_us_of_the_rate():
    from testbed.fabric.shaping import burst_bytes
    assert burst_bytes(40, 4096) == 4110  # 4096 + 14
    assert burst_bytes(1000, 4096) == 31250  # 250 us at 1 Gbit/s


def test_a_gpu_nic_runs_ahead_of_an_ideal_link_by_a_twentieth_of_a_frame_at_most():
    from testbed.fabric.shaping import burst_bytes
    assert burst_bytes(40, 4096, nic=True) == burst_bytes(1000, 4096, nic=True) == 205
    nic = tc_commands("gpu1-eth0", Shape(40, TWO, nic_queue_bytes=256000), netem=False,
                      mtu=4096)
    switch = tc_commands("lf1-eth1", Shape(40, TWO), netem=False, mtu=4096)
    link, *classes = [c for c in nic if " htb rate " in c]
    assert "burst 205 cburst 205 " in link
    assert len(classes) == 2 and all("burst 1 cburst 205 " in c for c in classes)
    link, *classes = [c for c in switch if " htb rate " in c]
    assert "burst 4110 cburst 4110 " in link
    assert all("burst 1 cburst 4110 " in c for c in classes)


def test_an_ecn_class_gets_a_red_buffer_where_asked():
    rule = EcnRule("red", 32_000, 96_000, 0.2)
    cls = (TrafficClass("roce", 0, 0, (), 200_000, ecn=rule, pfc=PfcRule(128_000, 96_000)),)
    cmds = tc_commands("x", Shape(40, cls, red=True), netem=False, mtu=4110)
    leaf = cmds[-1]
    assert ("parent 50:1 handle 10: red limit 200000 min 32000 max 96000 avpkt 4124 burst 8 "
            "probability 0.2 bandwidth 40000kbit ecn nodrop") in leaf
    # without red: the bfifo
    assert "bfifo limit 200000" in tc_commands("x", Shape(40, cls), netem=False, mtu=4110)[-1]
    # a step rule: marks everything ECT one frame above K
    step = red_qdisc(EcnRule("step", 32_000), 96_000, 40, 1500)
    assert "min 32000 max 33514 avpkt 1514" in step and "probability 1 " in step


def test_marking_method_uses_red_only_where_it_can():
    lossless = (TrafficClass("roce", 0, 0, (), 1, ecn=EcnRule("red", 1, 2),
                             pfc=PfcRule(2, 1)),)
    lossy = (TrafficClass("be", 0, 0, (), 1, ecn=EcnRule("step", 1)),)
    plain = (TrafficClass("be", 0, 0, (), 1),)
    assert marking_method("auto", True, lossless, "user") == "red"
    assert marking_method("auto", False, lossless, "kernel") == "sampled"
    assert marking_method("auto", True, lossy, "user") == "sampled"  # tail drop: not here
    assert marking_method("auto", True, lossy, "kernel") == "red"
    assert marking_method("sampled", True, lossless, "kernel") == "sampled"
    assert marking_method("auto", True, plain, "kernel") is None
    with pytest.raises(ConfigError, match="no RED qdisc"):
        marking_method("red", False, lossless, "kernel")
    with pytest.raises(ConfigError, match="userspace datapath"):
        marking_method("red", True, lossy, "user")


def test_the_emulators_resume_kick_goes_to_the_highest_priority_class():
    cmds = tc_commands("x", Shape(40, TWO), netem=False, mtu=1500)
    assert cmds[-1] == ("tc filter add dev x parent 1: protocol 0x88b5 prio 2 u32 "
                        "match u32 0 0 flowid 1:10")

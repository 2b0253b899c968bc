from testbed.config import TopologyConfig
from testbed.fabric import egress_shapes
from testbed.shaping import Shape, delay_applied, tc_commands
from testbed.topology import FabricPlan


def test_htb_rate_and_bfifo_buffer():
    cmds = tc_commands("lf1-eth3", Shape(40, 64000), netem=False, mtu=4200)
    assert cmds[0] == "tc qdisc replace dev lf1-eth3 root handle 1: htb default 1"
    assert "rate 40000kbit ceil 40000kbit" in cmds[1] and "quantum 4214" in cmds[1]
    assert cmds[2].endswith("handle 10: bfifo limit 64000")
    assert not any("netem" in c for c in cmds)


def test_netem_only_when_the_kernel_has_it():
    with_delay = Shape(40, 64000, delay_us=50)
    assert not any("netem" in c for c in tc_commands("x", with_delay, netem=False))
    cmds = tc_commands("x", with_delay, netem=True)
    assert "netem delay 50us" in cmds[2] and cmds[3].endswith("bfifo limit 64000")
    assert delay_applied(with_delay, netem=False) is None  # asked for, not possible: say so
    assert delay_applied(with_delay, netem=True) == 50
    assert delay_applied(Shape(40, 64000), netem=False) == 0.0


def test_every_switch_port_and_nic_is_shaped():
    plan = FabricPlan(2, 4, 2)
    topo = TopologyConfig(host_rate_mbit=10, fabric_rate_mbit=20, switch_buffer_bytes=5000,
                          nic_queue_bytes=9000)
    shapes = egress_shapes(plan, topo)
    assert set(shapes) == set(plan.interface_names())
    assert shapes["gpu1-eth0"] == Shape(10, 9000)
    assert shapes["lf1-eth1"] == Shape(10, 5000)
    assert shapes["lf1-eth3"] == shapes["sp1-eth1"] == Shape(20, 5000)

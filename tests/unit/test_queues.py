import json

from testbed.queues import parse_tc_json, queue_drops, spine_load
from testbed.topology import FabricPlan


def _q(dev, packets, drops, kind="bfifo"):
    return {"kind": kind, "dev": dev, "handle": "10:", "packets": packets, "bytes": packets * 100,
            "drops": drops, "backlog": 0, "options": {"limit": 64000}}


def test_parse_keeps_the_bfifo_buffer_of_each_interface():
    text = json.dumps([_q("lf1-eth1", 5, 0, kind="htb"), _q("lf1-eth1", 7, 1), _q("lo", 1, 0,
                                                                                  kind="noqueue")])
    one = {"packets": 7, "bytes": 700, "drops": 1, "backlog": 0, "marked": 0}
    assert parse_tc_json(text) == {"lf1-eth1": dict(one, classes={"10:": one})}
    assert parse_tc_json("") == {}


def test_a_red_buffer_counts_its_marks_and_its_inner_fifo_is_not_counted_again():
    red = dict(_q("lf1-eth3", 9, 0, kind="red"), handle="11:", marked=4)
    inner = dict(_q("lf1-eth3", 9, 0), handle="0:", parent="11:1")
    other = dict(_q("lf1-eth3", 2, 0), handle="10:", parent="1:10")
    got = parse_tc_json(json.dumps([red, inner, other]))["lf1-eth3"]
    assert (got["packets"], got["marked"]) == (11, 4) and set(got["classes"]) == {"11:", "10:"}


def test_class_buffers_of_one_port_add_up():
    a, b = _q("sp1-eth1", 10, 1), dict(_q("sp1-eth1", 5, 2), handle="11:")
    got = parse_tc_json(json.dumps([a, b]))["sp1-eth1"]
    assert (got["packets"], got["drops"]) == (15, 3) and set(got["classes"]) == {"10:", "11:"}


def test_spine_load_and_drop_accounting():
    plan = FabricPlan(2, 2, 1)
    stats = parse_tc_json(json.dumps([
        _q("sp1-eth1", 10, 0), _q("sp1-eth2", 5, 0), _q("sp2-eth1", 1, 2),
        _q("lf1-eth1", 30, 3), _q("gpu1-eth0", 40, 4)]))
    assert spine_load(plan, stats) == {"sp1": 15, "sp2": 1}
    switch, nic, per_port = queue_drops(plan, stats)
    assert (switch, nic) == (5, 4)
    assert per_port == {"gpu1-eth0": 4, "lf1-eth1": 3, "sp2-eth1": 2}

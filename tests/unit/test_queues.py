import json

import pytest

from testbed.fabric import queues
from testbed.fabric.queues import drain, parse_tc_json, queue_drops, queued_frames, spine_load
from testbed.base.topology import FabricPlan


def _q(dev, packets, drops, kind="bfifo"):
    return {"kind": kind, "dev": dev, "handle": "10:", "packets": packets, "bytes": packets * 100,
            "drops": drops, "backlog": 0, "options": {"limit": 64000}}


def test_parse_keeps_the_bfifo_buffer_of_each_interface():
    text = json.dumps([_q("lf1-eth1", 5, 0, kind="htb"), _q("lf1-eth1", 7, 1), _q("lo", 1, 0,
                                                                                  kind="noqueue")])
    one = {"packets": 7, "bytes": 700, "drops": 1, "backlog": 0, "marked": 0}
    assert parse_tc_json(text) == {"lf1-eth1": dict(one, queued=0, classes={"10:": one})}
    assert parse_tc_json("") == {}


def _nic_tree(queued_in_limiters: int, queued_in_fifo: int):
    """A GPU NIC under DCQCN as ``tc -s -j qdisc show`` lists it: the root HTB counts every
    frame of its tree; the per-QP limiters' default FIFOs are not listed."""
    total = queued_in_limiters + queued_in_fifo
    return [dict(_q("gpu1-eth0", 50, 0, kind="htb"), handle="1:", root=True, qlen=total),
            dict(_q("gpu1-eth0", 40, 0, kind="htb"), handle="20:", parent="1:20", qlen=total),
            dict(_q("gpu1-eth0", 30, 0), handle="120:", parent="20:ff", qlen=queued_in_fifo)]


def test_frames_queued_are_the_root_qdiscs_length_limiters_included():
    stats = parse_tc_json(json.dumps(_nic_tree(3, 2) + [
        dict(_q("lf1-eth1", 7, 0, kind="htb"), handle="1:", root=True, qlen=1),
        dict(_q("lf1-eth1", 7, 0), parent="1:10", qlen=1)]))
    assert stats["gpu1-eth0"]["queued"] == 5 and stats["gpu1-eth0"]["packets"] == 30
    assert queued_frames(stats) == 6


class _Fabric:
    """Answers each stats dump with the next of ``lengths`` (frames queued in one NIC)."""

    def __init__(self, lengths):
        self.lengths = list(lengths)
        self.plan = FabricPlan(1, 1, 1)

    def nodes_for_stats(self):
        return ["gpu1"]

    def run(self, node, cmd, check=True):
        n = self.lengths.pop(0) if len(self.lengths) > 1 else self.lengths[0]
        return json.dumps(_nic_tree(n, 0))


@pytest.fixture
def no_wait(monkeypatch):
    monkeypatch.setattr(queues.time, "sleep", lambda s: None)


def test_drain_reads_until_the_fabric_is_empty_and_says_so(no_wait):
    said = []
    fabric = _Fabric([4, 2, 0, 9])
    assert queued_frames(drain(fabric, 60.0, said.append)) == 0
    assert fabric.lengths == [9] and len(said) == 1 and "4 frames" in said[0]


def test_drain_gives_up_after_its_limit_with_what_is_left(no_wait, monkeypatch):
    clock = iter(range(0, 1000, 1))
    monkeypatch.setattr(queues.time, "monotonic", lambda: next(clock))
    assert queued_frames(drain(_Fabric([3]), 5.0, lambda s: None)) == 3


def test_an_empty_fabric_is_read_once_and_nothing_is_said(no_wait):
    said, fabric = [], _Fabric([0, 7])
    assert queued_frames(drain(fabric, 60.0, said.append)) == 0 and said == [] \
        and fabric.lengths == [7]


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

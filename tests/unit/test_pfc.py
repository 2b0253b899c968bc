from controllers.classes import CreditRule, PfcRule
from testbed.switchq.pfc import PfcState, Queue, feeders
from testbed.base.topology import FabricPlan

PLAN = FabricPlan(2, 4, 2)


def names(queues):
    return sorted(q.intf for q in queues)


def test_feeders_of_a_leaf_port_towards_a_gpu_are_every_other_port():
    # lf1-eth1 leads to gpu1: fed by gpu2's NIC and both spines' ports towards lf1
    assert names(feeders(PLAN, "lf1", "lf1-eth1")) == ["gpu2-eth0", "sp1-eth1", "sp2-eth1"]


def test_feeders_of_a_leaf_uplink_are_its_gpus_only():
    assert names(feeders(PLAN, "lf1", "lf1-eth3")) == ["gpu1-eth0", "gpu2-eth0"]


def test_feeders_of_a_spine_port_are_the_other_leaves():
    assert names(feeders(PLAN, "sp2", "sp2-eth3")) == ["lf1-eth4", "lf2-eth4", "lf4-eth4"]


def test_xoff_pauses_feeders_and_xon_resumes_them_with_hysteresis():
    state = PfcState(PLAN, PfcRule(xoff=1000, xon=500))
    q = Queue("lf1", "lf1-eth1")
    pause, resume = state.update({q: 900}, 0)
    assert pause == resume == []
    pause, resume = state.update({q: 1500}, 1_000_000)
    assert names(pause) == ["gpu2-eth0", "sp1-eth1", "sp2-eth1"] and resume == []
    assert state.update({q: 700}, 2_000_000) == ([], [])  # between XON and XOFF: stays paused
    pause, resume = state.update({q: 400}, 5_000_000)
    assert pause == [] and len(resume) == 3
    report = state.report()
    assert report["sp1-eth1"] == {"node": "sp1", "events": 1, "paused_ms": 4.0}


def test_a_queue_feeding_two_congested_ports_resumes_when_both_clear():
    state = PfcState(PLAN, PfcRule(xoff=1000, xon=500))
    a, b = Queue("lf1", "lf1-eth1"), Queue("lf1", "lf1-eth3")  # both fed by gpu2
    state.update({a: 2000, b: 2000}, 0)
    gpu2 = Queue("gpu2", "gpu2-eth0")
    assert gpu2 in state.paused_since
    _, resume = state.update({a: 0, b: 2000}, 1)
    assert gpu2 not in resume  # still needed by the uplink
    _, resume = state.update({a: 0, b: 0}, 2)
    assert gpu2 in resume
    assert state.report()["gpu2-eth0"]["events"] == 1


def test_finish_closes_open_pauses():
    state = PfcState(PLAN, PfcRule(xoff=10, xon=5))
    state.update({Queue("sp1", "sp1-eth1"): 100}, 0)
    state.finish(3_000_000)
    assert state.report()["lf2-eth3"]["paused_ms"] == 3.0


def test_each_gpu_nic_s_pauses_are_kept_as_spans_in_time_order():
    state = PfcState(PLAN, PfcRule(xoff=1000, xon=500))
    q = Queue("lf1", "lf1-eth1")  # fed by gpu2's NIC and two spine ports
    for t, backlog in [(0, 1500), (10, 400), (20, 1500), (30, 900)]:
        state.update({q: backlog}, t)
    state.finish(45)
    assert state.spans_of({"gpu2"}) == {"gpu2": [(0, 10), (20, 45)]}
    assert state.spans_of({"gpu1"}) == {}  # never paused


def test_credits_stop_feeders_above_the_limit_and_let_them_go_at_once_below():
    state = PfcState(PLAN, CreditRule(limit=1000, buffer=1500))
    q = Queue("lf1", "lf1-eth1")
    pause, _ = state.update({q: 1200}, 0)
    assert names(pause) == ["gpu2-eth0", "sp1-eth1", "sp2-eth1"]
    assert state.update({q: 1001}, 1_000_000) == ([], [])
    pause, resume = state.update({q: 1000}, 2_000_000)  # room again: no hysteresis
    assert pause == [] and len(resume) == 3
    assert state.report()["sp1-eth1"] == {"node": "sp1", "waits": 1, "waited_ms": 2.0}
    pause, _ = state.update({q: 1001}, 3_000_000)  # and stopped again at once
    assert len(pause) == 3


def test_pfc_holds_its_feeders_down_to_xon_where_credits_let_them_go():
    pfc, credit = PfcRule(xoff=1000, xon=500), CreditRule(limit=1000, buffer=1500)
    assert pfc.holds(700, held=True) and not pfc.holds(700, held=False)
    assert not credit.holds(700, held=True) and credit.holds(1001, held=False)
    assert pfc.threshold == credit.threshold == 1000

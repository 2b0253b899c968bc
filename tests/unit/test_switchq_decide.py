"""What the switches decide from one sample of their queues (testbed.switchq.decide, pure):
ECN marking per port, PFC pauses per lane, the load adaptive routing reads, quiet samples."""
import random

from controllers.classes import EcnRule, PfcRule, TrafficClass
from testbed.base.topology import FabricPlan
from testbed.switchq.decide import LOAD_EVERY_NS, SwitchQueues, low_water, roles

PLAN = FabricPlan(2, 2, 2)
FRAME = 4210
ROCE = TrafficClass("roce", 1, 1, (26,), 400_000, ecn=EcnRule("step", 30_000),
                    pfc=PfcRule(xoff=120_000, xon=90_000))
LOSSY = TrafficClass("roce", 1, 1, (26,), 100_000, ecn=EcnRule("step", 30_000))
OTHER = TrafficClass("other", 0, 2, (), 100_000)


def ports(plan=PLAN):
    """Every switch egress port: interface -> (switch, dpid, OpenFlow port)."""
    dpid = {s.name: s.dpid for s in plan.switches}
    out = {}
    for link in plan.links:
        for node, port, intf in ((link.node1, link.port1, link.intf1),
                                 (link.node2, link.port2, link.intf2)):
            if not plan.is_host(node):
                out[intf] = (node, dpid[node], port)
    return out


def core(classes, marking="sampled", watch=None, seed=1):
    p = ports()
    r = roles(classes, marking, bool(watch))
    return SwitchQueues(PLAN, r, p, tuple(sorted(p)), watch, FRAME,
                        low_water(r, p, 40.0, 40.0, 0.02, 500_000), random.Random(seed))


def backlogs(c, **by_port):
    return [by_port.get(intf.replace("-", "_"), 0) for intf in c.order]


def test_the_roles_follow_the_classes_and_who_marks():
    r = roles((OTHER, ROCE), "sampled", watching=False)
    assert r.marks is ROCE and r.lanes == (ROCE,) and r.data_lane is ROCE
    assert r.acting == (ROCE,)
    assert roles((OTHER, ROCE), "red", watching=False).marks is None  # the kernel marks
    lossy = roles((OTHER, LOSSY), "sampled", watching=True)
    assert lossy.lanes == () and lossy.load_class is LOSSY and lossy.acting == (LOSSY,)
    assert roles((OTHER,), None, watching=False).acting == ()


def test_a_step_rule_marks_above_k_and_stops_below_it():
    c = core((OTHER, LOSSY))
    minor = LOSSY.minor
    act = c.decide({minor: backlogs(c, lf1_eth3=40_000)}, 1_000)
    assert act.marks == (("lf1-eth3", True),) and not act.quiet
    assert c.decide({minor: backlogs(c, lf1_eth3=35_000)}, 2_000).marks == ()  # still above
    act = c.decide({minor: backlogs(c, lf1_eth3=10_000)}, 5_000)
    assert act.marks == (("lf1-eth3", False),)
    assert c.toggles == {"lf1-eth3": 2} and c.marking_ns == {"lf1-eth3": 4_000}


def test_marking_time_still_open_at_the_end_is_counted():
    c = core((OTHER, LOSSY))
    c.decide({LOSSY.minor: backlogs(c, sp1_eth1=50_000)}, 1_000)
    c.finish(11_000)
    assert c.marking_ns == {"sp1-eth1": 10_000} and not c.marking_since


def test_a_red_rule_marks_with_its_probability_drawn_each_sample():
    red = TrafficClass("roce", 1, 1, (26,), 400_000, ecn=EcnRule("red", 10_000, 30_000, 0.5))
    c = core((OTHER, red), seed=7)
    on = 0
    for k in range(400):  # half way between the thresholds: p = 0.25 per sample
        act = c.decide({red.minor: backlogs(c, lf2_eth1=20_000)}, k * 1_000)
        on += sum(1 for _intf, want in act.marks if want)
    assert 55 < on < 95  # off -> on with p 0.25, on -> off with 0.75: 0.1875 a sample, 75


def test_pfc_pauses_the_feeders_above_xoff_and_resumes_them_below_xon():
    c = core((OTHER, ROCE))
    minor = ROCE.minor
    act = c.decide({minor: backlogs(c, lf1_eth1=130_000)}, 1_000)
    ((lane, pause, resume),) = act.holds
    assert lane == minor and resume == ()
    assert sorted(q.intf for q in pause) == ["gpu2-eth0", "sp1-eth1", "sp2-eth1"]
    assert c.decide({minor: backlogs(c, lf1_eth1=100_000)}, 2_000).holds == ()  # hysteresis
    ((_, pause, resume),) = c.decide({minor: backlogs(c, lf1_eth1=50_000)}, 3_000).holds
    assert pause == () and len(resume) == 3
    assert c.pfc.report()["sp1-eth1"] == {"node": "sp1", "events": 1, "paused_ms": 0.002}


def test_a_sample_far_below_every_threshold_is_quiet_and_decides_nothing():
    c = core((OTHER, ROCE))
    assert 0 < c.low_water < ROCE.ecn.kmin
    act = c.decide({ROCE.minor: backlogs(c, lf1_eth1=c.low_water)}, 1_000)
    assert act.quiet and act.marks == () and act.holds == ()
    # just above the low water mark it is not quiet, though nothing crosses a threshold yet
    act = c.decide({ROCE.minor: backlogs(c, lf1_eth1=c.low_water + 1)}, 2_000)
    assert not act.quiet and act.marks == () and act.holds == ()
    # while a port marks, no sample is quiet (its marking must be able to stop)
    c.decide({ROCE.minor: backlogs(c, lf1_eth1=40_000)}, 3_000)
    assert not c.decide({ROCE.minor: backlogs(c)}, 4_000).quiet


def test_nothing_acting_has_no_low_water_mark():
    r = roles((OTHER,), None, watching=False)
    assert low_water(r, ports(), 40.0, 40.0, 0.02, 1_000_000) == -1


def test_the_load_goes_out_when_it_changed_by_a_frame_and_not_too_often():
    lf1 = next(s.dpid for s in PLAN.switches if s.name == "lf1")
    c = core((OTHER, LOSSY), watch={lf1: [3, 4]})
    minor = LOSSY.minor
    first = c.decide({minor: backlogs(c, lf1_eth3=5_000)}, LOAD_EVERY_NS).load
    assert first == {lf1: {3: 5_000, 4: 0}}
    later = LOAD_EVERY_NS + LOAD_EVERY_NS // 2  # too soon: nothing, whatever changed
    assert c.decide({minor: backlogs(c, lf1_eth3=50_000)}, later).load is None
    now = 2 * LOAD_EVERY_NS + 1
    assert c.decide({minor: backlogs(c, lf1_eth3=5_000 + FRAME - 1)}, now).load is None
    now += LOAD_EVERY_NS
    assert c.decide({minor: backlogs(c, lf1_eth3=5_000 + FRAME)}, now).load == {
        lf1: {3: 5_000 + FRAME, 4: 0}}

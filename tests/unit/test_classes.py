import pytest

from controllers.classes import (CreditRule, EcnRule, PfcRule, TrafficClass, class_dscps,
                                 default_class)
from testbed.base.contract import dump, load


def test_step_marking():
    rule = EcnRule("step", kmin=30_000)
    assert rule.probability(30_000) == 0.0 and rule.probability(30_001) == 1.0


def test_red_marking_is_linear_between_kmin_and_kmax():
    rule = EcnRule("red", kmin=100, kmax=400, pmax=0.2)
    assert rule.probability(100) == 0.0
    assert rule.probability(250) == pytest.approx(0.1)
    assert rule.probability(400) == pytest.approx(0.2)
    assert rule.probability(401) == 1.0


def test_classes_round_trip_and_one_default():
    c = TrafficClass("roce", 1, 1, (26,), 1000, ecn=EcnRule("red", 1, 2, 0.5),
                     pfc=PfcRule(10, 5))
    assert load(TrafficClass, dump(c)) == c and c.minor == 0x11 and c.lossless
    ib = TrafficClass("roce", 1, 1, (26,), 1000, credit=CreditRule(800, 1000))
    assert load(TrafficClass, dump(ib)) == ib and ib.lossless and ib.flow_control.limit
    other = TrafficClass("other", 2, 2, (), 10)
    assert default_class((c, other)) is other
    with pytest.raises(ValueError):
        default_class((c,))


def test_the_default_class_takes_every_dscp_no_other_class_claims():
    cnp = TrafficClass("cnp", 0, 0, (48,), 10)
    roce = TrafficClass("roce", 1, 1, (26, 24), 10)
    other = TrafficClass("other", 2, 2, (), 10)
    classes = (cnp, roce, other)
    assert class_dscps(roce, classes) == (24, 26)
    rest = class_dscps(other, classes)
    assert len(rest) == 61 and not {24, 26, 48} & set(rest) and 0 in rest and 63 in rest
    assert class_dscps(other, (other,)) == tuple(range(64))  # hyperscale: one class

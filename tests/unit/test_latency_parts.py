"""A latency in its parts (testbed.results.latency): the modelled path delay, the rest."""
import numpy as np
import pytest

from testbed.base.hops import PathDelay
from testbed.base.topology import FabricPlan
from testbed.results.packets import Packets
from testbed.results.latency import expected_latency_us, full_frame_path_us, latency_parts

D = {"gpu_nic": 1.0, "switch_to_gpu": 10.0, "switch_to_switch": 100.0}
PLAN = FabricPlan(2, 2, 2)  # ranks 0, 1 on leaf 1; 2, 3 on leaf 2


def packets(rows):
    """(src, dst, latency us, payload B) rows as the collected columns."""
    src, dst, lat, payload = (np.asarray(c) for c in zip(*rows))
    n = len(rows)
    return Packets(src=src, dst=dst, sent=np.arange(n), latency=lat.astype(float),
                   iteration=np.zeros(n, int), payload=payload, delivered=np.ones(n, int),
                   ce=np.zeros(n, int), retx=np.zeros(n, int))


def test_each_packet_expects_its_pairs_path_and_its_own_transmission():
    p = packets([(0, 1, 500.0, 942), (0, 2, 900.0, 4096)])
    e = expected_latency_us(p, PLAN, PathDelay("nic", D), rate_mbit=8.0)  # 1 us per byte
    assert list(e) == [pytest.approx(11.0 + 1000), pytest.approx(211.0 + 4154)]
    off = expected_latency_us(p, PLAN, PathDelay("off", D), rate_mbit=8.0)
    assert list(off) == [0.0, 0.0]


def test_the_parts_the_run_reports():
    p = packets([(0, 1, 1020.0, 942), (0, 1, 1030.0, 942), (0, 2, 4400.0, 4096)])
    path = PathDelay("netem", D)  # the same model, whichever mechanism applied it
    out = latency_parts(p, PLAN, path, expected_latency_us(p, PLAN, path, 8.0),
                        p.path_minima_us(), mtu=4096, rate_mbit=8.0)
    assert out["path_delay_us"] == full_frame_path_us(path, 4096, 8.0) == {
        "same_leaf": 11.0 + 4154, "cross_leaf": 211.0 + 4154}
    assert out["latency_floor_us"] == {"same_leaf": 1020.0, "cross_leaf": 4400.0}
    assert out["latency_queueing_us"]["p50"] == pytest.approx(19.0)  # 9, 19, 35
    off = PathDelay("off", D)
    assert latency_parts(p, PLAN, off, expected_latency_us(p, PLAN, off, 8.0),
                         p.path_minima_us(), 4096, 8.0)["latency_queueing_us"] is None

"""A job's fan-in figures from spans and packets: Jain's index of the senders' throughputs and
the receiver's throughput while all of them send."""
import numpy as np
import pytest

from testbed.results.fanin import fan_in, jain_index, rounds
from traffic.jobgraph import COMM, Comm, JobGraph, Op


def test_jains_index_is_one_for_equal_shares_and_one_over_n_for_a_hog():
    assert jain_index([5, 5, 5]) == pytest.approx(1.0)
    assert jain_index([9, 0, 0]) == pytest.approx(1 / 3)
    assert jain_index([3, 1]) == pytest.approx(16 / 20)


def _graph():
    """Ranks 0 and 1 each write to rank 2 (kind "incast"); rank 2 also sends to rank 0 alone
    (kind "go": one sender, no fan-in)."""
    comms = (Comm("send_recv", (0, 2), 1000, kind="incast"),
             Comm("send_recv", (1, 2), 1000, kind="incast"),
             Comm("send_recv", (2, 0), 100, kind="go"))
    programs = ((Op(COMM, "send_recv", comm=0),), (Op(COMM, "send_recv", comm=1),),
                (Op(COMM, "send_recv", comm=0), Op(COMM, "send_recv", comm=1),
                 Op(COMM, "send_recv", comm=2)))
    return JobGraph(programs, comms)


def _span(rank, op, kind, start, end, iteration=0):
    return {"rank": rank, "iteration": iteration, "op": op, "kind": "comm", "comm_kind": kind,
            "start_ns": start, "end_ns": end}


def test_a_fan_in_measures_the_window_all_send_in_and_each_senders_share():
    # rank 0 sends over [0, 1000] ns, rank 1 over [200, 2200]: all send in [200, 1000]
    spans = [_span(0, 0, "incast", 0, 1000), _span(1, 0, "incast", 200, 2200),
             _span(2, 0, "incast", 0, 1000), _span(2, 2, "go", 0, 50)]
    rx = np.array([100, 500, 900, 300, 700, 1500, 2100, 40])
    src = np.array([0, 0, 0, 1, 1, 1, 1, 2])
    dst = np.array([2, 2, 2, 2, 2, 2, 2, 0])
    payload = np.array([100] * 7 + [100])
    out = fan_in(_graph(), spans, src, dst, rx, payload, time_scale=10.0)
    assert set(out) == {"incast"}  # "go" has one sender
    f = out["incast"]
    assert (f.receivers, f.senders, f.iterations) == (1, 2, (0,))
    row = f.per_iteration[0]
    # in [200, 1000]: 500, 900 from rank 0 and 300, 700 from rank 1: 400 B in 800 ns
    assert row.gbps_modelled == pytest.approx(8 * 400 / 800 * 10.0, rel=1e-3)
    assert row.all_send_us == pytest.approx(800 / 1000 / 10.0)
    assert row.whole_us == pytest.approx(2200 / 1000 / 10.0)
    # rank 0: 300 B in 1000 ns; rank 1: 400 B in 2000 ns
    assert row.jain == pytest.approx(jain_index([0.3, 0.2]), abs=1e-4)
    # as results.json holds it
    assert f.to_json()["per_iteration"][0]["whole_us"] == row.whole_us


def test_senders_one_after_the_other_are_no_fan_in():
    spans = [_span(0, 0, "incast", 0, 1000), _span(1, 0, "incast", 1000, 2000)]
    empty = np.zeros(0, dtype=np.int64)
    assert fan_in(_graph(), spans, empty, empty, empty, empty, 1.0) == {}


def test_repeated_bursts_are_rounds_of_their_own():
    # two senders burst twice: [0, 100] and [10, 120], then [130, 200] and [125, 210]
    ops = [(0, 0, 100), (1, 10, 120), (0, 130, 200), (1, 125, 210), (2, 300, 400)]

    assert rounds(ops) == [[(0, 0, 100), (1, 10, 120)], [(1, 125, 210), (0, 130, 200)]]


def test_the_comparison_shows_each_fan_in_as_jain_and_throughput_over_the_iterations():
    from testbed.results.model import FanIn, FanInRound
    from testbed.results.report import _fan_in
    rows = (FanInRound(0.9, 80.0), FanInRound(1.0, 100.0))
    assert _fan_in({"incast": FanIn(per_iteration=rows)}) == "incast 0.95 / 90.0"
    assert _fan_in(None) is None


def test_ops_that_overlap_only_by_their_acknowledgements_are_no_fan_in():
    # one-packet probes, one after the other; each sender's op ends when its ACK is back
    spans = [_span(0, 0, "incast", 0, 1000), _span(1, 0, "incast", 500, 1500)]
    src, dst = np.array([0, 1]), np.array([2, 2])
    rx, payload = np.array([100, 1200]), np.array([100, 100])
    assert fan_in(_graph(), spans, src, dst, rx, payload, 1.0) == {}

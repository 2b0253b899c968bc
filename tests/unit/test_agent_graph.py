"""The agent runs a collective as a dependency graph (no sockets: logic only)."""
import statistics

import pytest

from traffic import metrics
from traffic.agent import Agent

TRANSPORT = {"congestion_control": "none", "qps_per_peer": 1, "entropy": "per-qp",
             "ack_every": 16, "rto_ns": 10**8, "max_rto_ns": 8 * 10**8, "retry_limit": 7,
             "reorder_ns": 0, "dcqcn_timer_ns": 10**7, "dcqcn_byte_counter": 256000,
             "cnp_interval_ns": 10**7, "roce_tos": 106, "ack_tos": 104, "cnp_tos": 192}


def _agent(rank=1, n=4, collective="ring", size=4096, chunks=1, straggler=None, compute=None,
           qps=1):
    peers = [{"rank": r, "host": f"gpu{r + 1}", "ip": f"10.0.1.{r + 1}",
              "mac": "02:00:0a:00:01:%02x" % (r + 1)} for r in range(n)]
    me = peers[rank]
    cfg = {"rank": rank, "host": me["host"], "intf": "x", "ip": me["ip"], "mac": me["mac"],
           "ranks": n, "mtu": 1024, "link_rate_bps": 40e6, "out_dir": "/nonexistent",
           "transport": dict(TRANSPORT, qps_per_peer=qps), "seed": 1,
           "workloads": [{"collective": collective, "size": size, "iterations": 2,
                          "chunks": chunks, "group": 1}],
           "compute": compute or {"ns": 0, "jitter_ns": 0}, "straggler": straggler,
           "peers": [p for p in peers if p["rank"] != rank]}
    return Agent(cfg)


def _start_iteration(agent, it=0):
    w = agent.workload_of[it]
    agent.begin_collective(w, it)
    return w


def _posted(agent):
    return sorted(tag for (it, tag) in agent.posted_ns)


def test_a_ring_rank_sends_its_next_step_only_after_the_previous_one_arrived():
    a = _agent(rank=1, n=4)
    w = _start_iteration(a)
    assert _posted(a) == [0]  # step 0 needs nothing
    first = w.receives[(0, 0)]  # rank 0's step 0 to us
    a._delivered(first, 0, 123)
    assert _posted(a) == [0, 1]
    assert a.open_recvs[0] == len(w.receives) - 1


def test_deliveries_for_the_next_iteration_wait_until_it_starts():
    a = _agent(rank=1, n=4)
    w = _start_iteration(a, 0)
    a._delivered(w.receives[(0, 0)], 1, 5)  # rank 0 already in iteration 1
    assert _posted(a) == [0]  # nothing of iteration 1 was posted
    assert (0, 1, 0) in a.delivered_ns and a.open_recvs[1] == len(w.receives) - 1
    a.posted_ns.clear()
    _start_iteration(a, 1)
    assert _posted(a) == [0, 1]  # iteration 1: step 0, and step 1 whose input is here


def test_transfers_are_split_over_the_qps_to_a_peer():
    a = _agent(rank=0, n=2, qps=3, size=6000)
    _start_iteration(a)
    sizes = [m.size for i in range(3) for m in a.qp(1, i).req.messages]
    assert sum(sizes) == a.workloads[0].sends[0].nbytes and len(sizes) == 3
    assert a._parts(2) == [2]  # fewer bytes than QPs: one message


def test_all_to_all_posts_everything_at_once():
    a = _agent(rank=2, n=4, collective="all_to_all")
    _start_iteration(a)
    assert _posted(a) == [0, 1, 2]


def test_straggler_delays_follow_their_distribution():
    fixed = _agent(straggler={"delay_ns": 5_000_000, "distribution": "fixed", "probability": 1})
    assert {fixed._compute_time()[1] for _ in range(5)} == {5_000_000}
    expo = _agent(straggler={"delay_ns": 5_000_000, "distribution": "exponential",
                             "probability": 1})
    draws = [expo._compute_time()[1] for _ in range(4000)]
    assert statistics.mean(draws) == pytest.approx(5_000_000, rel=0.08)
    half = _agent(straggler={"delay_ns": 1000, "distribution": "fixed", "probability": 0.5})
    late = sum(half._compute_time()[1] > 0 for _ in range(2000))
    assert 850 < late < 1150
    jitter = _agent(compute={"ns": 10_000_000, "jitter_ns": 2_000_000})
    c = [jitter._compute_time()[0] for _ in range(2000)]
    assert min(c) >= 8_000_000 and max(c) <= 12_000_000 and max(c) - min(c) > 3_000_000


def test_lag_histogram_quantiles_and_merge():
    h = metrics.LagHistogram()
    for ns in [500, 2_000, 30_000] + [100_000] * 97:  # 0.5 us, 2 us, 30 us, 97 x 100 us
        h.add(ns)
    assert h.quantile_us(0.01) == 1.0  # below 1 us
    assert h.quantile_us(0.5) == pytest.approx(125.893, abs=0.01)  # bin above 100 us
    both = h.merge(h)
    assert sum(both.counts) == 200 and both.quantile_us(0.5) == h.quantile_us(0.5)
    assert metrics.LagHistogram().quantile_us(0.5) is None

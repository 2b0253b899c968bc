"""The agent runs a collective as a dependency graph (no sockets: logic only)."""
import statistics
from dataclasses import replace

import pytest

from traffic import metrics
from traffic.gpu import TIMER_KINDS, Gpu
from traffic.contract import Compute, GpuConfig, Peer, Straggler, Transport, WorkloadSpec
from traffic.jobgraph import collective_of
from traffic.progress import Progress, phases

TRANSPORT = Transport(congestion_control="none", qps_per_peer=1, entropy="per-qp", ack_every=16,
                      rto_ns=10**8, ack_timeout_ns=8 * 10**8, retry_limit=7,
                      stall_ns=10**11, reorder_ns=0,
                      go_back_0=False,
                      dcqcn_timer_ns=10**7, dcqcn_byte_counter=256000, dcqcn_clamp_target=False,
                      cnp_interval_ns=10**7, roce_tos=106, ack_tos=104, cnp_tos=192)


class _Loop:
    """What a GPU asks of its event loop, recorded."""

    def __init__(self):
        self.timers, self.lines, self.finished = [], [], 0

    def at(self, when, gpu):
        self.timers.append(when)

    def say(self, line):
        self.lines.append(line)


def _agent(rank=1, n=4, collective="ring", size=4096, chunks=1, straggler=None, compute=None,
           qps=1, flowlet_gap_ns=0):
    peers = [Peer(r, f"gpu{r + 1}", f"10.0.1.{r + 1}", "02:00:0a:00:01:%02x" % (r + 1))
             for r in range(n)]
    me = peers[rank]
    cfg = GpuConfig(rank=rank, host=me.host, intf="x", ip=me.ip, mac=me.mac, ranks=n,
                    mtu=1024, link_rate_bps=40e6, out_dir="/nonexistent",
                    transport=replace(TRANSPORT, qps_per_peer=qps,
                                      flowlet_gap_ns=flowlet_gap_ns), seed=1,
                    workloads=(WorkloadSpec(collective, size, 2, chunks, 1),),
                    compute=Compute(**(compute or {})),
                    straggler=Straggler(**straggler) if straggler else None,
                    peers=tuple(p for p in peers if p.rank != rank))
    return Gpu(cfg, _Loop())


def _progress(rank=1, n=4, collective="ring", size=4096):
    return Progress(phases([WorkloadSpec(collective, size, 2, 1, 1)], n), rank, 1)


def _begin(p, it, now=0):
    """Iteration ``it`` starts and its compute phase (op 0) ends: what the collective posts."""
    assert p.begin(it, now) == [] and p.computes == [0]
    p.computes.clear()
    return p.op_ended(0, now)


class _Posting:
    """A rank's progress, posting what becomes ready (as the GPU does)."""

    def __init__(self, **kw):
        self.p = _progress(**kw)
        self.posted_ns = {}

    def begin(self, it=0):
        for t in _begin(self.p, it):
            self.posted_ns[(it, t.tag)] = 0
        return self.p.workload_of[it]

    def delivered(self, t, it, rx_ns):
        for ready in self.p.delivered(t, it, rx_ns):
            self.posted_ns[(it, ready.tag)] = rx_ns


def _posted(agent):
    return sorted(tag for (it, tag) in agent.posted_ns)


def test_a_ring_rank_sends_its_next_step_only_after_the_previous_one_arrived():
    a = _Posting(rank=1, n=4)
    w = a.begin()
    assert _posted(a) == [0]  # step 0 needs nothing
    first = w.receives[(0, 0)]  # rank 0's step 0 to us
    a.delivered(first, 0, 123)
    assert _posted(a) == [0, 1]
    assert a.p.left[0][1] == len(w.sends) + len(w.receives) - 1  # op 1: the collective


def test_deliveries_for_the_next_iteration_wait_until_it_starts():
    a = _Posting(rank=1, n=4)
    w = a.begin(0)
    a.delivered(w.receives[(0, 0)], 1, 5)  # rank 0 already in iteration 1
    assert _posted(a) == [0]  # nothing of iteration 1 was posted
    assert (0, 1, 0) in a.p.delivered_ns
    assert a.p.left[1][1] == len(w.sends) + len(w.receives) - 1
    a.posted_ns.clear()
    a.begin(1)
    assert _posted(a) == [0, 1]  # iteration 1: step 0, and step 1 whose input is here


def test_transfers_are_split_over_the_qps_to_a_peer():
    a = _agent(rank=0, n=2, qps=3, size=6000)
    a.go(0)
    a.compute_done(0, 0)  # the compute phase (0 ns) ended: the collective starts
    sizes = [m.size for i in range(3) for m in a.nic.qp(1, i).req.messages]
    assert sum(sizes) == a.workloads[0].sends[0].nbytes and len(sizes) == 3
    assert a.progress.parts(2) == [2]  # fewer bytes than QPs: one message


def test_all_to_all_posts_everything_at_once():
    a = _Posting(rank=2, n=4, collective="all_to_all")
    a.begin()
    assert _posted(a) == [0, 1, 2]


@pytest.mark.parametrize("collective", ["ring", "double_binary_tree", "all_to_all"])
def test_the_gpus_of_one_process_share_one_schedule_and_each_keeps_its_own_part(collective):
    ranks = [_progress(rank=r, n=8, collective=collective) for r in range(8)]
    graph = ranks[0].workloads[0].graph
    assert all(p.workloads[0].graph is graph for p in ranks)  # built once
    whole = collective_of(graph.comms[0])
    for r, p in enumerate(ranks):
        w = p.workloads[0]
        assert w.sends == whole.sends(r)
        assert all(a is b for a, b in zip(w.sends, whole.sends(r)))  # not copied per GPU
        assert list(w.receives.values()) == whole.receives(r)


def test_an_iteration_ends_when_its_sends_are_acked_and_its_receives_delivered():
    p = _progress(rank=0, n=2, collective="ring")
    w = p.workload_of[0]
    ready = _begin(p, 0)
    for t in ready:
        for _ in p.posted(t, 0, 1):
            p.acked((0, t.tag), 2)
    assert not p.complete(0)  # sends acked, receives missing
    for t in w.receives.values():
        for ready_now in p.delivered(t, 0, 3):
            for _ in p.posted(ready_now, 0, 3):
                p.acked((0, ready_now.tag), 4)
    assert p.complete(0) and not p.complete(1)
    # the iteration's end is its last op's: the last delivery here (its sends were acked)
    assert p.ended_ns == max(end for _start, end in p.spans.values()) == 3


def test_an_iteration_ends_at_its_last_op_s_time_not_when_the_agent_served_it(monkeypatch):
    """A loaded machine serves a GPU late: the delay is the agent's, not the network's, so
    the iteration row (and the CCT read from it) ends at the last op's packet or timer time."""
    agent = _agent(rank=0, n=2)
    agent.loop.rearm = lambda qp, now: None
    agent.loop.wait_for_nic = lambda nic: None
    monkeypatch.setattr(agent.nic, "send_data", lambda: None)
    agent.go(0)
    agent.compute_done(0, 1)
    monkeypatch.setattr(agent.progress, "complete", lambda it: it == 0)
    agent.progress.ended_ns = 5_000
    agent.service(9_000_000)
    assert agent.iteration_rows[0][7] == 5_000


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


def test_a_straggler_delays_a_job_s_first_compute_op():
    from traffic.jobgraph import COMM, COMPUTE, Comm, JobGraph, Op
    from traffic.progress import Phase
    prog = (Op(COMPUTE, "forward", ns=1_000_000), Op(COMM, "dp", "dp", after=(0,), comm=0))
    graph = JobGraph((prog,) * 4, (Comm("ring", (0, 1, 2, 3), 4096, kind="dp"),), "tiny")
    cfg = _agent(straggler={"delay_ns": 5_000_000, "distribution": "fixed",
                            "probability": 1}).cfg
    gpu = Gpu(cfg, _Loop(), [Phase("tiny", 0, graph, 2)])
    start = 10**18  # far ahead: the op is timed, not ended at once
    gpu._begin(start)
    assert gpu.loop.timers == [start + 1_000_000 + 5_000_000]  # its span, then the straggle


def test_lag_histogram_quantiles_and_merge():
    h = metrics.LagHistogram()
    for ns in [500, 2_000, 30_000] + [100_000] * 97:  # 0.5 us, 2 us, 30 us, 97 x 100 us
        h.add(ns)
    assert h.quantile_us(0.01) == 1.0  # below 1 us
    assert h.quantile_us(0.5) == pytest.approx(104.713, abs=0.01)  # bin above 100 us
    h.add(208_000)  # within 5% of a tolerance: its bound stays under 1.05 x
    assert 208 < h.quantile_us(1.0) <= 208 * 1.05
    both = h.merge(h)
    assert sum(both.counts) == 202 and both.quantile_us(0.5) == h.quantile_us(0.5)
    assert metrics.LagHistogram().quantile_us(0.5) is None


def test_without_a_compute_phase_the_next_iteration_is_sent_in_the_same_service(monkeypatch):
    """The loop serves a GPU only after its events: the transfers an iteration's end posts
    must go out in that service, not wait for a timer (171 ms once, an RTO)."""
    agent = _agent(rank=0, n=2)
    nic = agent.nic
    agent.loop.rearm = lambda qp, now: None
    agent.loop.wait_for_nic = lambda nic: None
    sent = []
    monkeypatch.setattr(nic, "send_data", lambda: sent.append((agent.it, len(nic.active))))
    agent.go(0)
    agent.compute_done(0, 1)  # iteration 0's compute phase (none, due at the start) ends
    monkeypatch.setattr(agent.progress, "complete", lambda it: it == 0)
    for qp in nic.active:  # iteration 0 sent and acknowledged: no QP has more to send
        qp.queued = False
    nic.active.clear()
    agent.service(2)
    assert agent.it == 1 and sent and sent[-1][0] == 1 and sent[-1][1] > 0, sent


def test_a_timer_due_during_one_gpus_service_runs_before_the_next_gpu_is_served(monkeypatch):
    """Serving the touched GPUs one after another, the loop runs a timer that fell due
    meanwhile at once (its GPU served too), not after every other GPU's service."""
    import traffic.agent as agent_mod

    clock = [1_000_000]
    monkeypatch.setattr(agent_mod.time, "time_ns", lambda: clock[0])
    events = []

    class Busy:  # a GPU whose service takes 300 us
        def __init__(self, name):
            self.name = name

        def service(self, now):
            events.append(("service", self.name, now))
            clock[0] += 300_000

        def compute_done(self, when, now):
            events.append(("timer", self.name, now - when))

    loop = agent_mod.Loop([_agent().cfg])
    a, b, c = Busy("a"), Busy("b"), Busy("c")
    loop.heap.push(clock[0] + 100_000, c)  # due during the first service
    touched = {a, b}
    loop.serve(touched)
    assert not touched
    kinds = [e[:2] for e in events]
    assert kinds[1] == ("timer", "c") and events[1][2] == 200_000  # 200 us late, not 500
    assert sorted(kinds) == [("service", "a"), ("service", "b"), ("service", "c"),
                             ("timer", "c")]


def test_timer_lag_is_kept_per_kind_of_timer_and_in_total():
    a = _agent()
    a.late("dcqcn", 300_000)
    a.late("dcqcn", 280_000)
    a.late("compute", 5_000)
    assert a.lag.summary().count == 3
    assert {k: h.summary().count for k, h in a.lag_by.items()} == {"dcqcn": 2, "compute": 1}
    assert a.lag_by["dcqcn"].summary().p95_us >= 300
    assert set(a.lag_by) <= set(TIMER_KINDS)


def test_a_nic_with_room_for_one_frame_at_a_time_serves_its_qps_in_turn(monkeypatch):
    """The NIC's round-robin resumes after the QP it served last. Restarting from the first
    QP on every call, it served only that one while the NIC was the bottleneck: the other
    QPs' flows waited behind it (measured: an all-to-all's flows ended one after another)."""
    agent = _agent(rank=0, n=4, collective="all_to_all", size=4 * 64 * 1024)
    agent.go(0)
    agent.compute_done(0, 0)
    nic = agent.nic
    assert len(nic.active) == 3
    room = [0]
    nic.sender = type("Sender", (), {"send": lambda self, *a: 1024})()
    nic.stamped = -10  # the NIC always holds frames: every send asks whether it has room
    monkeypatch.setattr(nic, "nic_full", lambda: room[0] == 0 or room.__setitem__(0, 0))
    qps, served = list(nic.active), []
    for _ in range(6):
        before = [qp.bytes_sent for qp in qps]
        room[0] = 1  # one frame left the NIC
        nic.send_data()
        nic.nic_blocked = False
        served += [qp.peer for qp, b in zip(qps, before) if qp.bytes_sent > b]
    assert served == [1, 2, 3, 1, 2, 3]


def test_a_qp_idle_longer_than_the_flowlet_gap_sends_on_with_a_new_source_port(monkeypatch):
    """Flowlet switching's inactivity interval, kept by the sending RNIC: frames closer than
    the gap keep the QP's UDP source port, the first after a longer silence and those after
    it carry a new one (the fabric may route it anew); without a gap the port never moves."""
    import struct

    import traffic.gpu as gpu_module
    import traffic.rnic as rnic_module
    from traffic.roce import SPORT_OFFSET

    clock = [0]
    for module in (gpu_module, rnic_module):
        monkeypatch.setattr(module, "time", type("Clock", (), {
            "time_ns": staticmethod(lambda: clock[0])}))

    def sports(gap_ns, at_ns):
        agent = _agent(rank=0, n=2, collective="all_to_all", size=8 * 1024,
                       flowlet_gap_ns=gap_ns)
        agent.go(0)
        agent.compute_done(0, 0)
        sent, room, nic = [], [0], agent.nic

        def send(tpl, *a, **kw):
            sent.append(struct.unpack_from("!H", tpl.buf, SPORT_OFFSET)[0])
            return 1024
        nic.sender = type("Sender", (), {"send": lambda self, *a, **kw: send(*a, **kw)})()
        nic.stamped = -10  # the NIC takes one frame per call
        monkeypatch.setattr(nic, "nic_full",
                            lambda: room[0] == 0 or room.__setitem__(0, 0))
        for t in at_ns:
            clock[0], room[0] = t, 1
            nic.send_data()
            nic.nic_blocked = False
        return sent, nic.counters["flowlets"]

    at = [0, 500_000, 2_000_000, 2_100_000]  # a 1.5 ms silence before the third frame
    ports, flowlets = sports(1_000_000, at)
    assert ports[0] == ports[1] != ports[2] == ports[3] and flowlets == 1
    assert all(0xC000 <= p <= 0xFFFF for p in ports)
    ports, flowlets = sports(0, at)
    assert len(set(ports)) == 1 and flowlets == 0

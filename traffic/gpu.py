"""One emulated GPU host: its training iterations, driven over its RNIC (``traffic.rnic``)
and its server's scale-up domain, served by the agent's event loop (``traffic.agent``).

Each GPU replays its job's iteration graph (``traffic.jobgraph``, ``traffic.progress``): an
op starts once the ops it waits for ended. A compute op (the iteration's compute phase is
the first: ``compute_ns`` +- jitter, plus a straggler delay on the chosen ranks) is a loop
timer; a communication op's transfers to this rank's peers are posted on the RNIC's QPs (one
lane of ``qps_per_peer`` QPs per kind of communication: dp, tp, pp, ep, a collective's own,
a message split over them), or sent over the scale-up link to a GPU of its own server. The
iteration ends when all its ops ended - its transfers acknowledged, the transfers to it
delivered - and the next starts at once. The GPU answers its peers throughout (the RNIC
does).

Ranks, QPs, transport state, straggler draws and records are per GPU, exactly as if each had
its own process. The RNIC is the transport: what the GPU asks of it is ``open``, ``post``,
``service`` and ``activity``; what it hears back is ``traffic.rnic.Host``.
"""
from __future__ import annotations

import json
import random
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from .contract import GpuConfig, JobFailure
from .metrics import LagHistogram
from .progress import Phase, Progress, phases
from .rnic import RETRY_EXC_ERR, QueuePair, Rnic

if TYPE_CHECKING:
    from .agent import Loop

# the timers whose lateness the agents record (summary's loop_lag_by_timer)
TIMER_KINDS = ("compute", "rto", "dcqcn", "pacing", "nak", "delay", "scale-up")
IDLE, RUNNING, FINISHED, FAILED = "idle", "running", "finished", "failed"


class Gpu:
    """One emulated GPU host: its training iterations over its RNIC and scale-up link."""

    def __init__(self, config: GpuConfig, loop: "Loop", job: Optional[List[Phase]] = None):
        self.cfg = config
        self.loop = loop
        self.rank = config.rank
        self.host = config.host
        self.n = config.ranks
        self.transport = t = config.transport
        self.progress = Progress(job or phases(config.workloads, self.n), self.rank,
                                 t.qps_per_peer)
        self.workloads = self.progress.workloads
        # each kind of communication (dp, tp, pp, ep; a collective's own) has its QPs to a
        # peer, as a library's streams have their channels: lane k's are k x qps_per_peer on
        kinds = sorted({c.kind for w in self.workloads for c in w.graph.comms})
        self.lane_of = {k: i * t.qps_per_peer for i, k in enumerate(kinds)}
        # the other GPUs of its server: reached over the scale-up domain, never the fabric
        self.server = frozenset(config.server) - {self.rank}
        self.iterations = self.progress.iterations
        self.nic = Rnic(config, loop, self, t.qps_per_peer * max(1, len(kinds)),
                        self.iterations, self.server)
        self.computing: Dict[int, List[int]] = {}  # due ns -> compute ops ending then
        self.scale_up_free = 0  # its scale-up link is busy until then
        self.work_rng = random.Random(config.seed * 1_000_003 + self.rank)
        self.iteration_rows: List[tuple] = []
        self.state = IDLE
        self.it = -1
        self.compute_start = self.collective_start = 0
        self.compute = (0, 0)
        self.lag_by: Dict[str, LagHistogram] = {}  # how late the loop acted, per TIMER_KINDS
        self.first_start_lag_ns = 0
        self.counters: Dict[str, int] = defaultdict(int)  # the host's own; the NIC's apart
        self.mark = None  # the NIC's activity seen by the stuck check, and since when
        self.mark_ns = 0
        self.start_ns = 0  # the go: the job's time 0

    def open(self) -> None:
        """The RNIC opened, with every message part this GPU will post over the fabric."""
        self.nic.open((t.dst, self.lane_of[w.kind_of_tag[t.tag]] + i, part)
                      for w in self.workloads for t in w.sends if t.dst not in self.server
                      for i, part in enumerate(self.progress.parts(t.nbytes)))

    def close(self) -> None:
        self.nic.close()

    def service(self, now: int) -> None:
        """After this GPU's events: move its iteration on, then its RNIC. The iteration
        first: without a compute phase the next one's transfers are posted at once, and must
        go out now, not at the next wake (the loop serves only GPUs that had events). An
        iteration ends when its last op did (a packet's or timer's time), not when the loop
        got to it: the agent's own delay is not the network's."""
        if self.state == RUNNING and self.progress.complete(self.it):
            self._end_iteration(self.progress.ended_ns)
        self.nic.service(now)

    # --- what the RNIC tells it (traffic.rnic.Host) ---------------------------------------------
    def message_delivered(self, peer: int, iteration: int, tag: int, rx_ns: int) -> bool:
        ready = self.progress.message_end(peer, iteration, tag, rx_ns)
        if ready is None:
            return False
        self._go(ready, rx_ns)
        return True

    def message_acked(self, tag: Tuple[int, int], rx_ns: int) -> None:
        self._go(self.progress.acked(tag, rx_ns), rx_ns)

    # --- time ---------------------------------------------------------------------------------
    @property
    def lag(self) -> LagHistogram:
        """How late the loop acted on this GPU's timers, all kinds together."""
        total = LagHistogram()
        for hist in self.lag_by.values():
            total = total.merge(hist)
        return total

    def late(self, kind: str, lag_ns: int) -> None:
        """The loop acted ``lag_ns`` after a ``kind`` timer's time (one of TIMER_KINDS)."""
        hist = self.lag_by.get(kind)
        if hist is None:
            hist = self.lag_by[kind] = LagHistogram()
        hist.add(lag_ns)

    # --- the training iterations ---------------------------------------------------------------
    def go(self, start_ns: int) -> None:
        self.start_ns = start_ns
        self._begin(start_ns)

    def fail(self, reason: str, now: int, qp: Optional[QueuePair] = None, detail: str = "",
             no_progress_ns: int = 0) -> None:
        """This GPU's job failed (``retry-exceeded``: a QP spent its retry budget;
        ``stalled``: no progress for as long as the run waits): tell the runner once, with
        what NCCL's warning would name and what the QP saw last (emulated ns)."""
        if self.state == FAILED:
            return
        self.state = FAILED
        failure = JobFailure(
            reason, self.host, self.rank, self.it, now - self.start_ns, detail, no_progress_ns,
            status=RETRY_EXC_ERR if qp is not None and reason == "retry-exceeded" else None,
            qp=self.nic.qp_failure(qp, self.start_ns) if qp is not None else None)
        self.loop.say(f"failed {self.host} {json.dumps(failure.to_dict())}")

    def _begin(self, start: int) -> None:
        """The next iteration starts at ``start``: its first ops (the compute phase first)."""
        self.it += 1
        self.state = RUNNING
        self.compute_start = self.collective_start = start
        self.compute = self._compute_time()
        self.mark, self.mark_ns = None, start
        self._go(self.progress.begin(self.it, start), start)

    def _go(self, ready, at: int) -> None:
        """Post the transfers that may go and time the compute ops that may start, both as of
        ``at``; a compute op already over by now ends at once, and what it frees goes too."""
        for t in ready:
            self._post(t, self.it)
        progress = self.progress
        computes = progress.computes
        while computes:
            i = computes.pop()
            due = at + progress.plan.ops[i].ns
            if i == 0:  # the iteration's compute phase, straggle included, adds to its first op
                due += self.compute[0] + self.compute[1]
            if (self.it > 0 or i > 0) and due <= time.time_ns():
                for t in self._op_done(i, due):
                    self._post(t, self.it)
            else:
                self.computing.setdefault(due, []).append(i)
                self.loop.at(due, self)

    def _op_done(self, i: int, now: int):
        """Compute op ``i`` ended at ``now`` (op 0: the compute phase; the rest may start)."""
        if i == 0:
            self.collective_start = now
        return self.progress.op_ended(i, now)

    def compute_done(self, when: int, now: int) -> None:
        """Compute ops due at ``when`` end (their timer runs at ``now``)."""
        ops = self.computing.pop(when, None)
        if ops is None:
            return
        if self.it == 0 and 0 in ops:  # all ranks start at once: the bursts compete for CPUs
            self.first_start_lag_ns = now - when
        else:
            self.late("compute", now - when)
        for i in ops:
            self._go(self._op_done(i, now), now)

    def _end_iteration(self, end: int) -> None:
        w = self.progress.workload_of[self.it]
        self.iteration_rows.append((self.rank, self.it, w.index, w.name, w.size,
                                    self.compute_start, self.collective_start, end,
                                    self.compute[0], self.compute[1], w.bytes_sent,
                                    w.bytes_received))
        self.loop.say(f"iter {self.host} {self.it}")
        if self.it + 1 < self.iterations:
            self._begin(end)
        else:
            self.state = FINISHED
            self.loop.finished += 1
            self.loop.say(f"finished {self.host}")

    def _post(self, t, it: int) -> None:
        now = time.time_ns()
        if t.dst in self.server:
            self._scale_up(t, it, now)
            return
        at = t.dst_offset
        lane = self.lane_of[self.progress.workload_of[it].kind_of_tag[t.tag]]
        for i, part in enumerate(self.progress.posted(t, it, now)):
            self.nic.post(t.dst, lane + i, (it, t.tag), part, now, va=at)
            at += part

    def _scale_up(self, t, it: int, now: int) -> None:
        """Send ``t`` over the server's scale-up link: after this GPU's earlier scale-up
        transfers, at the link's rate, arriving its latency later (a loop timer)."""
        su = self.cfg.scale_up
        self.progress.posted(t, it, now, whole=True)
        start = max(now, self.scale_up_free)
        self.scale_up_free = start + int(t.nbytes * su.ns_per_byte)
        self.loop.scale_up(self.scale_up_free + su.latency_ns, self, t, it)
        self.counters["scale_up_bytes"] += t.nbytes

    def scale_up_sent(self, t, it: int, when: int) -> None:
        """Scale-up transfer ``t`` of this GPU arrived at ``when``: acknowledged."""
        self._go(self.progress.acked((it, t.tag), when), when)

    def scale_up_arrived(self, t, it: int, when: int) -> None:
        """Scale-up transfer ``t`` to this GPU arrived at ``when``."""
        self._go(self.progress.delivered(t, it, when), when)  # nothing, for a later iteration

    def _compute_time(self) -> Tuple[int, int]:
        """(compute phase, straggler delay) of the next iteration, in ns."""
        rng = self.work_rng
        compute = self.cfg.compute.ns
        jitter = self.cfg.compute.jitter_ns
        if jitter:
            compute = max(0, int(compute + rng.uniform(-jitter, jitter)))
        st = self.cfg.straggler
        delay = 0
        if st and rng.random() < st.probability:
            mean = st.delay_ns
            if st.distribution == "uniform":
                delay = int(rng.uniform(0, 2 * mean))
            elif st.distribution == "exponential":
                delay = int(rng.expovariate(1 / mean)) if mean > 0 else 0
            else:
                delay = int(mean)
        return int(compute), delay

    def check_stuck(self, now: int) -> None:
        """An iteration that made no progress for as long as the run waits (``stall_ns``)
        while it waits for the network (not while it computes) fails the job as stalled."""
        if self.state != RUNNING or self.computing:
            return
        mark = self.nic.activity()
        if mark != self.mark:
            self.mark, self.mark_ns = mark, now
        elif now - self.mark_ns > self.transport.stall_ns:
            w = self.progress.workload_of[self.it]
            self.fail("stalled", now, no_progress_ns=now - self.mark_ns,
                      detail=f"no packet moved in {w.name}, {w.size:,} B")

"""One rank's progress through its iterations, as a pure state machine (no sockets, no clock).

An iteration is a graph of operations (``traffic.jobgraph``): compute spans and this rank's
part in collectives, each starting once the ops it waits for have ended. Inside a collective,
a transfer may be posted once its op has started and every transfer it depends on was
delivered to this rank (``traffic.collectives``). ``Progress`` tracks which ops wait, run and
ended; which transfers are posted, acknowledged (all their messages, one per QP part) and
delivered (every part's last packet in order); and says when an iteration is complete: every
op ended - so completion includes every retransmission. Deliveries for a later iteration (a
faster peer) are kept until that iteration begins. Compute ops that may start are left in
``computes`` for the GPU, which times them and reports their end (``op_ended``).

A collective workload is the graph ``compute phase -> collective``; a job is its own graph.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from functools import lru_cache
from typing import Dict, List, Sequence, Tuple

from .collectives import Transfer, chunk_sizes
from .contract import WorkloadSpec
from .jobgraph import COMM, COMPUTE, JobGraph, RankPlan, collective_graph, rank_plan, tag_bases


@dataclass(frozen=True)
class Phase:
    """A graph every rank replays for some iterations (a size sweep has one per size)."""
    name: str
    size: int  # the collective's bytes per rank; a job's: 0
    graph: JobGraph
    iterations: int


@lru_cache(maxsize=None)
def _collective_graph(name: str, n: int, size: int, chunks: int, group: int,
                      pxn: bool) -> JobGraph:
    return collective_graph(name, n, size, chunks, group, pxn)


def phases(specs: Sequence[WorkloadSpec], n: int) -> List[Phase]:
    """Collective workloads as phases, each graph built once per process."""
    return [Phase(s.collective, s.size, _collective_graph(s.collective, n, s.size, s.chunks,
                                                          s.group, s.pxn), s.iterations)
            for s in specs]


@lru_cache(maxsize=None)
def _bases(graph: JobGraph):
    return tag_bases(graph)


class Workload:
    """One phase: this rank's part of its graph, replayed for some iterations."""

    def __init__(self, phase: Phase, index: int, rank: int, first_iteration: int):
        self.index = index
        self.name = phase.name
        self.size = phase.size
        self.graph = phase.graph
        self.plan: RankPlan = rank_plan(phase.graph, rank, _bases(phase.graph))
        self.ops = self.plan.ops
        self.iterations = range(first_iteration, first_iteration + phase.iterations)
        self.sends: List[Transfer] = self.plan.all_sends()
        self.receives: Dict[Tuple[int, int], Transfer] = {
            ref: t for ref, (_op, t) in self.plan.receives.items()}
        self.bytes_sent = sum(t.nbytes for t in self.sends)
        self.bytes_received = sum(t.nbytes for t in self.receives.values())
        # the comm kind each send serves (its streams' QPs) and each op's comm's bytes
        self.kind_of_tag = {t.tag: self.plan.comms[self.ops[op].comm].kind
                            for op, ts in self.plan.sends.items() for t in ts}


def split(nbytes: int, qps: int) -> List[int]:
    """How a transfer is split over the ``qps`` QPs to its peer: one message per QP."""
    return chunk_sizes(nbytes, qps) if nbytes >= qps else [nbytes]


class Progress:
    """This rank's ops and transfers across all iterations of all its workloads."""

    def __init__(self, phases_: Sequence[Phase], rank: int, qps_per_peer: int):
        self.rank = rank
        self.qps = qps_per_peer
        self._parts: Dict[int, List[int]] = {}  # transfer size -> message sizes, read only
        self.workloads: List[Workload] = []
        first = 0
        for i, phase in enumerate(phases_):
            self.workloads.append(Workload(phase, i, rank, first))
            first += phase.iterations
        self.iterations = first
        self.workload_of = [w for w in self.workloads for _ in w.iterations]
        self.current = -1
        self.plan: RankPlan = None  # type: ignore[assignment]  # the current iteration's
        self.deps: List[int] = []  # per op of the current iteration: ops still awaited
        self.started: List[bool] = []
        self.ended = 0  # ops of the current iteration that ended
        self.ended_ns = 0  # when the last op of the current iteration so far ended
        self.computes: List[int] = []  # compute ops that may start, for the GPU to time
        self.left: Dict[int, List[int]] = {}  # iteration -> per op: transfers still open
        self.waiting: Dict[int, int] = {}  # tag -> deliveries still missing
        self.waiters: Dict[Tuple[int, int], List[Transfer]] = defaultdict(list)
        self.posted_ns: Dict[Tuple[int, int], int] = {}  # (it, tag)
        self.unacked: Dict[Tuple[int, int], int] = defaultdict(int)  # (it, tag) -> messages
        self.acked_ns: Dict[Tuple[int, int], int] = {}
        self.lasts: Dict[Tuple[int, int, int], int] = defaultdict(int)  # (src, it, tag)
        self.delivered_ns: Dict[Tuple[int, int, int], int] = {}  # (src, it, tag)
        self.spans: Dict[Tuple[int, int], List[int]] = {}  # (it, op) -> [start, end]

    def parts(self, nbytes: int) -> List[int]:
        got = self._parts.get(nbytes)
        if got is None:  # a collective's transfers come in few sizes
            got = self._parts[nbytes] = split(nbytes, self.qps)
        return got

    def _left(self, it: int) -> List[int]:
        got = self.left.get(it)
        if got is None:
            got = self.left[it] = list(self.workload_of[it].plan.open_transfers)
        return got

    # --- ops --------------------------------------------------------------------------------
    def begin(self, it: int, now: int = 0) -> List[Transfer]:
        """Iteration ``it`` starts: the transfers to post now (compute ops that may start
        are left in ``computes``)."""
        self.current = it
        self.plan = plan = self.workload_of[it].plan
        self.deps = [len(op.after) for op in plan.ops]
        self.started = [False] * len(plan.ops)
        self.ended = 0
        self.ended_ns = now  # when the last op so far ended: the iteration's end once complete
        self.waiting.clear()
        self.waiters.clear()
        self._left(it)
        ready: List[Transfer] = []
        for i, d in enumerate(self.deps):
            if d == 0:
                ready += self._start(i, now)
        return ready

    def _start(self, i: int, now: int) -> List[Transfer]:
        it, plan = self.current, self.plan
        self.started[i] = True
        self.spans[(it, i)] = [now, -1]
        if plan.ops[i].kind == COMPUTE:
            self.computes.append(i)
            return []
        ready = []
        delivered = self.delivered_ns
        for t in plan.sends[i]:
            missing = [d for d in t.after if (d[0], it, d[1]) not in delivered]
            if missing:
                self.waiting[t.tag] = len(missing)
                for d in missing:
                    self.waiters[d].append(t)
            else:
                ready.append(t)
        if self.left[it][i] == 0:  # every receive already here and nothing to send
            ready += self._end(i, now)
        return ready

    def _end(self, i: int, now: int) -> List[Transfer]:
        self.spans[(self.current, i)][1] = now
        self.ended += 1
        if now > self.ended_ns:
            self.ended_ns = now
        ready: List[Transfer] = []
        deps = self.deps
        for k in self.plan.successors[i]:
            deps[k] -= 1
            if deps[k] == 0:
                ready += self._start(k, now)
        return ready

    def op_ended(self, i: int, now: int) -> List[Transfer]:
        """Compute op ``i`` of the current iteration ended: the transfers that may go now."""
        return self._end(i, now)

    def _transfer_done(self, it: int, op: int, now: int) -> List[Transfer]:
        left = self._left(it)
        left[op] -= 1
        if left[op] == 0 and it == self.current and self.started[op]:
            return self._end(op, now)
        return []

    # --- transfers --------------------------------------------------------------------------
    def posted(self, t: Transfer, it: int, now: int, whole: bool = False) -> List[int]:
        """``t`` is posted; returns its message sizes, one per QP part (``whole``: one
        message, as a scale-up transfer is)."""
        self.posted_ns[(it, t.tag)] = now
        parts = [t.nbytes] if whole else self.parts(t.nbytes)
        self.unacked[(it, t.tag)] += len(parts)
        return parts

    def acked(self, tag: Tuple[int, int], now: int) -> List[Transfer]:
        """One message of transfer ``tag`` = (iteration, tag) was acknowledged: the
        transfers that may go now (its op may have ended)."""
        self.unacked[tag] -= 1
        if self.unacked[tag]:
            return []
        self.acked_ns[tag] = now
        it = tag[0]
        return self._transfer_done(it, self.workload_of[it].plan.op_of_tag[tag[1]], now)

    def message_end(self, src: int, iteration: int, tag: int, rx_ns: int):
        """The last packet of one message from ``src`` arrived in order. Returns None for a
        message this rank does not expect, else the transfers that may be posted now."""
        key = (src, iteration, tag)
        self.lasts[key] += 1
        w = self.workload_of[iteration] if 0 <= iteration < self.iterations else None
        t = w.receives.get((src, tag)) if w else None
        if t is None:
            return None
        if self.lasts[key] == len(self.parts(t.nbytes)):
            return self.delivered(t, iteration, rx_ns)
        return []

    def delivered(self, t: Transfer, iteration: int, rx_ns: int) -> List[Transfer]:
        """Every part of ``t`` arrived: the transfers of the current iteration it unblocks."""
        self.delivered_ns[(t.src, iteration, t.tag)] = rx_ns
        ready = []
        if iteration == self.current:
            for waiter in self.waiters.pop(t.ref, ()):
                self.waiting[waiter.tag] -= 1
                if self.waiting[waiter.tag] == 0:
                    ready.append(waiter)
        op = self.workload_of[iteration].plan.receives[t.ref][0]
        return ready + self._transfer_done(iteration, op, rx_ns)

    def complete(self, it: int) -> bool:
        return it == self.current and self.ended == len(self.plan.ops)

    # --- records ----------------------------------------------------------------------------
    def op_rows(self, iteration_rows: List[tuple]) -> List[tuple]:
        """One row per transfer sent or received (``OP_FIELDS``), for the iterations run."""
        rows = []
        for row in iteration_rows:
            it, w = row[1], self.workloads[row[2]]
            for t in w.sends:
                rows.append((self.rank, it, "send", t.dst, t.tag, t.phase, t.nbytes,
                             self.posted_ns[(it, t.tag)], self.acked_ns[(it, t.tag)]))
            for t in w.receives.values():
                at = self.delivered_ns[(t.src, it, t.tag)]
                rows.append((self.rank, it, "recv", t.src, t.tag, t.phase, t.nbytes, at, at))
        return rows

    def span_rows(self, iteration_rows: List[tuple]) -> List[tuple]:
        """One row per op of each iteration run (``SPAN_FIELDS``)."""
        rows = []
        for row in iteration_rows:
            it, w = row[1], self.workloads[row[2]]
            for i, op in enumerate(w.ops):
                start, end = self.spans[(it, i)]
                comm = w.plan.comms[op.comm] if op.kind == COMM else None
                rows.append((self.rank, it, i, op.name, op.kind, op.stream,
                             comm.kind if comm else "", comm.collective if comm else "",
                             len(comm.group) if comm else 0, comm.size if comm else 0,
                             start, end))
        return rows

"""One rank's progress through its collectives, as a pure state machine (no sockets, no clock).

A collective is a dependency graph (``traffic.collectives``): a transfer may be posted once
every transfer it depends on was delivered to this rank. ``Progress`` tracks, per iteration,
which transfers are waiting for which deliveries, which are posted, acknowledged (all their
messages, one per QP part) and delivered (every part's last packet in order), and says when
an iteration is complete: all its sends acknowledged and all its receives delivered - so
completion includes every retransmission. Deliveries for a later iteration (a faster peer)
are kept until that iteration begins.
"""
from __future__ import annotations

from collections import defaultdict
from functools import lru_cache
from typing import Dict, List, Sequence, Tuple

from .collectives import Collective, Transfer, build, chunk_sizes
from .contract import WorkloadSpec


@lru_cache(maxsize=None)
def schedule(name: str, n: int, size: int, chunks: int, group: int
             ) -> Tuple[Collective, Dict[int, List[Transfer]], Dict[int, List[Transfer]]]:
    """A collective and its transfers by sender and by receiver, built once per process:
    every GPU an agent serves replays the same graph (``large``'s ring holds 32,256
    transfers: 0.2 s and 12 MB for each GPU that built its own copy)."""
    c = build(name, n, size, chunks, group)
    sends: Dict[int, List[Transfer]] = defaultdict(list)
    receives: Dict[int, List[Transfer]] = defaultdict(list)
    for t in c.transfers:
        sends[t.src].append(t)
        receives[t.dst].append(t)
    return c, dict(sends), dict(receives)


class Workload:
    """One collective at one size, replayed for some iterations: this rank's part of it."""

    def __init__(self, spec: WorkloadSpec, index: int, rank: int, n: int, first_iteration: int):
        self.index = index
        self.collective, sends, receives = schedule(spec.collective, n, spec.size, spec.chunks,
                                                    spec.group)
        self.name = self.collective.name
        self.size = spec.size
        self.iterations = range(first_iteration, first_iteration + spec.iterations)
        self.sends: List[Transfer] = sends.get(rank, [])
        self.receives: Dict[Tuple[int, int], Transfer] = {
            t.ref: t for t in receives.get(rank, ())}
        self.bytes_sent = sum(t.nbytes for t in self.sends)
        self.bytes_received = sum(t.nbytes for t in self.receives.values())


def split(nbytes: int, qps: int) -> List[int]:
    """How a transfer is split over the ``qps`` QPs to its peer: one message per QP."""
    return chunk_sizes(nbytes, qps) if nbytes >= qps else [nbytes]


class Progress:
    """This rank's transfers across all iterations of all its workloads."""

    def __init__(self, workloads: Sequence[WorkloadSpec], rank: int, n: int, qps_per_peer: int):
        self.rank = rank
        self.qps = qps_per_peer
        self._parts: Dict[int, List[int]] = {}  # transfer size -> message sizes, read only
        self.workloads: List[Workload] = []
        first = 0
        for i, spec in enumerate(workloads):
            self.workloads.append(Workload(spec, i, rank, n, first))
            first += spec.iterations
        self.iterations = first
        self.workload_of = [w for w in self.workloads for _ in w.iterations]
        self.current = -1
        self.waiting: Dict[int, int] = {}  # tag -> deliveries still missing
        self.waiters: Dict[Tuple[int, int], List[Transfer]] = defaultdict(list)
        self.open_sends: Dict[int, int] = {}  # iteration -> transfers not fully acknowledged
        self.open_recvs: Dict[int, int] = {}  # iteration -> transfers not yet delivered
        self.posted_ns: Dict[Tuple[int, int], int] = {}  # (it, tag)
        self.unacked: Dict[Tuple[int, int], int] = defaultdict(int)  # (it, tag) -> messages
        self.acked_ns: Dict[Tuple[int, int], int] = {}
        self.lasts: Dict[Tuple[int, int, int], int] = defaultdict(int)  # (src, it, tag)
        self.delivered_ns: Dict[Tuple[int, int, int], int] = {}  # (src, it, tag)

    def parts(self, nbytes: int) -> List[int]:
        got = self._parts.get(nbytes)
        if got is None:  # a collective's transfers come in few sizes
            got = self._parts[nbytes] = split(nbytes, self.qps)
        return got

    def begin(self, it: int) -> List[Transfer]:
        """Iteration ``it`` starts: the transfers whose inputs are here, to post now (the
        others wait for their deliveries)."""
        w = self.workload_of[it]
        self.current = it
        self.waiting.clear()
        self.waiters.clear()
        self.open_sends[it] = len(w.sends)
        self.open_recvs.setdefault(it, len(w.receives))
        ready = []
        for t in w.sends:
            missing = [d for d in t.after if (d[0], it, d[1]) not in self.delivered_ns]
            if missing:
                self.waiting[t.tag] = len(missing)
                for d in missing:
                    self.waiters[d].append(t)
            else:
                ready.append(t)
        return ready

    def posted(self, t: Transfer, it: int, now: int) -> List[int]:
        """``t`` is posted; returns its message sizes, one per QP part."""
        self.posted_ns[(it, t.tag)] = now
        parts = self.parts(t.nbytes)
        self.unacked[(it, t.tag)] += len(parts)
        return parts

    def acked(self, tag: Tuple[int, int], now: int) -> None:
        """One message of transfer ``tag`` = (iteration, tag) was acknowledged."""
        self.unacked[tag] -= 1
        if self.unacked[tag] == 0:
            self.acked_ns[tag] = now
            self.open_sends[tag[0]] -= 1

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
        w = self.workload_of[iteration]
        self.open_recvs[iteration] = self.open_recvs.get(iteration, len(w.receives)) - 1
        ready = []
        if iteration == self.current:
            for waiter in self.waiters.pop(t.ref, ()):
                self.waiting[waiter.tag] -= 1
                if self.waiting[waiter.tag] == 0:
                    ready.append(waiter)
        return ready

    def complete(self, it: int) -> bool:
        return self.open_sends.get(it) == 0 and self.open_recvs.get(it) == 0

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

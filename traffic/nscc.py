"""UET's sender-side congestion control (NSCC) and entropy spraying, as pure state machines.

``Nscc`` keeps a congestion window in bytes from two signals per ACK - the CE mark of the
packet that triggered it and the queueing delay its round trip measured against the base
round trip - as UE Spec 1.0's network-signal congestion control (SMaRTT) does
(docs/REFERENCE.md): below the target delay and unmarked, proportional increase; above it and
unmarked, fair increase (about one MTU per round trip); marked and above it, a multiplicative
decrease by how far the average delay exceeds the target, at most once per base round trip;
marked and below it, no cut (the path is the problem: the sprayer moves off it). QuickAdapt:
after a NACK of a trimmed packet, or a delay beyond ``QA_FACTOR`` x the target, the window
drops to what was acknowledged in the last base round trip. The window stays between one MTU
and ``MAX_BDP`` x the bandwidth-delay product.

``Spray`` chooses each packet's entropy value (the UDP source port, which the switches hash
to pick a path) from a set of ``evs``, as REPS does: values whose packets came back
acknowledged without a mark are used again first; otherwise the set is explored in turn,
skipping values penalised by a CE mark or a trim for ``PENALTY_ROUNDS`` rounds. One value
is one path per flow, the comparison.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Deque, Dict, Optional

TARGET_WITH_TRIMMING = 0.75  # target queueing delay, of the base RTT (1 x without trimming)
MAX_BDP = 1.5  # the window's cap, of the bandwidth-delay product
MD_GAIN, MD_FLOOR = 0.8, 0.5  # decrease: x max(1 - MD_GAIN (avg - target) / avg, MD_FLOOR)
QA_FACTOR = 4.0  # QuickAdapt when the delay exceeds this many targets
AVG_GAIN = 0.125  # the average delay's EWMA gain
EV_BASE = 0xC000  # the first entropy value (the UDP source ports of the dynamic range)
PENALTY_ROUNDS = 2  # rounds of the set a penalised value is skipped for


@dataclass(frozen=True)
class NsccParams:
    base_rtt_ns: int  # the unloaded round trip (emulated)
    bdp_bytes: int
    mtu: int
    trimming: bool = True

    @property
    def target_ns(self) -> float:
        return self.base_rtt_ns * (TARGET_WITH_TRIMMING if self.trimming else 1.0)


class Nscc:
    def __init__(self, p: NsccParams):
        self.p = p
        self.max_cwnd = max(p.mtu, int(p.bdp_bytes * MAX_BDP))
        self.cwnd = float(min(p.bdp_bytes, self.max_cwnd))
        self.avg_delay = 0.0
        self.last_decrease = self.last_qa = None
        self.window_start, self.window_bytes, self.last_window_bytes = None, 0, 0
        self.counters = {"decreases": 0, "quick_adapts": 0, "increases": 0}

    def _clamp(self) -> None:
        self.cwnd = min(max(self.cwnd, float(self.p.mtu)), float(self.max_cwnd))

    def _delivered(self, now: int, acked: int) -> None:
        """Bytes acknowledged per base round trip, for QuickAdapt."""
        if self.window_start is None:
            self.window_start = now
        elif now - self.window_start >= self.p.base_rtt_ns:
            self.last_window_bytes, self.window_bytes = self.window_bytes, 0
            self.window_start = now
        self.window_bytes += acked

    def _due(self, last: Optional[int], now: int) -> bool:
        return last is None or now - last >= self.p.base_rtt_ns

    def quick_adapt(self, now: int) -> None:
        if not self._due(self.last_qa, now):
            return
        self.last_qa = now
        self.counters["quick_adapts"] += 1
        self.cwnd = float(max(self.last_window_bytes, self.window_bytes, self.p.mtu))
        self._clamp()

    def on_ack(self, now: int, acked: int, rtt_ns: Optional[int], ecn: bool) -> None:
        """``acked`` payload bytes newly acknowledged; ``rtt_ns`` the round trip of the packet
        that triggered the ACK (None: a retransmission's, ambiguous)."""
        self._delivered(now, acked)
        if rtt_ns is None:
            return
        target = self.p.target_ns
        delay = max(0.0, float(rtt_ns - self.p.base_rtt_ns))
        self.avg_delay += AVG_GAIN * (delay - self.avg_delay)
        if delay > QA_FACTOR * target:
            self.quick_adapt(now)
        elif ecn and delay >= target:
            if self._due(self.last_decrease, now) and self.avg_delay > target:
                self.last_decrease = now
                self.counters["decreases"] += 1
                self.cwnd *= max(1 - MD_GAIN * (self.avg_delay - target) / self.avg_delay,
                                 MD_FLOOR)
        elif not ecn:
            self.counters["increases"] += 1
            if delay < target:  # proportional: up to doubling per round trip when idle
                self.cwnd += acked * (target - delay) / target
            else:  # fair: about one MTU per round trip
                self.cwnd += acked * self.p.mtu / self.cwnd
        self._clamp()

    def on_nack(self, now: int) -> None:
        self.quick_adapt(now)

    def on_timeout(self, now: int) -> None:
        self.cwnd = float(self.p.mtu)
        self._clamp()


class Spray:
    def __init__(self, evs: int = 64, base: int = EV_BASE):
        self.evs, self.base = evs, base
        self.recycled: Deque[int] = deque()
        self.penalty: Dict[int, int] = {}
        self.turn = 0
        self.counters = {"penalties": 0, "recycled": 0, "explored": 0}

    def peek(self) -> int:
        """The entropy value of the next packet (nothing changes until ``used``)."""
        if self.recycled:
            return self.recycled[0]
        for k in range(self.evs):
            ev = self.base + (self.turn + k) % self.evs
            if not self.penalty.get(ev):
                return ev
        return self.base + self.turn  # every value penalised: take the next anyway

    def used(self, ev: int) -> None:
        """A packet went with ``ev``: a recycled value is spent, or the exploration moves past
        it, each penalised value it skipped having served one round."""
        if self.recycled and self.recycled[0] == ev:
            self.recycled.popleft()
            self.counters["recycled"] += 1
            return
        if not 0 <= ev - self.base < self.evs:
            raise ValueError(f"entropy value {ev} is not one of this sprayer's")
        while True:  # up to and with ev (taken although penalised when all of them were)
            passed = self.base + self.turn
            if self.penalty.get(passed):
                self.penalty[passed] -= 1
            self.turn = (self.turn + 1) % self.evs
            if passed == ev:
                break
        self.counters["explored"] += 1

    def feedback(self, ev: int, good: bool) -> None:
        """An ACK for a packet sent with ``ev``: unmarked, the value is used again first."""
        if self.evs == 1:
            return
        if good:
            if len(self.recycled) < self.evs:
                self.recycled.append(ev)
        else:
            self.penalise(ev)

    def penalise(self, ev: int) -> None:
        if self.evs == 1:
            return
        self.counters["penalties"] += 1
        self.penalty[ev] = PENALTY_ROUNDS
        while ev in self.recycled:
            self.recycled.remove(ev)

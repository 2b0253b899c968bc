"""The RNIC's delay line: each arriving frame waits until the modelled path has delivered it
(pure).

The emulated fabric hands the receiver a frame when the last switch port starts sending it,
without the modelled fabric's fixed delay (``testbed.base.hops``): switch pipelines, cables,
store-and-forward serializations, and the frame's own transmission. Where no qdisc applies it
(``emulation.path_delay: nic``; under netem, the part netem cannot), the receiving RNIC holds
every frame - data, ACK, NAK, CNP - for its peer's fixed delay plus its own transmission at the
NIC's rate after its kernel receive time, and its transport acts on it only then, with that
time as the frame's arrival. Frames from one peer leave in the order they came (never before
the frame ahead of them); frames from different peers interleave by their release times.
"""
from __future__ import annotations

import heapq
from typing import Any, Dict, List, Optional, Tuple

from testbed.base.frames import udp_frame_bytes

RX_NS, ADDR, SIZE = 1, 4, 13  # fields of ``traffic.nicio``'s datagram tuple


class DelayLine:
    """Datagrams (``traffic.nicio.Receiver.read``'s tuples) held until their release time.

    ``delay_ns``: peer address (an integer, as the tuple carries it) -> that path's fixed
    delay; a sender that is no peer (another job's traffic) gets none. ``owner`` is told by
    the loop when a release is due; ``armed`` is the release time the loop was given."""

    __slots__ = ("delay_ns", "ns_per_byte", "owner", "armed", "_heap", "_last", "_seq")

    def __init__(self, delay_ns: Dict[int, int], rate_bps: float, owner: Any = None):
        self.delay_ns = delay_ns
        self.ns_per_byte = 8e9 / rate_bps
        self.owner = owner
        self.armed: Optional[int] = None
        self._heap: List[Tuple[int, int, tuple]] = []
        self._last: Dict[int, int] = {}  # per peer: the latest release so far
        self._seq = 0

    def release_ns(self, rx_ns: int, addr: int, size: int) -> int:
        """When a datagram of ``size`` bytes from ``addr`` received at ``rx_ns`` leaves."""
        return (rx_ns + self.delay_ns.get(addr, 0)
                + int(udp_frame_bytes(size) * self.ns_per_byte))

    def hold(self, datagrams: List[tuple], now_ns: int) -> int:
        """Take datagrams in arrival order; one without a kernel time arrived ``now_ns``.
        Returns how many had none."""
        heap, last = self._heap, self._last
        unstamped = 0
        for d in datagrams:
            addr, rx = d[ADDR], d[RX_NS]
            if not rx:
                rx, unstamped = now_ns, unstamped + 1
            at = self.release_ns(rx, addr, d[SIZE])
            before = last.get(addr, 0)
            if at < before:  # never ahead of the frame before it from the same peer
                at = before
            last[addr] = at
            self._seq += 1
            heapq.heappush(heap, (at, self._seq, d))
        return unstamped

    def next_ns(self) -> Optional[int]:
        """The earliest release time (None: nothing held)."""
        return self._heap[0][0] if self._heap else None

    def due(self, now_ns: int) -> List[tuple]:
        """Every datagram whose release time has come, in release order, with that time in
        place of its kernel receive time."""
        heap, out = self._heap, []
        while heap and heap[0][0] <= now_ns:
            at, _seq, d = heapq.heappop(heap)
            out.append((d[0], at) + d[2:])
        return out

    def __len__(self) -> int:
        return len(self._heap)

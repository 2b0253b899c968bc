"""What the switch-queue emulator records beside its decisions (``testbed.switchq.emulator``): the
queue timeline for the plots, the largest backlog of every queue, and what sampling cost and
how late it came - the report's figures, kept apart from what the samples decide."""
from __future__ import annotations

import csv
from typing import Dict, Iterable, List, Tuple

from ..base.atomic import atomic_file


class Timeline:
    """Per window, the largest backlog of every port's watched class and the queues paused at
    some point in it (for plots of queue occupancy and PFC)."""

    def __init__(self, ports: List[str], window_ns: int):
        self.ports, self.window_ns = ports, window_ns
        self.start = 0
        self.top: List[int] = []
        self.paused: set = set()
        self.windows: List[Tuple[int, List[int], str]] = []

    def add(self, backlog: List[int], paused: Iterable[str], now: int) -> None:
        """One sample's backlogs (in port order) and the interfaces paused at ``now``."""
        if not self.start:
            self.start = now
        # a window's first sample starts its maxima
        self.top = list(map(max, self.top, backlog)) if self.top else list(backlog)
        self.paused.update(paused)
        if now - self.start >= self.window_ns:
            self._close()
            self.start = now

    def _close(self) -> None:
        self.windows.append((self.start, self.top or [0] * len(self.ports),
                             " ".join(sorted(self.paused))))
        self.top, self.paused = [], set()

    def write(self, path: str) -> None:
        """CSV: window start (ns since the epoch), the largest backlog of each switch port's
        watched class in the window (bytes), and the queues paused in it."""
        if self.start:
            self._close()
        with atomic_file(path, "w", sync=False, newline="") as f:
            w = csv.writer(f)
            w.writerow(["time_ns"] + self.ports + ["paused"])
            for t, values, paused in self.windows:
                w.writerow([t] + values + [paused])


class SampleCost:
    """How long each sample took and how far apart samples started (the reaction time)."""

    def __init__(self):
        self.took_ns: List[int] = []
        self.gap_ns: List[int] = []

    def report(self, tick_ns: int) -> dict:
        ns, gaps = sorted(self.took_ns) or [0], sorted(self.gap_ns) or [0]
        return {"mean": round(sum(ns) / len(ns) / 1e6, 4),
                "p99": round(p99(ns) / 1e6, 4),
                "max": round(ns[-1] / 1e6, 4),
                "max_gap": round(gaps[-1] / 1e6, 4),
                "gap_p99": round(p99(gaps) / 1e6, 4),
                # a sample more than three intervals after the one before
                "gaps_over_3_intervals": sum(g > 3 * tick_ns for g in gaps)}


def peaks(max_backlog: Dict[Tuple[str, int], int], class_names: Dict[int, str]
          ) -> Dict[str, Dict[str, int]]:
    """The largest backlog per (interface, qdisc handle) as {interface: {class: bytes}}."""
    out: Dict[str, Dict[str, int]] = {}
    for (intf, handle), b in sorted(max_backlog.items()):
        out.setdefault(intf, {})[class_names.get(handle, hex(handle))] = b
    return out


def p99(ordered: List[int]) -> int:
    return ordered[int(len(ordered) * 0.99) - 1 if len(ordered) > 1 else 0]


def spread(values: List[int]) -> dict:
    """How far the kernel counters were off at the full samples (bytes)."""
    v = sorted(values) or [0]
    return {"min": v[0], "p1": v[len(v) // 100], "p50": v[len(v) // 2],
            "p99": v[min(len(v) - 1, len(v) * 99 // 100)], "max": v[-1], "checks": len(values)}

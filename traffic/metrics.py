"""Metrics from per-packet and per-step records (pure; definitions as in DESIGN.md).

* one-way packet latency: kernel RX time minus the send time carried in the packet;
* collective completion time (CCT) of an iteration: last rank done minus first rank start;
* algbw = bytes / CCT and busbw = algbw x 2 (n - 1) / n for all-reduce (nccl-tests).
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Sequence

import numpy as np


def percentiles(values_us: Sequence[float]) -> Optional[Dict[str, float]]:
    """p50, p99, p99.9, max and mean of a sample (None when it is empty)."""
    a = np.asarray(values_us, dtype=float)
    if a.size == 0:
        return None
    p50, p99, p999 = np.percentile(a, [50, 99, 99.9])
    return {"p50": _r(p50), "p99": _r(p99), "p999": _r(p999), "max": _r(a.max()),
            "mean": _r(a.mean()), "count": int(a.size)}


def latency_us(tx_ns: Sequence[int], rx_ns: Sequence[int]) -> np.ndarray:
    return (np.asarray(rx_ns, dtype=np.int64) - np.asarray(tx_ns, dtype=np.int64)) / 1000.0


def concat(arrays) -> np.ndarray:
    arrays = [np.asarray(a, dtype=float) for a in arrays]
    return np.concatenate(arrays) if arrays else np.zeros(0)


def iteration_cct_us(steps: Iterable[dict]) -> List[float]:
    """CCT of each iteration from step records (``iteration``, ``start_ns``, ``end_ns``).

    CCT = latest end of any rank's last step - earliest start of any rank's first step.
    """
    first: Dict[int, int] = {}
    last: Dict[int, int] = {}
    for s in steps:
        it = int(s["iteration"])
        start, end = int(s["start_ns"]), int(s["end_ns"])
        first[it] = min(first.get(it, start), start)
        last[it] = max(last.get(it, end), end)
    return [(last[i] - first[i]) / 1000.0 for i in sorted(first)]


def cct_summary(cct_us: Sequence[float]) -> Optional[Dict[str, float]]:
    a = np.asarray(cct_us, dtype=float)
    if a.size == 0:
        return None
    p50, p99 = np.percentile(a, [50, 99])
    return {"p50": _r(p50), "p99": _r(p99), "max": _r(a.max()), "mean": _r(a.mean()),
            "per_iteration": [_r(v) for v in a]}


def algbw_gbps(size_bytes: int, cct_us: float) -> float:
    """nccl-tests algorithm bandwidth: buffer size over completion time, in Gbit/s."""
    return size_bytes * 8 / (cct_us * 1000.0)


def _r(x) -> float:
    return round(float(x), 3)
